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
from kvjax.traced.fusion_scopes import (
    _computing_user,
    _concatenated_weights,
    _inner_kernels,
    _kernel,
    _operand_kernels,
    _param_sources,
    _producer,
    _product_pieces,
)
from kvjax.traced.hlo import Cost, CostModel, Instr, _shape_bytes_elems, parse_hlo
from kvjax.traced.target_rules import OWN_RULES, TargetCostModel, is_gemm, thunk_kind


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


def module_kernel_costs(
    text: str,
    kernel_names: tuple[str, ...],
    param_kernel=None,
    lowered_text: str | None = None,
    hbm_only: bool = False,
) -> TargetModuleCosts:
    """Per (layer, kernel) costs and the executed instructions of an optimized module."""
    module = parse_hlo(_normalize(text))
    model = TargetCostModel(module, hbm_only=hbm_only)
    comps = module.computations
    entry = comps[module.entry]
    fused = {op.name: op for op in compiled_ops(text, kernel_names, param_kernel, lowered_text)}
    products = lowered_products(lowered_text, kernel_names) if lowered_text else {}
    out_elems_by_flops: dict[float, set[int]] = defaultdict(set)
    for flops, elems in products:
        out_elems_by_flops[flops].add(elems)
    consumers: dict[str, list[str]] = defaultdict(list)
    for ins in entry:
        for operand in dict.fromkeys(ins.operands):
            consumers[operand].append(ins.name)

    def named(name: str) -> bool:
        op = fused.get(name)
        return bool(op) and not set(op.kernels) <= {UNNAMED, kernels.OTHER}

    def consumer_op(name: str):
        """The first instruction downstream that names a kernel: an unnamed move (a prefetch,
        a padding copy, a layout copy) serves it."""
        seen, frontier = {name}, [name]
        while frontier:
            nxt = []
            for n in frontier:
                for user in consumers.get(n, []):
                    if user in seen:
                        continue
                    if named(user):
                        return fused[user]
                    seen.add(user)
                    nxt.append(user)
            frontier = nxt
        return None

    entry_by_name = {ins.name: ins for ins in entry}
    concat_pieces: dict[str, list] = {}
    per: dict[tuple[int | None, str], KernelCost] = defaultdict(KernelCost)
    thunks: list[Thunk] = []
    total = Cost()
    split_partials: dict[str, tuple[int, float, tuple[int | None, str]]] = {}
    for ins in entry:
        cost = model.instruction_cost(ins)
        total += cost
        if ins.opcode in _NO_THUNK:
            continue
        op = fused.get(ins.name)
        if op is not None and not named(ins.name):
            op = consumer_op(ins.name) or op
        layer = op.layers[0] if op and len(op.layers) == 1 else None
        fallback = (layer, op.kernels[0]) if op and op.kernels[0] != UNNAMED else None
        temporary = None
        if ins.opcode == "fusion":
            weights = _operand_kernels(ins, entry_by_name, param_kernel, is_gemm(ins, comps))
            pieces = _concatenated_weights(ins, comps, weights)
            if pieces:  # weights concatenated for a horizontally fused product: each its own
                total_n = sum(n for _, n in pieces)
                for key, n in pieces:
                    per[key].add(bytes_=cost.bytes * n / total_n)
                    per[key].copy_bytes += cost.bytes * n / total_n
                    per[key].thunks.add(ins.name)
                concat_pieces[ins.name] = pieces
                layers = {lid for (lid, _), _ in pieces if lid is not None}
                thunks.append(Thunk(ins.name, thunk_kind(ins),
                                    tuple(dict.fromkeys(k for (_, k), _ in pieces)),
                                    tuple(sorted(layers)), cost.flops, cost.bytes,
                                    "weight concatenation"))  # fmt: skip
                continue
            operand_pieces = {}
            for i, operand in enumerate(ins.operands):  # split-K partials: their product's
                source = entry_by_name.get(operand)
                while source is not None and source.opcode == "bitcast":
                    source = entry_by_name.get(source.operands[0])
                if source is not None and source.name in split_partials:
                    weights[i] = split_partials[source.name][2]
                if source is not None and source.name in concat_pieces:
                    operand_pieces[i] = concat_pieces[source.name]
            keys = _split_fusion(ins, model, kernel_names, fallback, per, weights, operand_pieces)
            split = _split_k(ins, model, out_elems_by_flops)
            if split:
                key = keys[0] if len(keys) == 1 else fallback or keys[0]
                split_partials[ins.name] = (split, model._bytes(ins.name), key)
                temporary = f"split-K x{split}"
            elif _only_moves(ins, comps) and _root_opcode(ins, comps) == "pad":
                temporary = "padding copy"
            elif _only_moves(ins, comps) and _root_opcode(ins, comps) in ("copy", "transpose"):
                temporary = "layout copy"
        else:
            keys = (
                [
                    (lid if len(op.layers) <= 1 else None, k)
                    for k in op.kernels
                    for lid in (op.layers or (None,))
                ][:1]
                if op
                else []
            )
            key = keys[0] if keys else (None, UNNAMED)
            per[key].add(cost.flops, cost.transcendentals, cost.bytes,
                         cost.flops if ins.opcode == "convert" else 0.0)  # fmt: skip
            keys = [key]
            if ins.opcode == "copy":
                temporary = "layout copy"
            elif ins.opcode in ("copy-start", "copy-done"):
                temporary = "prefetch"
        if temporary in ("padding copy", "layout copy"):
            per[keys[0]].copy_bytes += cost.bytes
        names = tuple(dict.fromkeys(k for _, k in keys)) or (UNNAMED,)
        for key in keys:
            per[key].thunks.add(ins.name)
        layers = tuple(sorted({lid for lid, _ in keys if lid is not None}))
        thunks.append(Thunk(ins.name, thunk_kind(ins), names, layers, cost.flops, cost.bytes,
                            temporary))  # fmt: skip
    for _, partial_bytes, key in split_partials.values():
        per[key].split_k_bytes += 2 * partial_bytes  # written by the GEMM, read by the reduce
    return TargetModuleCosts(dict(per), thunks, total)


