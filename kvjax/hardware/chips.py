"""The chips kvjax knows, each number from the vendor's datasheet or a named first-party source.

Datasheets state sparse tensor-core rates ("with sparsity"); these are the dense halves. A die
sold as several boards (GH100: the H100 SXM, H200 and H800; GA100: the A100 40 and 80 GB; CDNA 3:
the MI300X and MI325X) has its compute and on-chip figures written once, each board its memory,
bandwidth, power and link. On-chip memory and cores are what `kvjax.analytic.flash` tiles for:
XLA's GPU target specs (`shared_memory_per_core`, SM count, `l2_cache_size`), AMD's CDNA 3 white
paper, jax's Pallas TPU info. The special-function rate (exp2/s) is what the prediction charges a
fused softmax's exponentials (never the bound): FlashAttention-3 sec. 3.1 on Hopper (3.9 TFLOP/s
on the H100 SXM5), the CUDA guide's 16 a clock per SM on the A100, and FlashAttention-4 (arXiv
2603.05451) on Blackwell, whose SM does 16 exponentials a clock beside 8,192 dense BF16 FLOPs
(the BF16 peak / 512).
"""

from __future__ import annotations

from dataclasses import replace

from kvjax.errors import unknown_name_error
from kvjax.hardware.spec import GIGA, TERA, ChipSpec

CHIPS: dict[str, ChipSpec] = {}


def _chip(spec: ChipSpec) -> ChipSpec:
    CHIPS[spec.name] = spec
    return spec


HOPPER_SFU = 3.9 * TERA
A100_SFU = 108 * 16 * 1.41e9  # 16 a clock an SM x 108 SMs x 1.41 GHz
BLACKWELL_SFU_PER_BF16_FLOP = 16 / 8192
# Blackwell Ultra (B300, GB300): "doubling SFU throughput over the standard NVIDIA Blackwell
# architecture" (NVIDIA technical blog, 'Making Softmax More Efficient with NVIDIA Blackwell Ultra')
BLACKWELL_ULTRA_SFU_PER_BF16_FLOP = 2 * BLACKWELL_SFU_PER_BF16_FLOP

# GH100 (H100 SXM, H200, H800): 989 dense BF16 TFLOP/s (1979 sparse / 2), 132 SMs of 228 KiB
# shared memory (XLA's h100_sxm spec: 233472), L2 52428800 B (the whitepaper's 50 MB)
GH100 = ChipSpec(
    name="gh100",
    peak_flops_per_s={
        "bf16": 989 * TERA,
        "f16": 989 * TERA,
        "fp8": 1979 * TERA,
        "int8": 1979 * TERA,
        "f32": 67 * TERA,  # non-tensor FP32; TF32 tensor is 494.7
    },
    bandwidth_bytes_per_s=3.35 * TERA,
    onchip_bytes_per_core=233472,
    num_cores=132,
    special_function_ops_per_s=HOPPER_SFU,
    l2_bytes=52428800,
)
NVLINK4 = 450 * GIGA  # per direction; NVLink 4: 900 GB/s bidirectional
# GA100 (A100 40 and 80 GB SXM): XLA's a100_sxm specs: 164 KiB shared memory an SM, 108 SMs,
# L2 41943040 B (40 MiB)
GA100 = ChipSpec(
    name="ga100",
    peak_flops_per_s={
        "bf16": 312 * TERA,
        "f16": 312 * TERA,
        "int8": 624 * TERA,
        "f32": 19.5 * TERA,  # non-tensor FP32; TF32 tensor is 156
    },
    bandwidth_bytes_per_s=2.039 * TERA,
    power_watts=400,  # datasheet: max TDP 400 W (SXM)
    interconnect_bytes_per_s=300 * GIGA,  # per direction; NVLink 3: 600 GB/s bidirectional
    onchip_bytes_per_core=167936,
    num_cores=108,
    special_function_ops_per_s=A100_SFU,
    l2_bytes=41943040,
)
# CDNA 3 (MI300X, MI325X): 304 CUs of 64 KiB LDS (AMD's CDNA 3 white paper); Infinity Fabric
# 896 GB/s aggregate peer bandwidth, 448 per direction
CDNA3 = ChipSpec(
    name="cdna3",
    peak_flops_per_s={
        "bf16": 1307.4 * TERA,
        "f16": 1307.4 * TERA,
        "fp8": 2614.9 * TERA,
        "int8": 2614.9 * TERA,
        "f32": 163.4 * TERA,
    },
    bandwidth_bytes_per_s=5.3 * TERA,
    interconnect_bytes_per_s=448 * GIGA,
    onchip_bytes_per_core=65536,
    num_cores=304,
)


