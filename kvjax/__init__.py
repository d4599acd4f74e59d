"""kvjax: why transformer decoding is slow, in three views that must agree.

closed form (`kvjax.analytic`), traced (`kvjax.cost`, XLA cost analysis of the Flax model) and
measured (`kvjax.timing`), tied by the roofline (`kvjax.roofline`).
"""

from kvjax.config import ModelConfig, get_model_config
from kvjax.errors import KvjaxError
from kvjax.hardware import ChipSpec, get_chip

__all__ = ["ChipSpec", "KvjaxError", "ModelConfig", "get_chip", "get_model_config"]
__version__ = "0.1.0"
