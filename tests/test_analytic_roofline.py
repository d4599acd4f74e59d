import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvjax import analytic, get_chip, get_model_config, kernels
from kvjax.analytic import KernelCost, Workload, roofline

positive = st.floats(min_value=1e-3, max_value=1e18, allow_nan=False, allow_infinity=False)


def test_ridge_and_sides_by_hand():
    peak, bw = 100e12, 1e12  # ridge 100 FLOP/byte
    assert roofline.ridge(peak, bw) == 100
    assert roofline.attainable_flops_per_s(10, peak, bw) == 10e12
    assert roofline.attainable_flops_per_s(1000, peak, bw) == peak
    assert roofline.point("k", 10, 1, peak, bw).attainable_flops_per_s / peak == pytest.approx(0.1)
    assert roofline.bound_time_s(1e12, 1e9, peak, bw) == pytest.approx(0.01)  # FLOPs: 10 ms
    assert roofline.bound_time_s(1e9, 1e12, peak, bw) == pytest.approx(1.0)  # bytes: 1 s
    assert roofline.bound_side(1e12, 1e9, peak, bw) == "compute"
    assert roofline.bound_side(1e9, 1e12, peak, bw) == "memory"


@given(positive, positive, positive, positive)
def test_bound_is_the_slower_roof_and_agrees_with_the_ridge(flops, bytes_, peak, bw):
    t = roofline.bound_time_s(flops, bytes_, peak, bw)
    assert t >= flops / peak and t >= bytes_ / bw
    side = roofline.bound_side(flops, bytes_, peak, bw)
    assert side == (
        "compute" if flops / bytes_ >= roofline.ridge(peak, bw) * (1 - 1e-12) else "memory"
    ) or (abs(flops / bytes_ / roofline.ridge(peak, bw) - 1) < 1e-9)
    # Achieved FLOP/s at the bound never exceeds what the roofline allows.
    assert flops / t <= roofline.attainable_flops_per_s(flops / bytes_, peak, bw) * (1 + 1e-9)


def test_place_decode_kernels_on_h100():
    cfg, chip = get_model_config("seed-70b"), get_chip("h100-sxm")
    closed = analytic.step_kernels(cfg, Workload("decode", 1, 8192)).values()
    points = roofline.place(closed, chip.peak("bf16"), chip.bandwidth_bytes_per_s)
    assert all(p.bound == "memory" for p in points)  # decode at B=1: everything below the ridge
    prefill = roofline.place(
        analytic.step_kernels(cfg, Workload("prefill", 1, 4096)).values(),
        chip.peak("bf16"),
        chip.bandwidth_bytes_per_s,
    )
    sides = {p.name: p.bound for p in prefill}
    assert sides[kernels.GATE_UP] == "compute" and sides[kernels.SOFTMAX] == "memory"


def test_zero_byte_kernel_has_infinite_intensity():
    assert KernelCost("x", 1.0, 0.0).intensity == float("inf")
