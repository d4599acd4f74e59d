"""The published-measurements corpus: CSV files, one measurement a row (`COLUMNS`).

Every column is optional where the row's kind does not use it (`REQUIRED`); a column may be
absent from a file altogether. A malformed row raises one `KvjaxError` naming the file, its line
and the column. Rows whose `source` agree up to the first ';' are one citation (a publication, a
README, a pull request); what follows the ';' locates the number in it. Citations that measured
the same implementation or came from the same team are one `source_group` (a repository or an
organisation: DeepGEMM's README, pull requests and issues are one group), the unit a prediction
is held out by; a row without one is a group of its own citation. `timing` says how the source
timed the row (`TIMING`), as the source or the benchmark script it names says: the model
predicts a kernel's time on the device, which a source timed from the host adds its dispatch to.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvjax.dtypes import DTYPE_BYTES, PACKED_KV_BYTES, dtype_key, dtype_refusal
from kvjax.errors import KvjaxError
from kvjax.hardware import CHIPS

CORPUS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "published"

COLUMNS = (
    "source",
    "source_group",
    "chip",
    "dtype",
    "kernel",
    "implementation",
    "batch",
    "seq_q",
    "seq_kv",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "causal",
    "latent_dim",
    "rope_dim",
    "m",
    "n",
    "k",
    "model",
    "context",
    "measured_s",
    "convention",
    "confidence",
)
OPTIONAL = (
    "num_chips",
    "kv_dtype",
    "flag_reason",
    "timing",
    "page_size",
    "window",
    "implementation_version",
    "l2_flushed",
    "clock_locked",
)  # extra columns kvjax reads
# What tells two runs of one kernel apart beside its shape: `page_size` (a paged cache's tokens
# a page; empty: contiguous or not stated), `window` (a sliding window's key positions a query
# sees, itself included, as `ModelConfig.sliding_window` counts them; empty: full attention),
# `implementation_version` (the version or commit timed), `l2_flushed` (whether the harness
# flushed the L2 between calls; empty: the source and its harness do not tell), `clock_locked`
# (the SM clock in MHz a run locked; empty: not locked or not stated).
# how a row was timed: `kernel`, the kernel's own duration from a profiler or device timer
# (CUPTI, kineto, nsys, nvbench's GPU time); `graph`, a CUDA graph's replay between CUDA events
# (no host launch); `events`, CUDA events or one synchronize around back-to-back launches from
# the host (its dispatch hidden only behind a longer kernel); `host`, the host's clock around each
# call with its launch and a synchronize; a whole step's row: `graph` where the engine replays
# CUDA graphs, `host` where it launches each kernel. Empty: the source does not say.
TIMING = ("kernel", "graph", "events", "host")
KERNELS = ("attention_prefill", "attention_decode", "matmul", "decode_step", "prefill_step")
CONFIDENCE = ("exact", "plot")
INTS = (
    "batch",
    "seq_q",
    "seq_kv",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "latent_dim",
    "rope_dim",
    "m",
    "n",
    "k",
    "context",
    "num_chips",
    "page_size",
    "window",
    "clock_locked",
)
# A row's dtype: int4 is weight-only (gpt-fast's int4 rows: half of int8's weight bytes, computed
# in bf16); fp4 a GEMM's (both operands 4-bit, block-scaled: NVFP4, MXFP4) at the chip's fp4
# peak, its elements at 4 bits (the scales' 0.25-0.5 bit an element left out: the bound stays
# one); the bounds model no int2 weights. Its kv_dtype: every KV dtype `ModelConfig` sizes.
DTYPES = (*DTYPE_BYTES, "int4", "fp4")
ONLY_MATMUL = ("fp4",)
KV_DTYPES = (*DTYPE_BYTES, *PACKED_KV_BYTES)
_DTYPE_COLUMNS = {"dtype": DTYPES, "kv_dtype": KV_DTYPES}
BOOLS = ("causal", "l2_flushed")
REQUIRED = {
    "attention_prefill": ("batch", "seq_q", "num_heads", "head_dim"),
    "attention_decode": ("batch", "seq_kv", "num_heads"),
    "matmul": ("m", "n", "k"),
    "decode_step": ("model", "batch", "context"),
    "prefill_step": ("model", "batch", "context"),
}
ALWAYS = ("source", "chip", "dtype", "kernel", "measured_s")


@dataclass(frozen=True)
class Row:
    """One measurement: the CSV's cells as typed values (None where empty), where it came from."""

    values: dict[str, Any]
    path: str
    line: int
    extra: dict[str, str] = field(default_factory=dict)  # columns kvjax does not read

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def source_key(self) -> str:
        """The citation: the source up to its first ';'."""
        return self.values["source"].split(";")[0].strip()

    @property
    def group(self) -> str:
        """The independent source a prediction is held out by: `source_group`, or the
        citation where the row names none."""
        return self.values.get("source_group") or self.source_key


