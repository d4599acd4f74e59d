"""JAX's multi-process runtime, as JAX runs on clusters: one process per host (or several on one
host), joined by `jax.distributed.initialize()`, one global mesh over every process's devices.

A process is one of several when the environment says so: SLURM's variables (`srun`: JAX reads
them itself), or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID set by hand or by
`kvjax run --processes N` (`launch`: N local processes on this host, each with its own simulated
CPU devices, the coordinator on 127.0.0.1 and a free port). On CPU the cross-process collectives
are gloo's (`jax_cpu_collectives_implementation`), set before `initialize`.

Measured here (jax 0.10.2, XLA:CPU, 2 processes x 4 devices): a global 8-device mesh, a psum and
a sharded jit across the processes, `multihost_utils` (allgather, broadcast, barrier) and orbax's
StandardCheckpointer on globally sharded arrays all work.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from kvjax.devices import request_host_devices
from kvjax.errors import KvjaxError

NUM, PID, COORD = "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS"
DEVICES_PER_PROCESS = 4  # simulated CPU devices of each local process (`launch`)
_SLURM = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_STEP_NODELIST")


def _int_var(env, name: str, low: int, high: int | None = None) -> int:
    raw = env.get(name, "")
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value >= high):
        allowed = f"an integer >= {low}" + (f" and < {high}" if high is not None else "")
        raise KvjaxError(f"{name}={raw!r} must be {allowed}")
    return value


def requested(env=None) -> dict | None:
    """The multi-process setting the environment asks for: {"num_processes", "process_id",
    "coordinator_address", "source"}, or None for a single process."""
    env = os.environ if env is None else env
    if NUM in env or PID in env:
        num = _int_var(env, NUM, 1)
        pid = _int_var(env, PID, 0, num)
        if num == 1:
            return None
        if not env.get(COORD):
            raise KvjaxError(f"{NUM}={num}: {COORD} must be set too (host:port of process 0)")
        return {
            "num_processes": num,
            "process_id": pid,
            "coordinator_address": env[COORD],
            "source": "JAX_*",
        }
    if all(v in env for v in _SLURM) and _int_var(env, "SLURM_NTASKS", 1) > 1:
        num = _int_var(env, "SLURM_NTASKS", 1)
        return {
            "num_processes": num,
            "process_id": _int_var(env, "SLURM_PROCID", 0, num),
            "coordinator_address": None,
            "source": "SLURM",
        }
    return None


def initialize(env=None) -> bool:
    """Join the processes the environment names (once); False when it names none."""
    want = requested(env)
    if want is None:
        return False  # jax not even imported: a single process starts it as before
    import jax

    if jax.distributed.is_initialized():
        return True
    # the CPU client's cross-process collectives (only the CPU client reads it): before the
    # backend starts, as initialize itself must be
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        if want["source"] == "SLURM":
            jax.distributed.initialize()  # JAX reads SLURM's variables itself
        else:
            jax.distributed.initialize(
                want["coordinator_address"], want["num_processes"], want["process_id"]
            )
    except (RuntimeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise KvjaxError(f"jax.distributed.initialize ({want['source']}) failed: {first}") from None
    return True


# ---- who am I -------------------------------------------------------------------------------
def process_index() -> int:
    import jax

    return jax.process_index() if "jax" in sys.modules else 0


def process_count() -> int:
    import jax

    return jax.process_count() if "jax" in sys.modules else 1


def is_multiprocess() -> bool:
    return "jax" in sys.modules and process_count() > 1


def host_names() -> list[str]:
    """Every process's host name, in process order (an allgather across processes)."""
    if not is_multiprocess():
        return [socket.gethostname()]
    import numpy as np
    from jax.experimental import multihost_utils

    raw = socket.gethostname().encode()[:64].ljust(64, b"\0")
    rows = multihost_utils.process_allgather(np.frombuffer(raw, np.uint8))
    return [bytes(np.asarray(r, np.uint8)).rstrip(b"\0").decode() for r in rows]


def barrier(name: str) -> None:
    if is_multiprocess():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def broadcast_flag(value: int) -> int:
    """Process 0's integer, on every process."""
    if not is_multiprocess():
        return value
    import numpy as np
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


# ---- N local processes ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(n: int, index: int, port: int, devices: int = DEVICES_PER_PROCESS, env=None):
    """The environment of local process `index` of `n`: its own simulated CPU devices."""
    env = dict(os.environ if env is None else env)
    for name in _SLURM:  # the local processes are joined by the JAX_* variables only
        env.pop(name, None)
    env.update({NUM: str(n), PID: str(index), COORD: f"127.0.0.1:{port}", "JAX_PLATFORMS": "cpu"})
    env["XLA_FLAGS"] = " ".join(
        f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f
    )
    request_host_devices(devices, env)
    return env


def check_processes(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KvjaxError(f"--processes={n!r} must be a positive integer")
    if requested() is not None:
        raise KvjaxError(
            f"--processes={n}: this process is already one of several ({NUM} or SLURM); "
            "--processes starts local processes from a single one"
        )
    return n


def launch(
    argv: list[str], n: int, devices: int = DEVICES_PER_PROCESS, timeout_s=None, program=None
) -> int:
    """Run `python -m kvjax ARGV` (or `python PROGRAM ARGV`) as `n` local processes joined by a
    coordinator on 127.0.0.1; their output passes through. If one fails (or `timeout_s` passes)
    the others are stopped (they would wait for it at the next collective). Returns the first
    non-zero exit status (124: timed out), else 0."""
    check_processes(n)
    port = free_port()
    head = [sys.executable, *(program or ["-m", "kvjax"])]
    procs = [
        subprocess.Popen([*head, *argv], env=process_env(n, i, port, devices)) for i in range(n)
    ]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    status = 0
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        late = deadline is not None and time.monotonic() > deadline
        if failed or late:
            status = failed[0] if failed else 124
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
            break
        time.sleep(0.1)
    return status or next((p.returncode for p in procs if p.returncode), 0)
