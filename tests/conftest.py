"""Eight simulated CPU devices for the sharded-model tests (tests/test_nn_sharding.py).

Set before jax is first imported (conftest is imported before the test modules). Single-device
code is unaffected: jit runs on the first device unless arrays say otherwise. Hypothesis runs
without a deadline (below).

The tests also compile the CPU's code without LLVM's optimisations (XLA_FLAGS
--xla_backend_optimization_level=0, inherited by the child processes they start): most of the
suite's time is XLA:CPU compiling tiny models, a quarter faster so, while what the tests check
(HLO cost analysis, logits and tokens within their tolerances, speed-free properties of
measurements) does not depend on how the machine code was optimised. A test that runs a whole
benchmark starts it with the optimised flags (`support.optimised_env`).
"""

import os

from support import UNOPTIMISED, require

from kvjax.devices import request_host_devices

request_host_devices(8)
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {UNOPTIMISED}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# No per-example deadline: hypothesis's default (200 ms) fails an example that a busy machine
# runs slowly; what the tests check does not depend on the machine's speed.
settings.register_profile("kvjax", deadline=None)
settings.load_profile("kvjax")


@pytest.fixture(scope="module")
def devices():
    """The 8 simulated CPU devices of the sharded-model tests (a failure in CI, not a skip)."""
    require(
        len(jax.devices()) >= 8,
        "needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/conftest.py)",
    )
    return jax.devices()
