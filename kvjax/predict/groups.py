"""Who ran what: the serving implementation behind a published row, and the chip families.

"Held out" in kvjax means that a prediction never saw its row's implementation: the code that
ran, not who published the row. A serving system's row names its implementation in the
systems corpus's `implementation` column (TensorRT-LLM in every form it is run: trtllm-bench,
MLPerf's NVIDIA harness, NIM's TensorRT-LLM profiles; vLLM; AMD's ROCm build of vLLM; SGLang;
...). A kernel or engine-step row of the corpus belongs to an implementation when its own
`implementation` text names that engine's code (`IMPLEMENTATION_PATTERNS`): TensorRT-LLM's
trtllm-gen attention and its NVFP4 GEMM, vLLM's PagedAttention and scaled-mm kernels,
sgl_kernel's GEMMs, an engine's whole steps. A kernel the engine calls that is someone else's
code (cuBLAS, CUTLASS's library, DeepGEMM, FlashAttention) belongs to that code, not the engine:
its rows predict every engine.

Chip families group rows for the report (`chip_family`): Hopper, Blackwell, Ampere, AMD, TPU.
"""

from __future__ import annotations

import re

TENSORRT_LLM = "TensorRT-LLM"
VLLM = "vLLM"
AMD_VLLM = "AMD vLLM (ROCm)"
SGLANG = "SGLang"
VLLM_TPU = "vLLM (TPU)"  # vLLM's scheduler on its TPU backend (tpu-inference's Pallas kernels)
SGLANG_JAX = "SGLang-JAX"  # SGLang's scheduler ported to JAX on TPUs (sgl-project/sglang-jax)
# An implementation -> the pattern its own kernel and step rows' `implementation` text matches
# (case-sensitive where an engine's name is a common word's prefix). A text that says another
# library's kernel was only "run by" the engine is that library's.
IMPLEMENTATION_PATTERNS: dict[str, str] = {
    TENSORRT_LLM: r"TensorRT-LLM|TRT-LLM|trtllm",
    VLLM: r"^vLLM\b",
    SGLANG: r"sgl_kernel|^SGLang\b",
}
CHIP_FAMILIES: dict[str, tuple[str, ...]] = {
    "Hopper": ("h100-sxm", "h200", "h800", "h20"),
    "Blackwell": ("b200", "gb200", "b300", "gb300"),
    "Ampere": ("a100-80gb", "a100-40gb"),
    "AMD": ("mi300x", "mi325x", "mi355x"),
    "TPU": ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7"),
}


def implementation_of(text: str | None) -> str | None:
    """The serving implementation whose own code a corpus row's `implementation` text names
    (None: a library's or a kernel's own, which belongs to no engine)."""
    text = (text or "").strip()
    if not text or re.search(r"\brun by\b", text):
        return None
    for name, pattern in IMPLEMENTATION_PATTERNS.items():
        if re.search(pattern, text):
            return name
    return None


def chip_family(chip: str) -> str:
    """The family a chip's row is reported under ('other' for a chip no family lists)."""
    return next((f for f, chips in CHIP_FAMILIES.items() if chip in chips), "other")
