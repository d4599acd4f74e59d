"""Eight simulated CPU devices for the sharded-model tests (tests/test_nn_sharding.py).

Set before jax is first imported (conftest is imported before the test modules). Single-device
code is unaffected: jit runs on the first device unless arrays say otherwise.
"""

from kvjax.devices import request_host_devices

request_host_devices(8)
