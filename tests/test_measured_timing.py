import time

import jax
import jax.numpy as jnp
import pytest

from kvjax.measured.ceilings import measure_read_bandwidth
from kvjax.measured.timing import device_name, summarize, time_fn, time_loop


def test_summarize_by_hand():
    s = summarize([4.0, 1.0, 3.0, 2.0, 5.0], device="cpu:test")
    assert (s.median_s, s.min_s, s.runs) == (3.0, 1.0, 5)
    assert (s.q25_s, s.q75_s, s.iqr_s) == (2.0, 4.0, 2.0)
    with pytest.raises(ValueError):
        summarize([])


def test_time_fn_excludes_compilation_and_sees_a_slow_kernel():
    x = jax.random.normal(jax.random.key(0), (256, 256))
    fast = jax.jit(lambda a: a + 1)

    def slow(a):  # a deliberately slow kernel: a host sleep around the same work
        time.sleep(0.02)
        return fast(a)

    t_fast = time_fn(fast, [(x,)], min_runs=5, budget_s=0.1)
    t_slow = time_fn(slow, [(x,)], min_runs=5, budget_s=0.1)
    assert t_fast.runs >= 5 and t_fast.median_s < 0.02  # compile time (tens of ms) excluded
    assert t_slow.median_s >= 0.02 > t_fast.median_s
    assert t_fast.device == device_name() and t_fast.device.startswith("cpu")


def test_time_loop_threads_a_donated_carry():
    step = jax.jit(lambda c: c + 1, donate_argnums=0)
    stats, carry = time_loop(step, jnp.zeros(4), warmup=2, min_runs=3, max_runs=3)
    assert stats.runs == 3 and float(carry[0]) == 5.0


def test_read_bandwidth_is_positive():
    bandwidth, stats = measure_read_bandwidth(nbytes=8 * 2**20, budget_s=0.2, trials=2)
    assert bandwidth > 1e8 and stats.median_s > 0
