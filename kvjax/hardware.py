"""Chips: peak FLOP/s per dtype (dense), memory bandwidth and capacity, with their source.

Rates are decimal (1 TB/s = 1e12 B/s) as the vendors state them; capacities are the vendors'
decimal GB. Nothing here is measured: measured ceilings become a `ChipSpec` too (timing issue).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from kvjax.dtypes import canonical_dtype
from kvjax.errors import KvjaxError, unknown_name_error

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class ChipSpec:
    """One accelerator (or a CPU, when measured). `peak_flops_per_s` is keyed by dtype name."""

    name: str
    peak_flops_per_s: dict[str, float]
    bandwidth_bytes_per_s: float
    memory_bytes: float | None = None
    source: str = ""
    date: str = ""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Chip-to-chip bandwidth per direction (decimal bytes/s), for tensor-parallel collectives.
    interconnect_bytes_per_s: float | None = None
    # On-chip memory a fused kernel tiles into, per core (a GPU's shared memory per SM, a TPU's
    # VMEM per TensorCore), and the cores: `kvjax.analytic.flash` sizes its blocks and splits.
    onchip_bytes_per_core: float | None = None
    num_cores: int | None = None
    # The last-level cache between the cores and HBM (a GPU's L2), in bytes: what fused
    # attention's K/V re-reads are served from (`kvjax.analytic.flash.hbm_kv_positions`).
    l2_bytes: float | None = None
    # The board's rated power (the datasheet's maximum thermal design power, W): what the
    # serving clocks charge a chip per second held (`kvjax.serving.cost`); None: not published.
    power_watts: float | None = None
    special_function_ops_per_s: float | None = None  # exp2/s: the model's softmax, not the bound

    def __post_init__(self) -> None:
        if not self.peak_flops_per_s:
            raise KvjaxError(f"chip {self.name!r}: peak_flops_per_s needs at least one dtype")
        canonical = {}
        for dtype, value in self.peak_flops_per_s.items():
            _check_positive(f"chip {self.name!r}: peak_flops_per_s[{dtype!r}]", value)
            canonical[canonical_dtype(dtype, "peak_flops_per_s dtype", compute=True)] = float(value)
        object.__setattr__(self, "peak_flops_per_s", canonical)
        _check_positive(f"chip {self.name!r}: bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        if self.memory_bytes is not None:
            _check_positive(f"chip {self.name!r}: memory_bytes", self.memory_bytes)
        if self.l2_bytes is not None:
            _check_positive(f"chip {self.name!r}: l2_bytes", self.l2_bytes)
        if self.power_watts is not None:
            _check_positive(f"chip {self.name!r}: power_watts", self.power_watts)
        if (sfu := self.special_function_ops_per_s) is not None:
            _check_positive(f"chip {self.name!r}: special_function_ops_per_s", sfu)
        if self.interconnect_bytes_per_s is not None:
            _check_positive(
                f"chip {self.name!r}: interconnect_bytes_per_s", self.interconnect_bytes_per_s
            )

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for matrix work in `dtype`."""
        key = canonical_dtype(dtype, compute=True)
        if key not in self.peak_flops_per_s:
            raise KvjaxError(
                f"chip {self.name!r} has no peak FLOP/s for dtype={dtype!r}; "
                f"known: {', '.join(self.peak_flops_per_s)}"
            )
        return self.peak_flops_per_s[key]

    def ridge(self, dtype: str) -> float:
        """I* = peak / bandwidth, in FLOPs per byte."""
        return self.peak(dtype) / self.bandwidth_bytes_per_s

    def with_overrides(
        self,
        peak_flops_per_s: float | None = None,
        bandwidth_bytes_per_s: float | None = None,
        memory_bytes: float | None = None,
        dtype: str = "bf16",
    ) -> ChipSpec:
        """Replace numbers (as the CLI's --peak-flops / --bandwidth do); the name records it."""
        peaks = dict(self.peak_flops_per_s)
        changed = []
        if peak_flops_per_s is not None:
            peaks[canonical_dtype(dtype, compute=True)] = peak_flops_per_s
            changed.append("peak")
        spec = dataclasses.replace(
            self,
            peak_flops_per_s=peaks,
            bandwidth_bytes_per_s=bandwidth_bytes_per_s or self.bandwidth_bytes_per_s,
            memory_bytes=memory_bytes if memory_bytes is not None else self.memory_bytes,
        )
        if bandwidth_bytes_per_s is not None:
            changed.append("bandwidth")
        if memory_bytes is not None:
            changed.append("memory")
        if changed:
            spec = dataclasses.replace(spec, name=f"{self.name} ({', '.join(changed)} overridden)")
        return spec

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_positive(what: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise KvjaxError(f"{what}={value!r} must be a positive number")


def chip_from_numbers(
    peak_flops_per_s: float,
    bandwidth_bytes_per_s: float,
    memory_bytes: float | None = None,
    dtype: str = "bf16",
    name: str = "custom",
) -> ChipSpec:
    """A chip given by numbers alone."""
    return ChipSpec(
        name=name,
        peak_flops_per_s={dtype: peak_flops_per_s},
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        memory_bytes=memory_bytes,
        source="given on the command line",
    )


CHIPS: dict[str, ChipSpec] = {}


def _chip(spec: ChipSpec) -> ChipSpec:
    CHIPS[spec.name] = spec
    return spec


# exp2 units: FlashAttention-3 sec. 3.1, 3.9 TFLOP/s on H100 SXM5 (H800, H200: same GH100); A100:
HOPPER_SFU, A100_SFU = 3.9 * TERA, 108 * 16 * 1.41e9  # CUDA guide 16/clk/SM x 108 x 1.41 GHz
# B200, GB200: FlashAttention-4 (arXiv 2603.05451): an SM's exp unit does 16 a clock, its tensor
BLACKWELL_SFU_PER_BF16_FLOP = 16 / 8192  # cores 8,192 dense BF16 FLOPs: the rate is peak / 512
# Datasheets state sparse tensor-core rates ("with sparsity"); these are the dense halves.
_chip(
    ChipSpec(
        name="h100-sxm",
        peak_flops_per_s={
            "bf16": 989 * TERA,  # the seed's number; datasheet 1979 sparse / 2
            "f16": 989 * TERA,
            "fp8": 1979 * TERA,
            "int8": 1979 * TERA,
            "f32": 67 * TERA,  # non-tensor FP32; TF32 tensor is 494.7
        },
        bandwidth_bytes_per_s=3.35 * TERA,
        memory_bytes=80 * GIGA,
        power_watts=700,  # datasheet: max TDP up to 700 W (configurable)
        interconnect_bytes_per_s=450 * GIGA,  # per direction; NVLink 4: 900 GB/s bidirectional
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5); seed text",
        date="2023",
        # on chip: XLA GPU target spec h100_sxm (shared_memory_per_core 233472 = 228 KiB, 132 SMs,
        # l2_cache_size 52428800 = the whitepaper's 50 MB)
        onchip_bytes_per_core=233472,
        num_cores=132,
        special_function_ops_per_s=HOPPER_SFU,
        l2_bytes=52428800,
    )
)
_chip(
    ChipSpec(
        name="h200",
        peak_flops_per_s={
            "bf16": 989 * TERA,
            "f16": 989 * TERA,
            "fp8": 1979 * TERA,
            "int8": 1979 * TERA,
            "f32": 67 * TERA,
        },
        bandwidth_bytes_per_s=4.8 * TERA,
        memory_bytes=141 * GIGA,
        power_watts=700,  # datasheet: max TDP up to 700 W (configurable)
        interconnect_bytes_per_s=450 * GIGA,  # per direction; NVLink 4: 900 GB/s bidirectional
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM)",
        date="2024",
        # on chip: as the H100 (the same GH100 die: 228 KiB shared memory per SM, 132 SMs);
        # XLA GPU target spec h200: l2_cache_size 52428800
        onchip_bytes_per_core=233472,
        num_cores=132,
        special_function_ops_per_s=HOPPER_SFU,
        l2_bytes=52428800,
    )
)
_chip(
    ChipSpec(
        name="b200",
        peak_flops_per_s={
            "bf16": 2250 * TERA,  # datasheet 4.5 PFLOPS sparse / 2
            "f16": 2250 * TERA,
            "fp8": 4500 * TERA,
            "int8": 4500 * TERA,
            "fp4": 9000 * TERA,  # HGX B200: FP4 144 PFLOPS sparse for 8 GPUs
            "f32": 75 * TERA,  # HGX B200: 600 TFLOPS FP32 for 8 GPUs
        },
        bandwidth_bytes_per_s=8.0 * TERA,  # DGX B200: 64 TB/s for 8 GPUs (HGX B200's page: 62)
        memory_bytes=180 * GIGA,  # HGX B200: 1.44 TB for 8 GPUs
        power_watts=1000,  # HGX B200: up to 1,000 W per GPU
        interconnect_bytes_per_s=900 * GIGA,  # per direction; NVLink 5: 1.8 TB/s bidirectional
        source="NVIDIA HGX B200 datasheet and DGX B200 page (per GPU: the 8 GPUs' figures / 8)",
        date="2025",
        # on chip: XLA GPU target spec b200 (shared_memory_per_core 233472, 148 SMs,
        # l2_cache_size 132644864)
        onchip_bytes_per_core=233472,
        num_cores=148,
        l2_bytes=132644864,
        special_function_ops_per_s=2250 * TERA * BLACKWELL_SFU_PER_BF16_FLOP,
    )
)
_chip(
    ChipSpec(
        name="a100-80gb",
        peak_flops_per_s={
            "bf16": 312 * TERA,
            "f16": 312 * TERA,
            "int8": 624 * TERA,
            "f32": 19.5 * TERA,  # non-tensor FP32; TF32 tensor is 156
        },
        bandwidth_bytes_per_s=2.039 * TERA,
        memory_bytes=80 * GIGA,
        power_watts=400,  # datasheet: max TDP 400 W (SXM)
        interconnect_bytes_per_s=300 * GIGA,  # per direction; NVLink 3: 600 GB/s bidirectional
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)",
        date="2021",
        # on chip: XLA GPU target spec a100_sxm_80 (shared memory 164 KiB per SM, 108 SMs,
        # l2_cache_size 41943040 = 40 MiB)
        onchip_bytes_per_core=167936,
        num_cores=108,
        special_function_ops_per_s=A100_SFU,
        l2_bytes=41943040,
    )
)
_chip(
    ChipSpec(
        name="a100-40gb",
        peak_flops_per_s={
            "bf16": 312 * TERA,
            "f16": 312 * TERA,
            "int8": 624 * TERA,
            "f32": 19.5 * TERA,
        },
        bandwidth_bytes_per_s=1.5552 * TERA,  # XLA GPU target spec a100_sxm_40: 1555200000000
        memory_bytes=40 * GIGA,
        power_watts=400,  # datasheet: max TDP 400 W (SXM)
        interconnect_bytes_per_s=300 * GIGA,  # per direction; NVLink 3: 600 GB/s bidirectional
        source="NVIDIA A100 Tensor Core GPU datasheet (40GB SXM); XLA GPU target spec a100_sxm_40",
        date="2020",
        # on chip: XLA a100_sxm_40 (shared memory 164 KiB per SM, 108 SMs, L2 41943040)
        onchip_bytes_per_core=167936,
        num_cores=108,
        special_function_ops_per_s=A100_SFU,
        l2_bytes=41943040,
    )
)
_chip(
    ChipSpec(
        name="h800",
        peak_flops_per_s={
            "bf16": 989 * TERA,
            "f16": 989 * TERA,
            "fp8": 1979 * TERA,
            "int8": 1979 * TERA,
        },
        bandwidth_bytes_per_s=3.352 * TERA,
        memory_bytes=80 * GIGA,
        power_watts=700,  # as the H100 SXM board: max TDP 700 W
        interconnect_bytes_per_s=200 * GIGA,  # per direction: NVLink 400 GB/s bidirectional
        source=(
            "LMSYS/Ant Group, 'Best Practices for Serving DeepSeek-R1 on H20-96G' (2025-09-26), "
            "H20 vs H800 table (dense BF16 989, FP8 1979 TFLOPS, 3352 GB/s, 80 GB, NVLink 400 "
            "GB/s); DeepSeek-V3 technical report (arXiv 2412.19437) sec. 3.5.1: 132 SMs"
        ),
        date="2023",
        # on chip: the H100 SXM's GH100 die (228 KiB shared memory per SM, 50 MiB L2): the
        # H800 differs in NVLink; no NVIDIA datasheet for it was found
        onchip_bytes_per_core=233472,
        num_cores=132,
        special_function_ops_per_s=HOPPER_SFU,
        l2_bytes=52428800,
    )
)
_chip(
    ChipSpec(
        name="h20",
        peak_flops_per_s={"bf16": 148 * TERA, "f16": 148 * TERA, "fp8": 296 * TERA},
        bandwidth_bytes_per_s=4.0 * TERA,
        memory_bytes=96 * GIGA,
        interconnect_bytes_per_s=450 * GIGA,  # per direction: NVLink 900 GB/s bidirectional
        source=(
            "LMSYS/Ant Group, 'Best Practices for Serving DeepSeek-R1 on H20-96G' (2025-09-26), "
            "H20 vs H800 table (dense BF16 148, FP8 296 TFLOPS, 4000 GB/s, 96 GB, NVLink 900 GB/s)"
        ),
        date="2024",
        # on chip: 78 SMs (torch's multi_processor_count in published scripts); the shared
        # memory per SM and the L2 have no first-party source: left unknown
        num_cores=78,
    )
)


