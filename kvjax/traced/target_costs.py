"""Per-kernel costs of an accelerator's compiled module (XLA:GPU, XLA:TPU), counted by kvjax.

XLA:GPU's compile-only executable has no `cost_analysis()`, and XLA's generic HLO cost analysis
gives a cuBLAS custom-call -1 FLOPs and -1 bytes; XLA:TPU's counts an operand prefetched on chip
once per use. So kvjax counts every executed instruction of the ENTRY computation itself, with
the rules of `kvjax.traced.compiled` (XLA's HloCostAnalysis for fusions) plus:

- a cuBLAS / cuBLASLt / cuDNN GEMM custom-call: 2 x output elements x contracted elements
  (the dot dimensions of its backend config), bytes its operands and its first output (the
  workspace it also returns is scratch: reported, not traffic);
- a Triton GEMM fusion: its dot's FLOPs; when XLA split the contraction (split-K, k partial
  products over slices of K), the partials are an f32 temporary written by the GEMM and read by
  the reduction that follows: named, with their bytes, on the product's row;
- a fusion spanning several kernels is split by its instructions' op metadata (the
  `jax.named_scope`s survive fusion): each fused instruction's FLOPs go to its kernel, each
  operand's read to the kernel of the instruction that uses it, each output's write to the
  kernel that produces it. An instruction without metadata takes the kernel of its users inside
  the fusion, then of its operands, then the fusion's own (`compiled_ops`: the weights it
  reads, the lowered product of its shape, its consumer);
- FLOPs XLA's convention counts that are not arithmetic (a `convert`, one per element: a B=1
  product lowered to multiply + widen + reduce counts its converts) are kept apart as
  `convert_flops`, so a product's compiled FLOPs compare with its 2MNK;
- TPU: an operand or output whose layout is in memory space 1 (`S(1)`, on-chip VMEM) is not HBM
  traffic; the copy-start/copy-done pairs that prefetch into it are (named `prefetch`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kvjax import kernels
from kvjax.traced.compiled import (
    _MOVES,
    _NO_THUNK,
    UNNAMED,
    _normalize,
    compiled_ops,
    lowered_products,
)
from kvjax.traced.fusion_scopes import _concatenated_weights, _operand_kernels
from kvjax.traced.fusion_split import split_fusion
from kvjax.traced.hlo import Cost, CostModel, Instr, _shape_bytes_elems, parse_hlo
from kvjax.traced.target_rules import TargetCostModel, is_gemm, thunk_kind


@dataclass
class KernelCost:
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes: float = 0.0
    convert_flops: float = 0.0  # XLA counts a convert as one FLOP an element: not arithmetic
    split_k_bytes: float = 0.0  # f32 partial products written and read again
    # bytes of instructions that only move data XLA added (a padding copy, a layout copy)
    copy_bytes: float = 0.0
    thunks: set[str] = field(default_factory=set)

    def add(self, flops=0.0, transcendentals=0.0, bytes_=0.0, convert=0.0) -> None:
        self.flops += flops
        self.transcendentals += transcendentals
        self.bytes += bytes_
        self.convert_flops += convert


@dataclass
class Thunk:
    """One executed instruction: the kernels it computes and what runs it."""

    name: str
    kind: str
    kernels: tuple[str, ...]
    layers: tuple[int, ...]
    flops: float
    bytes: float
    temporary: str | None = None  # "split-K x8", "layout copy", "padding", "prefetch", ...


@dataclass
class TargetModuleCosts:
    per_kernel: dict[tuple[int | None, str], KernelCost]
    thunks: list[Thunk]
    total: Cost
    notes: list[str] = field(default_factory=list)

    def by_kernel(self) -> dict[str, KernelCost]:
        out: dict[str, KernelCost] = {}
        for (_, name), c in self.per_kernel.items():
            row = out.setdefault(name, KernelCost())
            row.add(c.flops, c.transcendentals, c.bytes, c.convert_flops)
            row.split_k_bytes += c.split_k_bytes
            row.copy_bytes += c.copy_bytes
            row.thunks |= c.thunks
        return out


# a fusion of moves only, by the opcode of its root
_MOVE_ROOTS = {"pad": "padding copy", "copy": "layout copy", "transpose": "layout copy"}


def module_kernel_costs(
    text: str,
    kernel_names: tuple[str, ...],
    param_kernel=None,
    lowered_text: str | None = None,
    hbm_only: bool = False,
) -> TargetModuleCosts:
    """Per (layer, kernel) costs and the executed instructions of an optimized module."""
    return ModuleCosts(text, kernel_names, param_kernel, lowered_text, hbm_only).run()


class ModuleCosts:
    """The ENTRY computation's instructions costed in turn, each to the kernels it computes: a
    fusion split over its kernels, any other instruction to the kernel its metadata (or its
    consumer's) names; then the split-K partials to their products."""

    def __init__(self, text, kernel_names, param_kernel=None, lowered_text=None, hbm_only=False):
        module = parse_hlo(_normalize(text))
        self.model = TargetCostModel(module, hbm_only=hbm_only)
        self.comps = module.computations
        self.entry = self.comps[module.entry]
        self.names, self.param_kernel = kernel_names, param_kernel
        ops = compiled_ops(text, kernel_names, param_kernel, lowered_text)
        self.fused = {op.name: op for op in ops}
        products = lowered_products(lowered_text, kernel_names) if lowered_text else {}
        self.out_elems_by_flops: dict[float, set[int]] = defaultdict(set)
        for flops, elems in products:
            self.out_elems_by_flops[flops].add(elems)
        self.consumers: dict[str, list[str]] = defaultdict(list)
        for ins in self.entry:
            for operand in dict.fromkeys(ins.operands):
                self.consumers[operand].append(ins.name)
        self.entry_by_name = {ins.name: ins for ins in self.entry}
        self.concat_pieces: dict[str, list] = {}
        self.per: dict[tuple[int | None, str], KernelCost] = defaultdict(KernelCost)
        self.thunks: list[Thunk] = []
        self.total = Cost()
        self.split_partials: dict[str, tuple[int, float, tuple[int | None, str]]] = {}

    def run(self) -> TargetModuleCosts:
        """Every executed instruction costed and recorded; the split-K partials last."""
        for ins in self.entry:
            cost = self.model.instruction_cost(ins)
            self.total += cost
            if ins.opcode in _NO_THUNK:
                continue
            op = self._op(ins)
            if ins.opcode == "fusion":
                placed = self._fusion(ins, cost, op)
                if placed is None:  # a weight concatenation, recorded whole
                    continue
                keys, temporary = placed
            else:
                keys, temporary = self._instruction(ins, cost, op)
            self._record(ins, cost, keys, temporary)
        for _, partial_bytes, key in self.split_partials.values():
            # written by the GEMM, read by the reduction that follows
            self.per[key].split_k_bytes += 2 * partial_bytes
        return TargetModuleCosts(dict(self.per), self.thunks, self.total)

    def _named(self, name: str) -> bool:
        op = self.fused.get(name)
        return bool(op) and not set(op.kernels) <= {UNNAMED, kernels.OTHER}

    def _consumer_op(self, name: str):
        """The first instruction downstream that names a kernel: an unnamed move (a prefetch,
        a padding copy, a layout copy) serves it."""
        seen, frontier = {name}, [name]
        while frontier:
            nxt = []
            for n in frontier:
                for user in self.consumers.get(n, []):
                    if user in seen:
                        continue
                    if self._named(user):
                        return self.fused[user]
                    seen.add(user)
                    nxt.append(user)
            frontier = nxt
        return None

    def _op(self, ins: Instr):
        """The compiled op whose kernels an instruction is counted to (an unnamed one: its
        consumer's)."""
        op = self.fused.get(ins.name)
        if op is not None and not self._named(ins.name):
            op = self._consumer_op(ins.name) or op
        return op

    def _fusion(self, ins: Instr, cost: Cost, op):
        """A fusion split over its kernels (`kvjax.traced.fusion_split`): its keys and what it
        holds apart (split-K partials, a padding or layout copy); None for a concatenation of
        weights, recorded by `_concatenation`."""
        layer = op.layers[0] if op and len(op.layers) == 1 else None
        fallback = (layer, op.kernels[0]) if op and op.kernels[0] != UNNAMED else None
        gemm = is_gemm(ins, self.comps)
        weights = _operand_kernels(ins, self.entry_by_name, self.param_kernel, gemm)
        pieces = _concatenated_weights(ins, self.comps, weights)
        if pieces:  # weights concatenated for a horizontally fused product: each its own
            self._concatenation(ins, cost, pieces)
            return None
        operand_pieces = self._operand_sources(ins, weights)
        keys = split_fusion(
            ins, self.model, self.names, fallback, self.per, weights, operand_pieces
        )
        temporary = None
        split = _split_k(ins, self.model, self.out_elems_by_flops)
        if split:
            key = keys[0] if len(keys) == 1 else fallback or keys[0]
            self.split_partials[ins.name] = (split, self.model._bytes(ins.name), key)
            temporary = f"split-K x{split}"
        elif _only_moves(ins, self.comps):  # it computes nothing: named by its root
            temporary = _MOVE_ROOTS.get(_root_opcode(ins, self.comps))
        return keys, temporary

    def _concatenation(self, ins: Instr, cost: Cost, pieces: list) -> None:
        """A fusion that concatenates weights: its bytes to each weight's kernel by its share."""
        total_n = sum(n for _, n in pieces)
        for key, n in pieces:
            self.per[key].add(bytes_=cost.bytes * n / total_n)
            self.per[key].copy_bytes += cost.bytes * n / total_n
            self.per[key].thunks.add(ins.name)
        self.concat_pieces[ins.name] = pieces
        layers = {lid for (lid, _), _ in pieces if lid is not None}
        names = tuple(dict.fromkeys(k for (_, k), _ in pieces))
        thunk = Thunk(
            ins.name,
            thunk_kind(ins),
            names,
            tuple(sorted(layers)),
            cost.flops,
            cost.bytes,
            "weight concatenation",
        )
        self.thunks.append(thunk)

    def _operand_sources(self, ins: Instr, weights: dict) -> dict:
        """Operands that are split-K partials take their product's kernel (in `weights`); those
        that are concatenated weights, returned, keep each weight's share."""
        operand_pieces = {}
        for i, operand in enumerate(ins.operands):
            source = self.entry_by_name.get(operand)
            while source is not None and source.opcode == "bitcast":
                source = self.entry_by_name.get(source.operands[0])
            if source is not None and source.name in self.split_partials:
                weights[i] = self.split_partials[source.name][2]
            if source is not None and source.name in self.concat_pieces:
                operand_pieces[i] = self.concat_pieces[source.name]
        return operand_pieces

    def _instruction(self, ins: Instr, cost: Cost, op) -> tuple[list, str | None]:
        """An instruction outside any fusion: all of it to its op's first kernel."""
        key = (None, UNNAMED)
        if op and op.kernels:
            key = (op.layers[0] if len(op.layers) == 1 else None, op.kernels[0])
        convert = cost.flops if ins.opcode == "convert" else 0.0
        self.per[key].add(cost.flops, cost.transcendentals, cost.bytes, convert)
        temporary = None
        if ins.opcode == "copy":
            temporary = "layout copy"
        elif ins.opcode in ("copy-start", "copy-done"):
            temporary = "prefetch"
        return [key], temporary

    def _record(self, ins: Instr, cost: Cost, keys: list, temporary: str | None) -> None:
        """The executed instruction as a thunk of its kernels; a copy's bytes held apart."""
        if temporary in ("padding copy", "layout copy"):
            self.per[keys[0]].copy_bytes += cost.bytes
        names = tuple(dict.fromkeys(k for _, k in keys)) or (UNNAMED,)
        for key in keys:
            self.per[key].thunks.add(ins.name)
        layers = tuple(sorted({lid for lid, _ in keys if lid is not None}))
        thunk = Thunk(ins.name, thunk_kind(ins), names, layers, cost.flops, cost.bytes, temporary)
        self.thunks.append(thunk)


def _only_moves(ins: Instr, comps) -> bool:
    """A fusion that computes nothing: it copies, pads or re-lays out its operand."""
    body = comps[CostModel._callee(ins)]
    return all(sub.opcode in _MOVES or sub.opcode == "pad" for sub in body)


def _root_opcode(ins: Instr, comps) -> str:
    body = comps[CostModel._callee(ins)]
    return body[-1].opcode if body else ""


def _split_k(ins: Instr, model: TargetCostModel, out_elems_by_flops) -> int | None:
    """k, when a GEMM fusion computes its product as k partial products (split-K): its dot has
    the FLOPs of a lowered product whose output is k times smaller."""
    if not is_gemm(ins, model.comps):
        return None
    dots = [s for s in model.comps[model._callee(ins)] if s.opcode == "dot"]
    if len(dots) != 1:
        return None
    flops = model.instruction_cost(dots[0]).flops
    elems = _shape_bytes_elems(dots[0].shape)[1]
    if elems in out_elems_by_flops.get(flops, ()):  # a product of the model, whole
        return None
    for lowered in out_elems_by_flops.get(flops, ()):
        if lowered and elems > lowered and elems % lowered == 0:
            return elems // lowered
    return None


def module_totals(text: str, hbm_only: bool = False) -> dict[str, float]:
    """A module's FLOPs and bytes by these rules, keyed as XLA's `cost_analysis()`; "flops"
    without the converts XLA's convention also counts (`convert_flops`, apart)."""
    costs = module_kernel_costs(text, tuple(kernels.REGISTRY), hbm_only=hbm_only)
    converts = sum(c.convert_flops for c in costs.per_kernel.values())
    return {
        "flops": costs.total.flops - converts,
        "convert_flops": converts,
        "bytes accessed": costs.total.bytes,
        "transcendentals": costs.total.transcendentals,
    }


def dumps_thunk(t: Thunk) -> dict:
    return {
        "name": t.name,
        "kind": t.kind,
        "kernels": list(t.kernels),
        "layers": list(t.layers),
        "flops": t.flops,
        "bytes": t.bytes,
        "temporary": t.temporary,
    }


__all__ = ["KernelCost", "TargetModuleCosts", "Thunk", "module_kernel_costs", "thunk_kind"]
