"""Per-instruction cost of a pre-optimization HLO module, attributed by `jax.named_scope`.

XLA's `cost_analysis()` gives one figure per module. To split it by kernel, this module parses
the module's HLO text (`lowered.as_text(dialect="hlo", debug_info=True)`, public API), costs
every instruction with the rules of XLA's HloCostAnalysis, and groups instructions by the
`op_name` metadata the named scopes leave. The sum over instructions is checked against XLA's
own whole-module figure (`kvjax.traced.step`), so a rule that drifted from XLA's shows up at once.

The rules (xla/service/hlo_cost_analysis.cc), for the opcodes a jax decoder lowers to:
- bytes accessed: operands + output, except: parameter, constant, get-tuple-element, bitcast,
  transpose: 0; tuple: 8 bytes (a pointer) per element; slice: 2 x output; dynamic-slice:
  2 x output + the first start index; dynamic-update-slice: 2 x update + the first start index;
  gather: 2 x output + indices; scatter: 3 x updates + indices;
  call: the callee's own total; while: (condition + body) x the trip count (below).
- flops: elementwise ops one per output element (transcendental opcodes count as
  transcendentals instead); dot 2 x output elements x contracted elements; reduce: the
  reducer's cost x (input elements - output elements); scatter: the combiner's x updates.

Loops: XLA's HloCostAnalysis counts a `while` as its condition and body once, whatever the trip
count. A `jax.lax.scan` (or `fori_loop`) lowers to a while whose tuple starts with a counter from
a constant, tested `counter < constant` by the condition: kvjax reads that trip count n and costs
the loop n x (condition + body), which is what runs; `CostModel(module, trips=False)` (and
`attribute(..., trips=False)`) counts as XLA does, to check the module against XLA's own figure.
A while of any other shape raises: a loop kvjax cannot count is not costed as if it ran once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from kvjax import kernels
from kvjax.errors import KvjaxError

# Bytes per element of every XLA primitive type (xla_data.proto); sub-byte types are fractional.
HLO_DTYPE_BYTES = {
    "pred": 1,
    "token": 0,
    "s1": 1 / 8,
    "u1": 1 / 8,
    "s2": 0.25,
    "u2": 0.25,
    "s4": 0.5,
    "u4": 0.5,
    "f4e2m1fn": 0.5,
    "s8": 1,
    "u8": 1,
    "f8e5m2": 1,
    "f8e4m3": 1,
    "f8e4m3fn": 1,
    "f8e4m3b11fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e3m4": 1,
    "f8e8m0fnu": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}


def hlo_dtype_bytes(dtype: str) -> float:
    """Bytes per element of an HLO type name (`bf16`, `f8e4m3fn`, `s4`); unknown names raise
    rather than being guessed, so a new type cannot be silently mis-sized."""
    if dtype not in HLO_DTYPE_BYTES:
        raise KvjaxError(
            f"HLO type {dtype!r} has no known size; known: {', '.join(HLO_DTYPE_BYTES)}"
        )
    return HLO_DTYPE_BYTES[dtype]


_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTR = re.compile(r"^\s*(ROOT\s+)?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_COMP = re.compile(r"^(ENTRY\s+)?([\w.\-]+)\s*(\([^)]*\)\s*->\s*.*)?\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TO_APPLY = re.compile(r"(?:to_apply|calls)=([\w.\-]+)")

TRANSCENDENTAL = {
    "exponential",
    "exponential-minus-one",
    "log",
    "log-plus-one",
    "logistic",
    "power",
    "sqrt",
    "cbrt",
    "rsqrt",
    "tanh",
    "sine",
    "cosine",
    "tan",
    "atan2",
    "erf",
}
ELEMENTWISE = TRANSCENDENTAL | {
    "add",
    "subtract",
    "multiply",
    "divide",
    "remainder",
    "maximum",
    "minimum",
    "negate",
    "abs",
    "sign",
    "floor",
    "ceil",
    "round-nearest-afz",
    "round-nearest-even",
    "compare",
    "select",
    "clamp",
    "and",
    "or",
    "xor",
    "not",
    "shift-left",
    "shift-right-logical",
    "shift-right-arithmetic",
    "convert",
    "is-finite",
    "exponential-minus-one",
}
# XLA counts a transpose as a bitcast, no bytes (checked in tests/test_traced_hlo.py).
ZERO_BYTES = {"parameter", "constant", "get-tuple-element", "bitcast", "after-all", "transpose"}
POINTER_BYTES = 8  # a tuple is counted as one pointer per element


def _shape_bytes_elems(shape: str) -> tuple[float, int]:
    """(bytes, elements) of an HLO shape string; tuples sum their arrays."""
    total_bytes, total_elems = 0.0, 0
    for dtype, dims in _ARRAY.findall(shape.split("{")[0] if "(" not in shape else shape):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total_bytes += n * hlo_dtype_bytes(dtype)
        total_elems += n
    return total_bytes, total_elems


def _constant(ins: Instr | None) -> int | None:
    """The value of an integer scalar `constant(N)` instruction, else None."""
    if ins is None or ins.opcode != "constant" or "[]" not in ins.shape:
        return None
    m = re.fullmatch(r"-?\d+", ins.operands[0]) if len(ins.operands) == 1 else None
    return int(m.group(0)) if m else None


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    if not m or not m.group(2):
        return []
    return [int(d) for d in m.group(2).split(",")]


@dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str
    op_name: str


@dataclass
class Cost:
    flops: float = 0.0
    transcendentals: float = 0.0
    bytes: float = 0.0

    def __iadd__(self, other: Cost) -> Cost:
        self.flops += other.flops
        self.transcendentals += other.transcendentals
        self.bytes += other.bytes
        return self


@dataclass
class HloModule:
    computations: dict[str, list[Instr]] = field(default_factory=dict)
    entry: str = ""


def _split_operands(text: str) -> tuple[list[str], str]:
    """The operand names inside the opcode's parentheses, and the attributes after them."""
    depth, i = 1, 0
    while i < len(text) and depth:
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
        i += 1
    inside, attrs = text[: i - 1], text[i:]
    operands = []
    for part in re.split(r",\s*(?![^{]*\})", inside):
        part = part.strip()
        if not part:
            continue
        # "f32[2]{0} name" in some printers; the name is the last token
        operands.append(part.split()[-1].lstrip("%"))
    return operands, attrs