def _tpu(name, bf16, int8, bw, memory, ici, doc, date, vmem_mib, cores) -> None:
    """A TPU from Google Cloud's system architecture page (`doc`): ICI per direction (the page's
    per-chip Gbps, both directions, / 2); on chip: jax/_src/pallas/mosaic/tpu_info.py (0.10.2),
    the VMEM a TensorCore and the TensorCores."""
    _chip(
        ChipSpec(
            name=name,
            peak_flops_per_s={"bf16": bf16 * TERA, "int8": int8 * TERA},
            bandwidth_bytes_per_s=bw * GIGA,
            memory_bytes=memory,
            interconnect_bytes_per_s=ici * GIGA,
            date=date,
            source=f"Google Cloud TPU {doc} documentation (system architecture)",
            onchip_bytes_per_core=vmem_mib * 2**20,
            num_cores=cores,
        )
    )


_chip(
    replace(
        GH100,
        name="h100-sxm",  # the seed's numbers
        bandwidth_bytes_per_s=3.35 * TERA,
        memory_bytes=80 * GIGA,
        power_watts=700,  # datasheet: max TDP up to 700 W (configurable)
        interconnect_bytes_per_s=NVLINK4,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5); seed text",
        date="2023",
    )
)
_chip(
    replace(
        GH100,
        name="h200",  # XLA's h200 spec: the same L2
        bandwidth_bytes_per_s=4.8 * TERA,
        memory_bytes=141 * GIGA,
        power_watts=700,  # datasheet: max TDP up to 700 W (configurable)
        interconnect_bytes_per_s=NVLINK4,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM)",
        date="2024",
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
        # XLA's b200 spec: shared_memory_per_core 233472, 148 SMs, l2_cache_size 132644864
        onchip_bytes_per_core=233472,
        num_cores=148,
        l2_bytes=132644864,
        special_function_ops_per_s=2250 * TERA * BLACKWELL_SFU_PER_BF16_FLOP,
    )
)
_chip(
    replace(
        GA100,
        name="a100-80gb",
        memory_bytes=80 * GIGA,
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)",
        date="2021",
    )
)
_chip(
    replace(
        GA100,
        name="a100-40gb",
        bandwidth_bytes_per_s=1.5552 * TERA,  # XLA's a100_sxm_40 spec: 1555200000000
        memory_bytes=40 * GIGA,
        source="NVIDIA A100 Tensor Core GPU datasheet (40GB SXM); XLA GPU target spec a100_sxm_40",
        date="2020",
    )
)
_chip(
    replace(
        GH100,
        name="h800",  # the GH100 die with a narrower NVLink; no NVIDIA datasheet was found
        peak_flops_per_s={k: v for k, v in GH100.peak_flops_per_s.items() if k != "f32"},
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
        # 78 SMs (torch's multi_processor_count in published scripts); the shared memory per SM
        # and the L2 have no first-party source: left unknown
        num_cores=78,
    )
)
_tpu("tpu-v5e", 197, 394, 819, 16 * GIGA, 100, "v5e", "2023", 128, 1)  # ICI 1,600 Gbps
_tpu("tpu-v5p", 459, 918, 2765, 95 * GIGA, 300, "v5p", "2023", 64, 2)  # ICI 4,800 Gbps
_tpu("tpu-v6e", 918, 1836, 1640, 32 * 2**30, 224, "v6e (Trillium)", "2024", 128, 1)  # 3,584
_tpu("tpu-v4", 275, 275, 1200, 32 * 2**30, 150, "v4", "2021", 16, 2)  # ICI 2,400 Gbps
_chip(
    replace(
        CDNA3,
        name="mi300x",
        memory_bytes=192 * GIGA,
        power_watts=750,  # datasheet: peak total board power 750 W
        source="AMD Instinct MI300X accelerator datasheet",
        date="2023",
    )
)
_chip(
    ChipSpec(
        name="gb200",  # per GPU: the NVL72 rack's sparse figures (360, 720, 1,440 PFLOPS) / 72 / 2
        peak_flops_per_s={
            "bf16": 2500 * TERA,
            "f16": 2500 * TERA,
            "fp8": 5000 * TERA,
            "int8": 5000 * TERA,
            "fp4": 10000 * TERA,
        },
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
# Blackwell Ultra, per GPU: the NVIDIA Blackwell Ultra datasheet's 'Individual GPU
# Specifications' (sparse | dense tensor rates: the dense, or the sparse / 2 where one is
# printed), its HGX B300 and GB300 NVL72 columns; XLA's GPU target specs (b300, gb300) for the
# shared memory an SM and the L2. INT8 is left out: cut on Blackwell Ultra, and the datasheet's
# 307 / 330 TOPS say neither dense nor sparse.
_chip(
    ChipSpec(
        name="b300",
        peak_flops_per_s={
            "bf16": 2250 * TERA,  # FP16/BF16 4.5 PFLOPS sparse / 2
            "f16": 2250 * TERA,
            "fp8": 4500 * TERA,  # FP8/FP6 9 PFLOPS sparse / 2
            "fp4": 14000 * TERA,  # FP4 18 | 14 PFLOPS
            "f32": 75 * TERA,
        },
        bandwidth_bytes_per_s=7.7 * TERA,  # 270 GB HBM3E | 7.7 TB/s
        memory_bytes=270 * GIGA,
        power_watts=1100,  # configurable up to 1,100 W
        interconnect_bytes_per_s=900 * GIGA,  # per direction; NVLink 5: 1.8 TB/s bidirectional
        source=(
            "NVIDIA Blackwell Ultra datasheet (HGX B300 column, per GPU; the PDF is not stored "
            "here: its table as three repositories quote it alike); XLA b300 spec"
        ),
        date="2025",
        # 148 SMs as the shipping B300 SXM6 reports them (published device queries; XLA's b300
        # spec says 158, the blog's full die 160); 228 KiB of shared memory an SM and the L2
        # from XLA's b300 spec (shared_memory_per_core 233472, l2_cache_size 135528448)
        onchip_bytes_per_core=233472,
        num_cores=148,
        l2_bytes=135528448,
        special_function_ops_per_s=2250 * TERA * BLACKWELL_ULTRA_SFU_PER_BF16_FLOP,
    )
)
_chip(
    ChipSpec(
        name="gb300",
        peak_flops_per_s={
            "bf16": 2500 * TERA,  # FP16/BF16 5 PFLOPS sparse / 2 (the rack's 360 PF / 72 / 2)
            "f16": 2500 * TERA,
            "fp8": 5000 * TERA,  # FP8/FP6 10 PFLOPS sparse / 2
            "fp4": 15000 * TERA,  # FP4 20 | 15 PFLOPS (the rack's 1,080 PF dense / 72)
            "f32": 80 * TERA,
        },
        bandwidth_bytes_per_s=8.0 * TERA,  # 279 GB HBM3E | 8 TB/s
        memory_bytes=279 * GIGA,
        power_watts=1400,  # configurable up to 1,400 W
        interconnect_bytes_per_s=900 * GIGA,  # per direction; NVLink 5: 1.8 TB/s bidirectional
        source=(
            "NVIDIA Blackwell Ultra datasheet (GB300 NVL72 column, per GPU; the PDF is not stored "
            "here: its table as three repositories quote it alike); XLA gb300 spec"
        ),
        date="2025",
        # XLA's gb300 spec, generated on the device: 152 cores, shared_memory_per_core 233472,
        # l2_cache_size 135528448
        onchip_bytes_per_core=233472,
        num_cores=152,
        l2_bytes=135528448,
        special_function_ops_per_s=2500 * TERA * BLACKWELL_ULTRA_SFU_PER_BF16_FLOP,
    )
)
_chip(
    ChipSpec(
        name="mi355x",  # CDNA 4
        peak_flops_per_s={
            "bf16": 2516.6 * TERA,  # 256 CUs x 2.4 GHz x 4,096 FLOPs a clock (AMD: 2.5 PFLOPS)
            "f16": 2516.6 * TERA,
            "fp8": 5033.2 * TERA,  # OCP FP8: 10.1 PFLOPS with structured sparsity / 2
            "int8": 5033.2 * TERA,
            "fp4": 10066.3 * TERA,  # MXFP4 / MXFP6: 10.1 PFLOPS, no sparsity
            "f32": 157.3 * TERA,
        },
        bandwidth_bytes_per_s=8.0 * TERA,
        memory_bytes=288 * GIGA,
        power_watts=1400,
        source=(
            "AMD Instinct MI355X product page (peak rates, 288 GB HBM3E at 8 TB/s, 1,400 W; the "
            "page is not stored here: as third-party references quote it, the rates its 256 CUs "
            "at 2.4 GHz give); ROCm "
            "documentation, GPU hardware specifications (ROCm/rocm-docs@2b48ffc7: 256 CUs, 160 "
            "KiB LDS a CU, L2 32 MiB as 4 MiB an XCD, 256 MiB Infinity Cache)"
        ),
        date="2025",
        # no interconnect: the Infinity Fabric's per-link rate was not found in a first-party
        # source, so a tensor-parallel placement on the MI355X is refused by name
        onchip_bytes_per_core=163840,
        num_cores=256,
    )
)
_chip(
    replace(
        CDNA3,
        name="mi325x",  # HBM3E
        bandwidth_bytes_per_s=6.0 * TERA,
        memory_bytes=256 * GIGA,
        power_watts=1000,
        source="AMD Instinct MI325X accelerator datasheet",
        date="2024",
    )
)


def get_chip(name: str) -> ChipSpec:
    if name not in CHIPS:
        raise unknown_name_error("chip", name, CHIPS)
    return CHIPS[name]
