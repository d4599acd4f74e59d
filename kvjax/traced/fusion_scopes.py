"""Which kernel each instruction inside a fusion computes, from the op metadata the
`jax.named_scope`s leave (they survive fusion on XLA:GPU and XLA:TPU).

An instruction's own metadata names its kernel when it is a scope (`jit(step)/layer0/...`); a
jit argument's name (`cache.v[0]`) says where data came from, not what computes it. Without one,
an instruction takes the kernel of its users inside the fusion, then of its operands, then the
fusion's own. A product XLA fused horizontally (x @ [W_q; W_k; W_v]) is split by the weights it
concatenates.
"""

from __future__ import annotations

from collections import defaultdict

from kvjax import kernels
from kvjax.traced.compiled import _MOVES, UNNAMED
from kvjax.traced.hlo import CostModel, Instr, _shape_bytes_elems, kernel_of


def _kernel(op_name: str, names) -> tuple[int | None, str] | None:
    """The kernel an instruction's metadata names; None for no metadata or a jit argument's
    name (`cache.v[0]`, `state['embed'].value`: where the data came from, not a scope)."""
    if not op_name or not op_name.startswith("jit("):
        return None
    hits = [kernel_of(part, names) for part in op_name.split(";")]
    named = [h for h in hits if h[1] != kernels.OTHER]
    return (named or hits)[0]


def _inner_kernels(body: list[Instr], names, fallback) -> dict[str, tuple[int | None, str]]:
    """The kernel of every instruction of a fusion body: its own metadata, else its users',
    else its operands', else the fusion's (`fallback`)."""
    own = {ins.name: _kernel(ins.op_name, names) for ins in body}
    users: dict[str, list[str]] = defaultdict(list)
    for ins in body:
        for o in ins.operands:
            users[o].append(ins.name)
    by_name = {ins.name: ins for ins in body}
    resolved: dict[str, tuple[int | None, str]] = {}

    def search(start: str, step) -> tuple[int | None, str] | None:
        seen, frontier = {start}, [start]
        while frontier:
            nxt = []
            for name in frontier:
                for other in step(name):
                    if other in seen or other not in by_name:
                        continue
                    if own.get(other):
                        return own[other]
                    seen.add(other)
                    nxt.append(other)
            frontier = nxt
        return None

    for ins in body:
        k = own[ins.name]
        if k is None or (k[1] == kernels.OTHER and fallback):
            k = (
                search(ins.name, lambda n: users[n])
                or search(ins.name, lambda n: by_name[n].operands)
                or fallback
            )
        resolved[ins.name] = k or (None, UNNAMED)
    return resolved


def _param_sources(ins: Instr, by_name) -> list[str]:
    """The fusion parameters an instruction reads, through moves."""
    out = []
    for operand in ins.operands:
        seen = by_name.get(operand)
        while seen is not None and seen.opcode in _MOVES and seen.opcode != "parameter":
            seen = by_name.get(seen.operands[0]) if seen.operands else None
        if seen is not None and seen.opcode == "parameter":
            out.append(seen.name)
    return out


def _computing_user(param: str, body_users, by_name) -> str | None:
    """The first instruction that does more than move `param` (through bitcasts, slices...)."""
    frontier, seen = [param], {param}
    while frontier:
        nxt = []
        for name in frontier:
            for user in body_users[name]:
                if user in seen:
                    continue
                seen.add(user)
                if by_name[user].opcode not in _MOVES:
                    return user
                nxt.append(user)
        frontier = nxt
    return None


def _producer(name: str, by_name) -> str:
    """The instruction whose result an output is, through moves."""
    while by_name[name].opcode in _MOVES and by_name[name].operands:
        if by_name[name].operands[0] not in by_name:
            break
        name = by_name[name].operands[0]
    return name


def _product_pieces(
    dot: Instr, by_name, param_keys: dict[str, tuple], param_pieces: dict | None = None
) -> list[tuple[tuple, int]]:
    """A product XLA fused horizontally (x @ [W_q; W_k; W_v] as one GEMM): the kernels of the
    concatenated weights and each one's elements, so its FLOPs split exactly. The weights are
    concatenated inside the fusion, or before it (`param_pieces`: a fusion parameter that is a
    concatenation made outside, and its pieces)."""
    for operand in dot.operands:
        seen = by_name.get(operand)
        while seen is not None and seen.opcode in ("bitcast", "reshape", "transpose", "copy"):
            seen = by_name.get(seen.operands[0])
        if seen is not None and param_pieces and seen.name in param_pieces:
            return param_pieces[seen.name]
        if seen is None or seen.opcode != "concatenate":
            continue
        pieces = []
        for part in seen.operands:
            p = by_name.get(part)
            while p is not None and p.opcode in ("bitcast", "reshape", "transpose", "copy"):
                p = by_name.get(p.operands[0])
            if p is None or p.name not in param_keys:
                return []
            pieces.append((param_keys[p.name], _shape_bytes_elems(p.shape)[1]))
        if len({k for k, _ in pieces}) > 1:
            return pieces
    return []


def _operand_kernels(ins: Instr, entry_by_name, param_kernel, product: bool) -> dict[int, tuple]:
    """Operand index -> the kernel whose weight (or cache array) that operand is, read through
    the moves between the jit argument and the instruction."""
    out = {}
    if param_kernel is None:
        return out
    for i, operand in enumerate(ins.operands):
        seen = entry_by_name.get(operand)
        while seen is not None and seen.opcode in ("bitcast", "copy", "reshape", "transpose"):
            seen = entry_by_name.get(seen.operands[0])
        if seen is not None and seen.opcode == "parameter" and seen.op_name:
            hit = param_kernel(seen.op_name, product)
            if hit is not None:
                out[i] = hit
    return out


def _concatenated_weights(ins: Instr, comps, weights: dict[int, tuple]) -> list:
    """A fusion that only concatenates weights of different kernels (XLA:GPU builds
    [W_q; W_k; W_v] each step for one GEMM): each weight's kernel and elements."""
    body = comps[CostModel._callee(ins)]
    if (
        not body
        or body[-1].opcode != "concatenate"
        or not all(sub.opcode in _MOVES or sub.opcode == "concatenate" for sub in body)
    ):
        return []
    by_name = {sub.name: sub for sub in body}
    pieces = []
    for part in body[-1].operands:
        p = by_name.get(part)
        while p is not None and p.opcode != "parameter" and p.operands:
            p = by_name.get(p.operands[0])
        if p is None or int(p.operands[0]) not in weights:
            return []
        pieces.append((weights[int(p.operands[0])], _shape_bytes_elems(p.shape)[1]))
    return pieces if len({k for k, _ in pieces}) > 1 else []
