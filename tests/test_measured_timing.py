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


class FakeClock:
    """`time.perf_counter` for kvjax.measured.timing that moves only when a timed call says so:
    a timing's numbers by hand, at any speed of the machine."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_time_fn_excludes_compilation_by_hand(monkeypatch):
    """The first call of each input set (the compile: 1 s on the fake clock) is a warm-up, never
    a timing; then runs go on until min_runs and the budget are both met."""
    import types

    import kvjax.measured.timing as timing

    clock = FakeClock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    durations = iter([1.0, 1.0] + [0.01, 0.03, 0.02, 0.05, 0.04, 0.02, 0.03])

    def fn(x):
        clock.now += next(durations)
        return x

    stats = time_fn(fn, [(1,), (2,)], min_runs=5, budget_s=0.14)
    # 5 runs take 0.15 s (0.01 + 0.03 + 0.02 + 0.05 + 0.04): both met, no sixth
    assert stats.runs == 5 and 1.0 not in (stats.min_s, stats.median_s)
    assert (stats.min_s, stats.median_s) == pytest.approx((0.01, 0.03))


def test_time_fn_sees_a_slow_kernel():
    """A host sleep of 20 ms inside the timed call: its median is at least that on any machine."""
    x = jax.random.normal(jax.random.key(0), (256, 256))
    fast = jax.jit(lambda a: a + 1)

    def slow(a):
        time.sleep(0.02)
        return fast(a)

    t_slow = time_fn(slow, [(x,)], min_runs=5, budget_s=0.1)
    assert t_slow.runs >= 5 and t_slow.median_s >= 0.02
    assert t_slow.device == device_name() and t_slow.device.startswith("cpu")


def test_time_loop_threads_a_donated_carry():
    step = jax.jit(lambda c: c + 1, donate_argnums=0)
    stats, carry = time_loop(step, jnp.zeros(4), warmup=2, min_runs=3, max_runs=3)
    assert stats.runs == 3 and float(carry[0]) == 5.0


def test_read_bandwidth_is_positive():
    bandwidth, stats = measure_read_bandwidth(nbytes=8 * 2**20, budget_s=0.2, trials=2)
    assert stats.median_s > 0 and bandwidth > 0  # how fast depends on the machine


def test_random_inputs_are_unit_variance_in_their_dtype_and_fixed_by_the_seed():
    import jax.numpy as jnp
    import numpy as np

    from kvjax.measured.timing import random_array, random_inputs

    a, b = random_inputs(7, 2)
    x = random_array(a, (256, 64), jnp.bfloat16)
    assert x.shape == (256, 64) and x.dtype == jnp.bfloat16
    v = np.asarray(x, np.float32)
    assert abs(v.mean()) < 0.02 and abs(v.var() - 1) < 0.02  # 16,384 draws: sd 0.008, 0.007
    assert 1.7 < np.abs(v).max() <= 1.7344  # sqrt(3) = 1.732..., rounded to bf16
    again = random_array(random_inputs(7, 2)[0], (256, 64), jnp.bfloat16)
    np.testing.assert_array_equal(v, np.asarray(again, np.float32))
    other = random_array(b, (256, 64), jnp.bfloat16)
    assert not np.array_equal(v, np.asarray(other, np.float32))
    assert random_array(3, (5,)).dtype == jnp.float32


def test_a_large_random_input_is_cast_on_the_device_to_the_same_values():
    import jax.numpy as jnp
    import numpy as np

    from kvjax.measured.timing import random_array

    big = random_array(5, (2**22,), jnp.bfloat16)  # cast by XLA; a smaller one by ml_dtypes
    assert big.dtype == jnp.bfloat16
    head = np.random.default_rng(5).random(2**22, dtype=np.float32)[:1000]
    want = ((head - np.float32(0.5)) * np.float32(2 * np.sqrt(3.0))).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(big[:1000]), want)