def parse_hlo(text: str) -> HloModule:
    module = HloModule()
    current: list[Instr] | None = None
    for line in text.splitlines():
        if current is None:
            m = _COMP.match(line.strip()) if line and not line.startswith(" ") else None
            if m and not line.startswith("HloModule"):
                name = m.group(2)
                current = module.computations.setdefault(name, [])
                if m.group(1):
                    module.entry = name
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        _, name, shape, opcode, rest = m.groups()
        operands, attrs = _split_operands(rest)
        op = _OP_NAME.search(attrs)
        current.append(Instr(name, shape, opcode, operands, attrs, op.group(1) if op else ""))
    if not module.entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return module


class CostModel:
    """Costs instructions of one parsed module (with memoised sub-computations)."""

    def __init__(self, module: HloModule, trips: bool = True):
        self.module, self.trips = module, trips
        self.shapes = {ins.name: ins.shape for comp in module.computations.values() for ins in comp}
        self._comp_cost: dict[str, Cost] = {}
        self._by_name = {ins.name: ins for comp in module.computations.values() for ins in comp}
        self._roots = {name: comp[-1] for name, comp in module.computations.items() if comp}

    def computation_cost(self, name: str) -> Cost:
        if name not in self._comp_cost:
            total = Cost()
            for ins in self.module.computations[name]:
                total += self.instruction_cost(ins)
            self._comp_cost[name] = total
        return self._comp_cost[name]

    def _bytes(self, name: str) -> float:
        return self._shape_bytes(self.shapes[name])

    def _shape_bytes(self, shape: str) -> float:
        """Bytes of a shape as this model counts them (all of it, here)."""
        return _shape_bytes_elems(shape)[0]

    def instruction_cost(self, ins: Instr) -> Cost:
        out_elems = _shape_bytes_elems(ins.shape)[1]
        out_bytes = self._shape_bytes(ins.shape)
        operand_bytes = sum(self._bytes(o) for o in ins.operands if o in self.shapes)
        op = ins.opcode
        c = Cost(bytes=out_bytes + operand_bytes)
        if op in ZERO_BYTES:
            c.bytes = 0.0
        elif op == "tuple":
            c.bytes = POINTER_BYTES * len(ins.operands)
        elif op == "call":
            return Cost(**vars(self.computation_cost(self._callee(ins))))
        elif op == "while":
            return self._while_cost(ins)
        elif op in ELEMENTWISE:
            if op in TRANSCENDENTAL:
                c.transcendentals = out_elems
            else:
                c.flops = out_elems
        elif op == "dot":
            lhs = _dims(self.shapes[ins.operands[0]])
            m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins.attrs)
            contracted = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 1
            c.flops = 2 * out_elems * contracted
        elif op in ("reduce", "reduce-window"):
            sub = self.computation_cost(self._callee(ins))
            window = re.search(r"window=\{size=([0-9x]+)", ins.attrs)
            if window:  # (window elements - 1) per output; a padded window counts its padding
                count = (math.prod(int(d) for d in window.group(1).split("x")) - 1) * out_elems
            else:
                count = _shape_bytes_elems(self.shapes[ins.operands[0]])[1] - out_elems
            c.flops, c.transcendentals = sub.flops * count, sub.transcendentals * count
        elif op == "slice":
            c.bytes = 2 * out_bytes
        elif op == "dynamic-slice":  # XLA counts the first start index only
            c.bytes = 2 * out_bytes + self._bytes(ins.operands[1])
        elif op == "dynamic-update-slice":
            c.bytes = 2 * self._bytes(ins.operands[1]) + self._bytes(ins.operands[2])
        elif op == "gather":
            c.bytes = 2 * out_bytes + self._bytes(ins.operands[1])
        elif op == "scatter":
            n = len(ins.operands) // 2
            updates = sum(self._bytes(o) for o in ins.operands[n + 1 :])
            c.bytes = 3 * updates + self._bytes(ins.operands[n])
            sub = self.computation_cost(self._callee(ins))
            elems = _shape_bytes_elems(self.shapes[ins.operands[n + 1]])[1]
            c.flops, c.transcendentals = sub.flops * elems, sub.transcendentals * elems
        return c

    def _while_cost(self, ins: Instr) -> Cost:
        """n x (condition + body) for a scan-shaped while (see the module docstring)."""
        cond = re.search(r"condition=([\w.\-]+)", ins.attrs)
        body = re.search(r"body=([\w.\-]+)", ins.attrs)
        if not cond or not body:
            raise ValueError(f"while {ins.name} names no condition/body")
        once = Cost()
        once += self.computation_cost(cond.group(1))
        once += self.computation_cost(body.group(1))
        n = self.trip_count(ins, cond.group(1)) if self.trips else 1
        return Cost(*(x * n for x in (once.flops, once.transcendentals, once.bytes)))

    def trip_count(self, ins: Instr, cond: str) -> int:
        """A scan's trip count: the condition's root is `compare(gte(param, i), constant(N)),
        direction=LT` and element i of the while's initial tuple is a constant c: N - c."""
        root = self._roots[cond]
        why = f"while {ins.name}: not a counted loop (kvjax costs scan-shaped whiles only)"
        if root.opcode != "compare" or "direction=LT" not in root.attrs:
            raise ValueError(why)
        counter, limit = (self._by_name.get(o) for o in root.operands[:2])
        if counter is None or counter.opcode != "get-tuple-element" or limit is None:
            raise ValueError(why)
        index = int(re.search(r"index=(\d+)", counter.attrs).group(1))
        init = self._by_name.get(ins.operands[0])
        start = self._by_name.get(init.operands[index]) if init and init.opcode == "tuple" else None
        values = [_constant(x) for x in (limit, start)]
        if None in values:
            raise ValueError(why)
        return max(0, values[0] - values[1])

    @staticmethod
    def _callee(ins: Instr) -> str:
        m = _TO_APPLY.search(ins.attrs)
        if not m:
            raise ValueError(f"{ins.opcode} {ins.name} names no computation")
        return m.group(1)

    def entry_instructions(self) -> list[tuple[Instr, Cost]]:
        return [
            (ins, self.instruction_cost(ins)) for ins in self.module.computations[self.module.entry]
        ]


