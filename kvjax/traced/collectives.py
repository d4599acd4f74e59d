"""Collectives in a compiled (SPMD-partitioned) module's HLO text: kind, result shape, replica-group
size, and the bytes one device sends (= receives) with ring algorithms, the convention of
`kvjax.analytic.parallel`: all-reduce 2 (n-1)/n X, all-gather and all-to-all (n-1)/n X (X the
result), reduce-scatter (n-1) X (X the result, 1/n of the input), collective-permute X.

Across hosts (processes): every collective's replica groups are read as device lists (partition
ids, positions in the mesh's device order), so with a map from partition id to host a collective
whose groups span hosts is counted apart from one that stays within a host (`summarize(colls,
host_of)`): the bytes a device sends in collectives crossing hosts beside those within one, and
the bytes a step puts on links between hosts when each group's ring is ordered host by host (a
group spanning h hosts has h of its n ring links between hosts, each carrying one device's bytes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    groups: tuple[tuple[int, ...], ...] = ()  # partition ids of each replica group

    def hosts_spanned(self, host_of: Sequence[int]) -> int:
        """The most hosts any one of its groups spans (1: it stays within a host)."""
        return max((len({host_of[d] for d in g}) for g in self.groups), default=1)

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


def _iota(dims: str, perm: str | None) -> np.ndarray:
    ids = np.arange(math.prod(int(d) for d in dims.split(","))).reshape(
        [int(d) for d in dims.split(",")]
    )
    return ids.transpose([int(p) for p in perm.split(",")]) if perm else ids


def replica_groups(line: str, num_partitions: int) -> tuple[tuple[int, ...], ...]:
    """The device groups of one collective, from any of the spellings XLA prints."""
    m = re.search(
        r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?"
        r"\s*\{([^}]*)\}",
        line,
    )
    if m:  # mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
        ids = _iota(m.group(2), m.group(3)) if m.group(2) else np.arange(math.prod(sizes))
        ids = ids.reshape(sizes)
        over = [names.index(a) for a in re.findall(r"'([^']+)'", m.group(4))]
        rest = [i for i in range(len(names)) if i not in over]
        ids = ids.transpose(rest + over).reshape(-1, math.prod(sizes[i] for i in over))
        return tuple(tuple(int(d) for d in g) for g in ids)
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:  # iota: [groups, size]<=[dims]T(perm)
        ids = _iota(m.group(3), m.group(4)).reshape(int(m.group(1)), int(m.group(2)))
        return tuple(tuple(int(d) for d in g) for g in ids)
    m = re.search(r"(?:replica_groups|source_target_pairs)=\{(\{[\d,{}\s]*\})\}", line)
    if m:  # explicit {{0,1,2,3},{4,5,6,7}}; a permute's {{source,target},...} pairs
        return tuple(
            tuple(int(d) for d in g.split(",") if d.strip())
            for g in re.findall(r"\{([\d,\s]*)\}", m.group(1))
        )
    return (tuple(range(num_partitions)),)  # replica_groups={}: every device


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
        groups = replica_groups(line, num_partitions)
        size = 2 if "source_target_pairs=" in line else len(groups[0])
        out.append(Collective(hit.group("kind"), shape, _shape_bytes(shape), size, groups))
    return out


def summarize(
    colls: list[Collective], host_of: Sequence[int] | None = None
) -> dict[str, dict[str, float]]:
    """Per kind: how many, and the bytes one device sends; with `host_of` (partition id ->
    host), also how many cross hosts, the bytes a device sends in those, and the bytes the step
    puts on links between hosts (rings ordered host by host)."""
    out: dict[str, dict[str, float]] = {}
    for c in colls:
        row = out.setdefault(c.kind, {"count": 0, "bytes_per_device": 0.0})
        row["count"] += 1
        row["bytes_per_device"] += c.bytes_per_device
        if host_of is None:
            continue
        hosts = c.hosts_spanned(host_of)
        crossing = hosts > 1 and c.bytes_per_device > 0
        row["cross_host_count"] = row.get("cross_host_count", 0) + int(crossing)
        row["cross_host_bytes_per_device"] = row.get("cross_host_bytes_per_device", 0.0) + (
            c.bytes_per_device if crossing else 0.0
        )
        links = sum(len({host_of[d] for d in g}) for g in c.groups) if crossing else 0
        row["inter_host_link_bytes"] = row.get("inter_host_link_bytes", 0.0) + (
            links * c.bytes_per_device
        )
    return out
