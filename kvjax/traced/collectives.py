"""Collectives in a compiled (SPMD-partitioned) module's HLO text: kind, result shape, replica-group
size, and the bytes one device sends (= receives) with ring algorithms, the convention of
`kvjax.analytic.parallel`: all-reduce 2 (n-1)/n X, all-gather and all-to-all (n-1)/n X (X the
result), reduce-scatter (n-1) X (X the result, 1/n of the input), collective-permute X.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvjax.traced.hlo import hlo_dtype_bytes

COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>\(.*?\)|\S+)\s+"
    r"(?P<kind>" + "|".join(COLLECTIVE_KINDS) + r")(?:-start)?\("
)
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


@dataclass(frozen=True)
class Collective:
    kind: str
    shape: str  # the result, as the HLO prints it
    result_bytes: float
    group_size: int

    @property
    def bytes_per_device(self) -> float:
        n, x = self.group_size, self.result_bytes
        if n <= 1:
            return 0.0
        if self.kind == "all-reduce":
            return 2 * (n - 1) / n * x
        if self.kind in ("all-gather", "all-to-all"):
            return (n - 1) / n * x
        if self.kind == "reduce-scatter":
            return (n - 1) * x
        return float(x)  # collective-permute


def _shape_bytes(shape: str) -> float:
    return sum(
        hlo_dtype_bytes(dtype) * math.prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in _ARRAY.findall(shape)
    )


def _group_size(line: str, num_partitions: int) -> int:
    """Devices in one replica group, from any of the three spellings XLA prints."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:  # mesh['axis_0'=1,'axis_1'=8] {'axis_1'}
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))}
        return math.prod(sizes[a] for a in re.findall(r"'([^']+)'", m.group(2)))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if m:  # iota: [groups, size]<=[devices]
        return int(m.group(2))
    m = re.search(r"replica_groups=\{\{([^}]*)\}", line)
    if m:  # explicit {{0,1,2,3},{4,5,6,7}}
        return len(m.group(1).split(","))
    if re.search(r"source_target_pairs=", line):
        return 2
    return num_partitions  # replica_groups={}: every device


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective of a compiled module's HLO text (async pairs counted once, at -start)."""
    m = re.search(r"num_partitions=(\d+)", hlo_text)
    num_partitions = int(m.group(1)) if m else 1
    out = []
    for line in hlo_text.splitlines():
        hit = _INSTR.match(line)
        if not hit:
            continue
        shape = hit.group("shape")
        if hit.group(0).rstrip("(").endswith("-start"):
            # an async start returns (operands, results, ...): the result is its last array
            arrays = _ARRAY.findall(shape)
            shape = f"{arrays[-1][0]}[{arrays[-1][1]}]" if arrays else shape
        size = _group_size(line, num_partitions)
        out.append(Collective(hit.group("kind"), shape, _shape_bytes(shape), size))
    return out


def summarize(colls: list[Collective]) -> dict[str, dict[str, float]]:
    """Per kind: how many, and the bytes one device sends."""
    out: dict[str, dict[str, float]] = {}
    for c in colls:
        row = out.setdefault(c.kind, {"count": 0, "bytes_per_device": 0.0})
        row["count"] += 1
        row["bytes_per_device"] += c.bytes_per_device
    return out