def _tpu(name, bf16, int8, bw, memory, ici, doc, date, vmem_mib, cores):
    """A TPU from Google Cloud's system architecture page (`doc`): ICI per direction (the page's
    per-chip Gbps, both directions, / 2); on chip: jax/_src/pallas/mosaic/tpu_info.py (0.10.2),
    the VMEM a TensorCore and the TensorCores."""
    _chip(ChipSpec(name=name, peak_flops_per_s={"bf16": bf16 * TERA, "int8": int8 * TERA},
                   bandwidth_bytes_per_s=bw * GIGA, memory_bytes=memory,
                   interconnect_bytes_per_s=ici * GIGA, date=date,
                   source=f"Google Cloud TPU {doc} documentation (system architecture)",
                   onchip_bytes_per_core=vmem_mib * 2**20, num_cores=cores))  # fmt: skip


_tpu("tpu-v5e", 197, 394, 819, 16 * GIGA, 100, "v5e", "2023", 128, 1)  # ICI 1,600 Gbps
_tpu("tpu-v5p", 459, 918, 2765, 95 * GIGA, 300, "v5p", "2023", 64, 2)  # ICI 4,800 Gbps
_tpu("tpu-v6e", 918, 1836, 1640, 32 * 2**30, 224, "v6e (Trillium)", "2024", 128, 1)  # 3,584
_tpu("tpu-v4", 275, 275, 1200, 32 * 2**30, 150, "v4", "2021", 16, 2)  # ICI 2,400 Gbps
_chip(
    ChipSpec(
        name="mi300x",
        peak_flops_per_s={
            "bf16": 1307.4 * TERA,
            "f16": 1307.4 * TERA,
            "fp8": 2614.9 * TERA,
            "int8": 2614.9 * TERA,
            "f32": 163.4 * TERA,
        },
        bandwidth_bytes_per_s=5.3 * TERA,
        memory_bytes=192 * GIGA,
        power_watts=750,  # datasheet: peak total board power 750 W
        interconnect_bytes_per_s=448
        * GIGA,  # per direction; Infinity Fabric: 896 GB/s aggregate peer bandwidth
        source="AMD Instinct MI300X accelerator datasheet",
        date="2023",
        # on chip: AMD CDNA 3 white paper: 64 KiB LDS per CU, 304 CUs
        onchip_bytes_per_core=65536,
        num_cores=304,
    )
)
_chip(
    ChipSpec(
        name="gb200",  # per GPU: the NVL72 rack's sparse figures / 72 / 2
        peak_flops_per_s={
            "bf16": 2500 * TERA,
            "f16": 2500 * TERA,
            "fp8": 5000 * TERA,
            "int8": 5000 * TERA,
            "fp4": 10000 * TERA,
        },  # 360, 720, 1,440 PFLOPS
        bandwidth_bytes_per_s=8.0 * TERA,  # HBM3e 576 TB/s for 72 GPUs
        memory_bytes=186 * GIGA,  # 13.4 TB of HBM3e for 72 GPUs
        power_watts=1200,
        interconnect_bytes_per_s=900 * GIGA,  # per direction; NVLink 5: 1.8 TB/s bidirectional
        source="NVIDIA GB200 NVL72 datasheet (per GPU: the 72-GPU rack's figures / 72)",
        date="2025",
        num_cores=148,
        special_function_ops_per_s=2500 * TERA * BLACKWELL_SFU_PER_BF16_FLOP,
    )
)
_chip(
    ChipSpec(
        name="mi325x",  # the MI300X's CDNA 3 compute (304 CUs of 64 KiB LDS), HBM3E
        peak_flops_per_s={
            "bf16": 1307.4 * TERA,
            "f16": 1307.4 * TERA,
            "fp8": 2614.9 * TERA,
            "int8": 2614.9 * TERA,
            "f32": 163.4 * TERA,
        },  # fmt: skip
        bandwidth_bytes_per_s=6.0 * TERA,
        memory_bytes=256 * GIGA,
        power_watts=1000,
        interconnect_bytes_per_s=448 * GIGA,  # as the MI300X's Infinity Fabric
        source="AMD Instinct MI325X accelerator datasheet",
        date="2024",
        onchip_bytes_per_core=65536,
        num_cores=304,
    )
)


def get_chip(name: str) -> ChipSpec:
    if name not in CHIPS:
        raise unknown_name_error("chip", name, CHIPS)
    return CHIPS[name]
