"""kvjax: why transformer decoding is slow, in three views that must agree.

Every kernel of a decoder step (named once in `kvjax.kernels`) has a closed form
(`kvjax.analytic`), a trace (`kvjax.traced`: XLA's cost analysis of the Flax model in
`kvjax.nn`) and a measurement (`kvjax.measured`), tied by the roofline
(`kvjax.analytic.roofline`).
"""

from kvjax.devices import default_platforms

default_platforms()  # before jax starts: a host with no accelerator runs jax on its CPU

from kvjax.errors import KvjaxError  # noqa: E402
from kvjax.hardware import ChipSpec, get_chip  # noqa: E402
from kvjax.model import presets  # noqa: E402, F401 (registers the presets in kvjax.model.config.PRESETS)
from kvjax.model.config import ModelConfig, get_model_config  # noqa: E402

__all__ = ["ChipSpec", "KvjaxError", "ModelConfig", "get_chip", "get_model_config"]
__version__ = "0.1.0"
