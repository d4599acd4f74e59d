"""Eight simulated CPU devices for the sharded-model tests (tests/test_sharding.py).

Set before jax is first imported (conftest is imported before the test modules). Single-device
code is unaffected: jit runs on the first device unless arrays say otherwise.
"""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=8".strip()
