"""Simulated CPU devices for sharded programs: XLA_FLAGS=--xla_force_host_platform_device_count.

Read once, when jax starts, so it is set before the first `import jax` (or in a child process's
environment). No jax import here.
"""

from __future__ import annotations

import os
import sys

FLAG = "--xla_force_host_platform_device_count"


def with_host_devices(xla_flags: str, n: int) -> str:
    """`xla_flags` asking for `n` CPU devices, unless it already names a count."""
    return xla_flags if FLAG in xla_flags else f"{xla_flags} {FLAG}={n}".strip()


def request_host_devices(n: int, env=None) -> None:
    """Ask XLA:CPU for `n` devices in `env` (default: this process, only before jax starts;
    otherwise `kvjax.nn.sharding.make_mesh` says how many it sees and what to set)."""
    if env is None:
        if "jax" in sys.modules:
            return
        env = os.environ
    if n > 1:
        env["XLA_FLAGS"] = with_host_devices(env.get("XLA_FLAGS", ""), n)