def _bad(path: str, line: int, column: str, message: str) -> KvjaxError:
    return KvjaxError(f"{path}:{line}: column {column!r}: {message}")


def _cell(path: str, line: int, column: str, text: str) -> Any:
    text = text.strip()
    if not text:
        return None
    if column in INTS:
        try:
            value = int(text)
        except ValueError:
            raise _bad(path, line, column, f"{text!r} is not an integer") from None
        if value <= 0:
            raise _bad(path, line, column, f"{value} must be a positive integer")
        return value
    if column == "measured_s":
        try:
            value = float(text)
        except ValueError:
            raise _bad(path, line, column, f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or value <= 0:
            raise _bad(path, line, column, f"{text!r} must be a positive number of seconds")
        return value
    if column in BOOLS:
        if text.lower() not in ("true", "false", "1", "0"):
            raise _bad(path, line, column, f"{text!r} is not true or false")
        return text.lower() in ("true", "1")
    if column == "kernel" and text not in KERNELS:
        raise _bad(path, line, column, f"{text!r}; allowed: {', '.join(KERNELS)}")
    if column == "chip" and text not in CHIPS:
        raise _bad(path, line, column, f"unknown chip {text!r}; known: {', '.join(CHIPS)}")
    if column in _DTYPE_COLUMNS:  # an alias ('fp16') is stored as its canonical name ('f16')
        allowed = _DTYPE_COLUMNS[column]
        if dtype_key(text) not in allowed:
            raise _bad(path, line, column, f"{text!r}{dtype_refusal(text, allowed)}")
        return dtype_key(text)
    if column == "confidence" and text not in CONFIDENCE:
        raise _bad(path, line, column, f"{text!r}; allowed: {', '.join(CONFIDENCE)}")
    if column == "timing" and text not in TIMING:
        raise _bad(path, line, column, f"{text!r}; allowed: {', '.join(TIMING)} (or empty)")
    return text


def _check_window(path: str, line: int, values: dict[str, Any]) -> None:
    """A sliding window is a fused attention's, causal (the band below the diagonal that
    `exact_pairs` counts), of a GQA/MHA layer."""
    if values["window"] is None:
        return
    if values["kernel"] not in ("attention_prefill", "attention_decode"):
        raise _bad(path, line, "window", f"a {values['kernel']} row has no attention window")
    if values["causal"] is False:
        raise _bad(path, line, "window", "a sliding window is causal; causal is false")
    if values["latent_dim"]:
        raise _bad(path, line, "window", "kvjax counts no window for a latent (MLA) row")


def read_csv(path: str | Path) -> list[Row]:
    """The rows of one corpus file, checked: the columns a row's kind needs are filled."""
    path = Path(path)
    name = str(path)
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in ALWAYS if c not in header]
        if missing:
            raise KvjaxError(
                f"{name}:1: the header lacks {', '.join(missing)} (columns: {', '.join(COLUMNS)})"
            )
        known = set(COLUMNS) | set(OPTIONAL)
        rows = []
        for i, raw in enumerate(reader, start=2):
            if None in raw:  # more cells than the header has names
                raise _bad(name, i, "(extra)", f"{len(raw[None])} more cells than the header")
            values = {c: None for c in (*COLUMNS, *OPTIONAL)}
            for column in header:
                if column in known:
                    values[column] = _cell(name, i, column, raw[column] or "")
            for column in ALWAYS:
                if values[column] is None:
                    raise _bad(name, i, column, "is empty; every row needs it")
            if values["dtype"] in ONLY_MATMUL and values["kernel"] != "matmul":
                raise _bad(
                    name,
                    i,
                    "dtype",
                    f"{values['dtype']!r} is a GEMM's dtype; a "
                    f"{values['kernel']} row takes one of "
                    f"{', '.join(d for d in DTYPES if d not in ONLY_MATMUL)}",
                )
            for column in REQUIRED[values["kernel"]]:
                if values[column] is None:
                    raise _bad(name, i, column, f"is empty; a {values['kernel']} row needs it")
            _check_window(name, i, values)
            extra = {c: raw[c] for c in header if c not in known}
            rows.append(Row(values, name, i, extra))
    return rows


def corpus_files(paths: list[str] | None = None) -> list[Path]:
    """The files named, or every CSV of the committed corpus."""
    if paths:
        return [Path(p) for p in paths]
    # systems.csv, its length distributions (lengths.csv) and MLPerf rows' engine settings
    # (mlperf_engines.csv, mlperf_amd_engines.csv) are kvjax.serving's
    serving = ("systems.csv", "lengths.csv", "mlperf_engines.csv", "mlperf_amd_engines.csv")
    return sorted(p for p in CORPUS_DIR.glob("*.csv") if p.name not in serving)


def read_corpus(paths: list[str] | None = None) -> list[Row]:
    files = corpus_files(paths)
    if not files:
        raise KvjaxError(f"no corpus CSV files in {CORPUS_DIR}")
    return [row for path in files for row in read_csv(path)]