def _nested_converts(ins: Instr, model: TargetCostModel) -> float:
    """The FLOPs XLA counts for the converts inside a fusion, nested fusions included."""
    total = 0.0
    for sub in model.comps[model._callee(ins)]:
        if sub.opcode == "convert":
            total += _shape_bytes_elems(sub.shape)[1]
        elif sub.opcode == "fusion":
            total += _nested_converts(sub, model)
    return total


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


def _split_fusion(
    ins, model: TargetCostModel, names, fallback, per, weights=None, operand_pieces=None
) -> list:
    """Add a fusion's costs to per[(layer, kernel)], split by its instructions' kernels; the
    keys it touched, the one computing most first. `weights`: operand index -> the kernel whose
    weight it is (its read, and a product without metadata that reads it, go to that kernel)."""
    body = model.comps[model._callee(ins)]
    by_name = {sub.name: sub for sub in body}
    kinds = _inner_kernels(body, names, fallback)
    weights = weights or {}
    param_keys = {sub.name: weights[int(sub.operands[0])] for sub in body
                  if sub.opcode == "parameter" and int(sub.operands[0]) in weights}  # fmt: skip
    param_pieces = {sub.name: (operand_pieces or {})[int(sub.operands[0])] for sub in body
                    if sub.opcode == "parameter"
                    and int(sub.operands[0]) in (operand_pieces or {})}  # fmt: skip
    touched: dict[tuple, float] = defaultdict(float)
    whole = model.instruction_cost(ins)
    inner_flops = 0.0
    for sub in body:
        if sub.opcode in OWN_RULES:
            c = model.instruction_cost(sub)
        else:
            c = CostModel.instruction_cost(model, sub)
        key = kinds[sub.name]
        pieces = (_product_pieces(sub, by_name, param_keys, param_pieces)
                  if sub.opcode == "dot" else [])  # fmt: skip
        if sub.opcode == "dot" and not _kernel(sub.op_name, names):
            # a product whose metadata XLA dropped: the kernel of the weight it reads
            read = [param_keys[o] for o in _param_sources(sub, by_name) if o in param_keys]
            key = read[0] if read else key
        if pieces:
            total = sum(n for _, n in pieces)
            for piece_key, n in pieces:
                per[piece_key].add(c.flops * n / total)
                touched[piece_key] += c.flops * n / total
            inner_flops += c.flops
            continue
        convert = c.flops if sub.opcode == "convert" else 0.0
        if sub.opcode == "fusion":  # the converts of a fusion nested in this one
            convert = _nested_converts(sub, model)
        per[key].add(c.flops, c.transcendentals, 0.0, convert)
        inner_flops += c.flops
        touched[key] += c.flops + c.transcendentals
    users: dict[str, list[str]] = defaultdict(list)
    for sub in body:
        for o in dict.fromkeys(sub.operands):
            users[o].append(sub.name)
    read_total = 0.0
    for sub in body:
        if sub.opcode != "parameter":
            continue
        size = model._parameter_read_bytes(sub, [by_name[u] for u in users[sub.name]])
        user = _computing_user(sub.name, users, by_name)
        key = kinds[user] if user else kinds[_producer(body[-1].name, by_name)]
        key = param_keys.get(sub.name, key)  # a weight's read is its kernel's
        per[key].add(bytes_=size)
        touched[key] += 0.0
        read_total += size
    root = body[-1]
    outputs = [by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]
    for o in outputs:
        size = model._bytes(o.operands[1]) if o.opcode == "dynamic-update-slice" else model._bytes(
            o.name)  # fmt: skip
        producer = by_name[_producer(o.name, by_name)]
        pieces = (_product_pieces(producer, by_name, param_keys, param_pieces)
                  if producer.opcode == "dot" else [])  # fmt: skip
        total = sum(n for _, n in pieces)
        for piece_key, n in pieces:  # a horizontally fused product writes each one's output
            per[piece_key].add(bytes_=size * n / total)
        if not pieces:
            per[kinds[producer.name]].add(bytes_=size)
            touched[kinds[producer.name]] += 0.0
    # large constants and anything the rules above do not place: to the heaviest kernel
    placed = read_total + sum(
        model._bytes(o.operands[1]) if o.opcode == "dynamic-update-slice" else model._bytes(o.name)
        for o in outputs
    )
    keys = sorted(touched, key=lambda k: -touched[k]) or [fallback or (None, UNNAMED)]
    if abs(whole.bytes - placed) > 0.5:
        per[keys[0]].add(bytes_=whole.bytes - placed)
    if abs(whole.flops - inner_flops) > 0.5:
        per[keys[0]].add(flops=whole.flops - inner_flops)
    return keys


def module_totals(text: str, hbm_only: bool = False) -> dict[str, float]:
    """A module's FLOPs and bytes by these rules, keyed as XLA's `cost_analysis()`; "flops"
    without the converts XLA's convention also counts (`convert_flops`, apart)."""
    costs = module_kernel_costs(text, tuple(kernels.REGISTRY), hbm_only=hbm_only)
    converts = sum(c.convert_flops for c in costs.per_kernel.values())
    return {"flops": costs.total.flops - converts, "convert_flops": converts,
            "bytes accessed": costs.total.bytes,
            "transcendentals": costs.total.transcendentals}  # fmt: skip


def dumps_thunk(t: Thunk) -> dict:
    return {"name": t.name, "kind": t.kind, "kernels": list(t.kernels), "layers": list(t.layers),
            "flops": t.flops, "bytes": t.bytes, "temporary": t.temporary}  # fmt: skip


__all__ = ["KernelCost", "TargetModuleCosts", "Thunk", "module_kernel_costs", "thunk_kind"]