def attribute(
    text: str, kernel_names: tuple[str, ...], trips: bool = True
) -> tuple[dict[tuple[int | None, str], Cost], Cost]:
    """Cost per (layer, kernel) from HLO text, and the module total (`trips=False`: loops once
    through, as XLA's own figure counts them).

    An instruction belongs to the longest kernel name found in its op_name path after an
    optional `layer{i}/`; instructions outside every kernel go to `kernels.OTHER`.
    """
    model = CostModel(parse_hlo(text), trips)
    per_kernel: dict[tuple[int | None, str], Cost] = {}
    total = Cost()
    for ins, cost in model.entry_instructions():
        key = kernel_of(ins.op_name, kernel_names)
        per_kernel.setdefault(key, Cost())
        per_kernel[key] += cost
        total += cost
    return per_kernel, total


_LAYER = re.compile(r"(?:^|/)layer(\d+)/")


def kernel_of(op_name: str, kernel_names: tuple[str, ...]) -> tuple[int | None, str]:
    m = _LAYER.search(op_name)
    layer = int(m.group(1)) if m else None
    path = op_name[m.end() :] if m else op_name
    # drop the jit(...) prefix of the step function
    if path.startswith("jit("):
        path = path.split("/", 1)[1] if "/" in path else ""
    for name in sorted(kernel_names, key=len, reverse=True):
        if path == name or path.startswith(name + "/"):
            return layer, name
    return layer, kernels.OTHER
