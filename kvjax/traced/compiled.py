"""The compiled module, per instruction and per kernel: what a backend actually executes.

After optimization an HLO module is a list of fusions, library calls and copies. Each top-level
instruction of the ENTRY computation is one thunk that XLA:CPU executes (one CUDA kernel or
library call on a GPU), and its name is the `hlo_op` the profiler reports for it, so this is the
map from a measured event to kernels (`kvjax.measured.profile`).

Costs follow XLA's HloCostAnalysis on the compiled text (checked against the module's own
`cost_analysis()` totals in tests/test_traced_compiled.py):
- a fusion's FLOPs are the sum of its fused instructions' (`kvjax.traced.hlo` rules); its bytes
  are its operands plus its output, except an operand read only through slices (the slices'
  bytes) and an in-place dynamic-update-slice root (the update's bytes, read and written);
- any other instruction as in `kvjax.traced.hlo`.

Kernels: a fusion carries the `op_name`s of every instruction inside it. An instruction's
kernels are the registry names found in them (`kvjax.traced.hlo.kernel_of`); glue (reshapes,
index arithmetic) joins the kernel it is fused with. An instruction XLA created without metadata
(a copy, a rewritten reduction) takes the kernels of the instruction that consumes it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from kvjax import kernels
from kvjax.traced.hlo import Cost, CostModel, Instr, _shape_bytes_elems, kernel_of, parse_hlo

_SLICES = ("slice", "dynamic-slice")
# Instructions that only move or relabel data keep their producer's op_name inside a fusion; the
# kernels a fusion computes are those of its other instructions.
_MOVES = {
    "parameter",
    "constant",
    "bitcast",
    "reshape",
    "broadcast",
    "transpose",
    "copy",
    "slice",
    "dynamic-slice",
    "iota",
    "get-tuple-element",
    "tuple",
    "convert",
}
_NO_THUNK = {"parameter", "constant", "get-tuple-element", "bitcast", "tuple", "after-all"}
UNNAMED = "unnamed"  # an executed instruction that names no kernel, directly or by its consumer


@dataclass(frozen=True)
class CompiledOp:
    """One top-level instruction of a compiled module: an executed thunk."""

    name: str  # the HLO instruction name, == the profiler's `hlo_op`
    opcode: str
    kernels: tuple[str, ...]  # the kernel names it computes (layers dropped), registry order
    layers: tuple[int, ...]
    cost: Cost


class CompiledCostModel(CostModel):
    """`CostModel` with XLA's fusion rules for optimized modules."""

    def __init__(self, module):
        super().__init__(module)
        self.comps = module.computations
        self.by_name = {ins.name: ins for comp in self.comps.values() for ins in comp}

    def instruction_cost(self, ins: Instr) -> Cost:
        if ins.opcode != "fusion":
            return super().instruction_cost(ins)
        body = self.comps[self._callee(ins)]
        if "kind=kCustom" in ins.attrs:  # a library call wrapping a gather or scatter: its own
            for sub in body:
                if sub.opcode in ("gather", "scatter"):
                    return super().instruction_cost(sub)
        inner = Cost()
        for sub in body:
            inner += super().instruction_cost(sub)
        users: dict[str, list[Instr]] = defaultdict(list)
        for sub in body:
            for operand in dict.fromkeys(sub.operands):
                users[operand].append(sub)
        params = [sub for sub in body if sub.opcode == "parameter"]
        params.sort(key=lambda sub: int(sub.operands[0]))  # parameter(i)
        read = sum(self._parameter_read_bytes(p, users[p.name]) for p in params)
        large_constants = sum(
            self._bytes(sub.name)
            for sub in body
            if sub.opcode == "constant" and _shape_bytes_elems(sub.shape)[1] > 1
        )
        root = body[-1]
        outputs = [self.by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]
        written = sum(
            self._bytes(o.operands[1])
            if o.opcode == "dynamic-update-slice"
            else self._bytes(o.name)
            for o in outputs
        )
        return Cost(inner.flops, inner.transcendentals, read + written + large_constants)

    def _parameter_read_bytes(self, param: Instr, users: list[Instr]) -> float:
        """Bytes a fusion reads of one operand: a slice reads what it keeps, a broadcast or
        reshape reads the operand each, every other use shares one read; the buffer a
        dynamic-update-slice updates in place is not read."""
        size, shared = 0.0, False
        whole = self._bytes(param.name)
        for user in users:
            first = user.operands[0] == param.name
            if user.opcode == "slice" or (user.opcode == "dynamic-slice" and first):
                size += self._bytes(user.name)
            elif user.opcode in ("broadcast", "reshape"):
                size += whole
            elif user.opcode == "dynamic-update-slice" and first:
                continue
            elif not shared:
                shared = True
                size += whole
        return size


def _normalize(text: str) -> str:
    """Compiled HLO text prefixes names with '%' and numbers long operand lists with
    `/*index=5*/` comments; the parser takes bare names."""
    return re.sub(r"/\*[^*]*\*/", "", text).replace("%", "")


def _op_names(ins: Instr, comps) -> list[str]:
    """The op_names of an instruction and of everything fused into it (not the shared reducer
    regions, whose metadata is the first layer's)."""
    if ins.opcode != "fusion":
        return [ins.op_name] if ins.op_name else []
    body = comps[CostModel._callee(ins)]
    names = [sub.op_name for sub in body if sub.op_name and sub.opcode not in _MOVES]
    if not names:  # a fusion that only moves data (a transpose, a copy): its root's name
        names = [sub.op_name for sub in body[::-1] if sub.op_name][:1] or [ins.op_name]
    return [n for n in names if n]


