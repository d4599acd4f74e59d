"""The 2025 chips from their vendors' printed figures: the Blackwell Ultra datasheet's per-GPU
rates (sparse | dense), the GB300 NVL72 rack's totals over its 72 GPUs, AMD's MI355X rates from
its CUs and clock; a placement on a chip without a sourced link is refused by name."""

import pytest

from kvjax.errors import KvjaxError
from kvjax.hardware import get_chip
from kvjax.hardware.chips import BLACKWELL_SFU_PER_BF16_FLOP
from kvjax.predict.gemm import compute_family

P = 1e15


def test_blackwell_ultra_per_gpu_is_the_datasheets_dense_rates():
    b300, gb300 = get_chip("b300"), get_chip("gb300")
    # HGX B300 column: FP16/BF16 4.5 and FP8 9 PFLOPS sparse, FP4 18 | 14 (sparse | dense)
    assert (b300.peak("bf16"), b300.peak("fp8"), b300.peak("fp4")) == (
        4.5 * P / 2,
        9 * P / 2,
        14 * P,
    )
    # GB300 NVL72 rack: 360 / 720 PFLOPS sparse and 1,080 dense FP4, 576 TB/s, over 72 GPUs
    assert gb300.peak("bf16") * 72 * 2 == pytest.approx(360 * P)
    assert gb300.peak("fp8") * 72 * 2 == pytest.approx(720 * P)
    assert gb300.peak("fp4") * 72 == pytest.approx(1080 * P)
    assert gb300.bandwidth_bytes_per_s * 72 == pytest.approx(576e12)
    for chip in (b300, gb300):  # INT8 cut and unlabelled: not a rate kvjax claims
        assert "int8" not in chip.peak_flops_per_s
        # the doubled exponential units: twice Blackwell's exponentials a BF16 FLOP
        rate = chip.special_function_ops_per_s / chip.peak("bf16")
        assert rate == pytest.approx(2 * BLACKWELL_SFU_PER_BF16_FLOP)
    assert b300.memory_bytes < gb300.memory_bytes < 288e9  # 270 and 279 GB as deployed
    # the B300 is the B200's compute design (the same dense BF16 rate over 148 SMs), the GB300
    # its own (152 SMs at a higher clock)
    assert compute_family(b300) == compute_family(get_chip("b200")) == "b200/b300"
    assert compute_family(gb300) == "gb300"


def test_mi355x_rates_are_its_cus_at_its_clock():
    mi355x = get_chip("mi355x")
    bf16 = 256 * 2.4e9 * 4096  # 256 CUs, 2.4 GHz, 4,096 dense BF16 FLOPs a CU a clock
    assert mi355x.peak("bf16") == pytest.approx(bf16, rel=1e-4)
    assert mi355x.peak("fp8") == pytest.approx(2 * bf16, rel=1e-4)
    assert mi355x.peak("fp4") == pytest.approx(4 * bf16, rel=1e-4)
    assert (mi355x.num_cores, mi355x.onchip_bytes_per_core) == (256, 160 * 1024)


def test_a_placement_needs_a_sourced_link():
    from kvjax.model.config import get_model_config
    from kvjax.serving.step_time import ClosedFormStepTime, PlacedStepTime

    cfg, chip = get_model_config("llama-3.1-8b"), get_chip("mi355x")
    with pytest.raises(KvjaxError, match="mi355x"):
        PlacedStepTime(ClosedFormStepTime(cfg, chip), cfg, chip, tp=2)