def _read_parameters(ins: Instr, by_name: dict[str, Instr]) -> list[str]:
    """The op_names of the jit arguments an instruction reads, through bitcasts and copies."""
    out = []
    for operand in ins.operands:
        seen = by_name.get(operand)
        while seen is not None and seen.opcode in ("bitcast", "copy", "reshape", "transpose"):
            seen = by_name.get(seen.operands[0])
        if seen is not None and seen.opcode == "parameter" and seen.op_name:
            out.append(seen.op_name)
    return out


def _computes_product(ins: Instr, comps) -> bool:
    if ins.opcode == "dot":
        return True
    return ins.opcode == "fusion" and any(
        sub.opcode == "dot" for sub in comps[CostModel._callee(ins)]
    )


def _product_signature(ins: Instr, comps, model: CostModel) -> tuple[float, int] | None:
    """(FLOPs, output elements) of the product an instruction computes (itself, or the one dot
    fused into it): the same in the lowered and the compiled module, whatever the layout."""
    dots = [ins] if ins.opcode == "dot" else []
    if ins.opcode == "fusion":
        dots = [sub for sub in comps[CostModel._callee(ins)] if sub.opcode == "dot"]
    if len(dots) != 1:
        return None
    return model.instruction_cost(dots[0]).flops, _shape_bytes_elems(dots[0].shape)[1]


def lowered_products(lowered_text: str, kernel_names: tuple[str, ...]) -> dict:
    """(FLOPs, output elements) -> the kernels of the lowered module's products of that shape."""
    module = parse_hlo(lowered_text)
    model = CostModel(module)
    out: dict[tuple[float, int], set[str]] = defaultdict(set)
    for comp in module.computations.values():
        for ins in comp:
            if ins.opcode == "dot":
                signature = (model.instruction_cost(ins).flops, _shape_bytes_elems(ins.shape)[1])
                out[signature].add(kernel_of(ins.op_name, kernel_names)[1])
    return out


def compiled_ops(
    text: str,
    kernel_names: tuple[str, ...],
    param_kernel: Callable | None = None,
    lowered_text: str | None = None,
    cost_model: type[CompiledCostModel] | None = None,
) -> list[CompiledOp]:
    """Every executed instruction of the ENTRY computation, its kernels and its cost.

    XLA drops the metadata of some products it rewrites (matrix-vector products, a batch axis
    of size 1). An instruction with no kernel in its metadata is attributed, in turn, by the jit
    arguments it reads (`param_kernel(op_name, is_product)` names their kernel: a weight, a
    cache array); by the one kernel whose product in the lowered module (`lowered_text`) has its
    FLOPs and output size; else by its first consumer's kernels. `cost_model`: the rules to
    cost instructions with (an accelerator's module: `kvjax.traced.target_rules`).
    """
    module = parse_hlo(_normalize(text))
    model = (cost_model or CompiledCostModel)(module)
    entry = module.computations[module.entry]
    order = {name: i for i, name in enumerate(kernels.REGISTRY)}
    found: dict[str, set[tuple[int | None, str]]] = {}
    for ins in entry:
        hits = set()
        for op_name in _op_names(ins, module.computations):
            for part in op_name.split(";"):  # merged metadata is joined with ';'
                hits.add(kernel_of(part, kernel_names))
        named = {h for h in hits if h[1] != kernels.OTHER}
        found[ins.name] = named or hits
    by_name = {ins.name: ins for ins in entry}
    products = lowered_products(lowered_text, kernel_names) if lowered_text else {}
    for ins in entry:
        if param_kernel is None or ins.opcode != "fusion" or not found[ins.name]:
            continue
        dots = [sub for sub in module.computations[CostModel._callee(ins)] if sub.opcode == "dot"]
        if dots and not any(kernel_of(d.op_name, kernel_names)[1] != kernels.OTHER for d in dots):
            # XLA:GPU fuses a product whose metadata it dropped with its neighbours' ops (a
            # norm into a Triton GEMM's prologue): the product is the kernel of its weight
            hits = {param_kernel(name, True) for name in _read_parameters(ins, by_name)}
            found[ins.name] |= {h for h in hits if h is not None}
    for ins in entry:
        if found[ins.name] or ins.opcode in _NO_THUNK:
            continue
        if param_kernel is not None:
            product = _computes_product(ins, module.computations)
            hits = {param_kernel(name, product) for name in _read_parameters(ins, by_name)}
            found[ins.name] = {h for h in hits if h is not None}
        signature = _product_signature(ins, module.computations, model)
        if not found[ins.name] and signature in products and len(products[signature]) == 1:
            found[ins.name] = {(None, next(iter(products[signature])))}
    consumers: dict[str, list[str]] = defaultdict(list)
    for ins in entry:
        for operand in ins.operands:
            consumers[operand].append(ins.name)
    ops = []
    for ins in entry:
        if ins.opcode in _NO_THUNK:
            continue
        hits = found[ins.name]
        if not hits:  # no metadata: the kernels of its first consumer that has some
            for user in consumers.get(ins.name, []):
                if found.get(user):
                    hits = found[user]
                    break
        names = tuple(sorted({k for _, k in hits}, key=lambda k: order.get(k, len(order))))
        layers = tuple(sorted({layer for layer, _ in hits if layer is not None}))
        ops.append(
            CompiledOp(
                ins.name, ins.opcode, names or (UNNAMED,), layers, model.instruction_cost(ins)
            )
        )
    return ops


def module_cost(text: str) -> Cost:
    """The whole module's cost by these rules (every ENTRY instruction, the output tuple too):
    the number XLA's own `cost_analysis()` gives, which tests check."""
    module = parse_hlo(_normalize(text))
    model = CompiledCostModel(module)
    total = Cost()
    for ins in module.computations[module.entry]:
        total += model.instruction_cost(ins)
    return total
