"""Instruction costs of an accelerator's optimized module: the rules XLA's HLO cost analysis
lacks or gets wrong there (kvjax.traced.target_costs attributes them to kernels).

- a cuBLAS / cuBLASLt / cuDNN GEMM custom-call: 2 x output elements x contracted elements (the
  dot dimensions of its backend config); bytes its operands and its first output (the workspace
  it also returns is scratch, not traffic);
- a convolution (XLA:TPU lowers products so, batch axes folded into a dilated window): the
  window taps that land on real input elements, as XLA's HloCostAnalysis counts them;
- a fusion nested in a fusion (Triton's nested GEMMs): its FLOPs too;
- TPU (`hbm_only`): an array whose layout is in memory space n >= 1 (`S(1)` on-chip VMEM, `S(2)`
  sync flags) is not HBM traffic; an asynchronous copy or slice between HBM and VMEM
  (copy-start, slice-start) moves its HBM side once, its -done nothing.
"""

from __future__ import annotations

import math
import re

from kvjax.traced.compiled import CompiledCostModel
from kvjax.traced.hlo import Cost, CostModel, Instr, _shape_bytes_elems

_CUSTOM_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_FUSION_KIND = re.compile(r"kind=(k\w+)")
_BACKEND_KIND = re.compile(r'"kind":"([^"]+)"')
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cudnn$matmul", "__cublas$lt$matmul$f8")
# opcodes this model costs by its own rules, also where they sit inside a fusion
# A kvjax Pallas kernel names its closed-form cost (`kvjax.nn.flash.supplied_name`): the Triton
# and Mosaic GPU lowerings drop `pl.CostEstimate`, so the name carries it to the module.
SUPPLIED_COST = re.compile(r"kvjax_\w+?_f(\d+)_b(\d+)")
OWN_RULES = ("fusion", "convolution", "custom-call", "reduce-window")
_ON_CHIP = re.compile(r"S\(([1-9])\)")


def _dims_of(shape: str) -> list[int]:
    m = re.search(r"\[([0-9,]*)\]", shape)
    return [int(d) for d in m.group(1).split(",") if d] if m and m.group(1) else []


def _first_array(shape: str) -> str:
    """The first array of a (possibly tuple) shape string."""
    m = re.search(r"[a-z][a-z0-9]*\[[0-9,]*\](\{[^}]*\})?", shape)
    return m.group(0) if m else shape


def thunk_kind(ins: Instr) -> str:
    """What runs an instruction: `kLoop fusion`, `triton gemm fusion`, `__cublas$lt$matmul`..."""
    if ins.opcode == "custom-call":
        m = _CUSTOM_TARGET.search(ins.attrs)
        return m.group(1) if m else "custom-call"
    if ins.opcode == "fusion":
        kind = _FUSION_KIND.search(ins.attrs)
        kind = kind.group(1) if kind else "?"
        backend = _BACKEND_KIND.search(ins.attrs)
        if kind == "kCustom" and backend:
            return f"kCustom {backend.group(1)}"
        return f"{kind} fusion"
    return ins.opcode


def is_gemm(ins: Instr, comps) -> bool:
    if ins.opcode == "custom-call":
        return thunk_kind(ins) in _GEMM_TARGETS
    if ins.opcode != "fusion":
        return ins.opcode in ("dot", "convolution")
    kind = thunk_kind(ins)
    return "gemm" in kind or "kOutput" in kind and _has(ins, comps, ("dot", "convolution"))


def _has(ins: Instr, comps, opcodes) -> bool:
    body = comps.get(CostModel._callee(ins), [])
    return any(
        sub.opcode in opcodes or (sub.opcode == "fusion" and _has(sub, comps, opcodes))
        for sub in body
    )


class TargetCostModel(CompiledCostModel):
    """`CompiledCostModel` with GEMM custom-calls, nested fusions and on-chip memory spaces."""

    def __init__(self, module, hbm_only: bool = False):
        super().__init__(module)
        self.hbm_only = hbm_only

    def _shape_bytes(self, shape: str) -> float:
        return hbm_bytes(shape) if self.hbm_only else super()._shape_bytes(shape)

    def instruction_cost(self, ins: Instr) -> Cost:
        if ins.opcode == "custom-call" and thunk_kind(ins) in _GEMM_TARGETS:
            return self.gemm_custom_call_cost(ins)
        supplied = SUPPLIED_COST.search(ins.op_name) if ins.opcode == "custom-call" else None
        if supplied:  # a kvjax Pallas kernel (Triton/Mosaic): XLA cannot count inside it
            return Cost(float(supplied.group(1)), 0.0, float(supplied.group(2)))
        if ins.opcode == "convolution":
            return self.convolution_cost(ins)
        if ins.opcode == "reduce-window" and self._whole_row_window(ins):
            # XLA:TPU writes a row's max broadcast back as a window spanning the padded row:
            # the work is one reducer step an element, not (window - 1) an output (XLA's
            # generic rule, 4094x more at S = 2048; XLA:TPU's own cost analysis counts ~0)
            cost = CostModel.instruction_cost(self, ins)
            sub = self.computation_cost(self._callee(ins))
            elems = _shape_bytes_elems(ins.shape)[1]
            return Cost(sub.flops * elems, sub.transcendentals * elems, cost.bytes)
        cost = super().instruction_cost(ins)
        if ins.opcode == "fusion":  # fused fusions (Triton's nested GEMMs): their FLOPs too
            body = self.comps[self._callee(ins)]
            for sub in body:
                if sub.opcode in OWN_RULES:
                    inner = self.instruction_cost(sub)
                    base = CostModel.instruction_cost(self, sub)
                    cost.flops += inner.flops - base.flops
                    cost.transcendentals += inner.transcendentals - base.transcendentals
        if self.hbm_only and ins.opcode in ("copy-start", "slice-start"):
            # an asynchronous move between HBM and on-chip memory: the HBM side, once (both
            # sides in HBM: read and written)
            arrays = _arrays(ins.shape)
            moved = arrays[:2] if ins.opcode == "copy-start" else arrays[1:2]
            sizes = [_shape_bytes_elems(a)[0] for a in moved if not _ON_CHIP.search(a)]
            if ins.opcode == "slice-start":  # the slice read from HBM (+ written, if to HBM)
                sizes += [_shape_bytes_elems(a)[0] for a in moved if _ON_CHIP.search(a)]
            cost.bytes = float(sum(sizes)) if sizes else 0.0
        elif self.hbm_only and ins.opcode in ("copy-done", "slice-done"):
            cost.bytes = 0.0
        return cost

    def _whole_row_window(self, ins: Instr) -> bool:
        """A reduce-window whose every window spans its whole input along each reduced axis."""
        m = re.search(r"window=\{size=([0-9x]+)", ins.attrs)
        dims = _dims_of(self.shapes[ins.operands[0]])
        if not m or not dims:
            return False
        sizes = [int(d) for d in m.group(1).split("x")]
        return any(w > 1 for w in sizes) and all(
            w == 1 or w >= 2 * n - 1 for w, n in zip(sizes, dims, strict=False)
        )

    def gemm_custom_call_cost(self, ins: Instr) -> Cost:
        out = _first_array(ins.shape)
        out_elems = _shape_bytes_elems(out)[1]
        out_bytes = self._shape_bytes(out)
        lhs = _dims_of(self.shapes[ins.operands[0]])
        contracted = 1
        m = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', ins.attrs)
        if m:
            contracted = math.prod(lhs[int(d.strip('" '))] for d in m.group(1).split(",") if d)
        operands = sum(self._bytes(o) for o in ins.operands[:2] if o in self.shapes)
        bias = sum(self._bytes(o) for o in ins.operands[2:] if o in self.shapes)
        return Cost(2.0 * out_elems * contracted, 0.0, operands + bias + out_bytes)

    def convolution_cost(self, ins: Instr) -> Cost:
        """A convolution (XLA:TPU lowers products so, batch axes folded into a dilated window):
        2 x input features x, over the output, the window taps that land on real input
        elements (not padding, not a dilation's holes), as XLA's HloCostAnalysis counts."""
        out_elems = _shape_bytes_elems(ins.shape)[1]
        out_bytes = self._shape_bytes(ins.shape)
        labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attrs)
        lhs = _dims_of(self.shapes[ins.operands[0]])
        rhs = _dims_of(self.shapes[ins.operands[1]])
        out = _dims_of(ins.shape)
        operand_bytes = sum(self._bytes(o) for o in ins.operands if o in self.shapes)
        if not labels:
            return Cost(0.0, 0.0, operand_bytes + out_bytes)
        lhs_l, rhs_l, out_l = labels.groups()
        in_features = rhs[rhs_l.index("i")]
        spatial = [c for c in out_l if c.isdigit()]
        window = _window(ins.attrs, len(spatial))
        taps = 1.0
        non_spatial = out_elems
        for n, c in enumerate(spatial):
            out_size = out[out_l.index(c)]
            non_spatial /= max(1, out_size)
            taps *= _valid_taps(lhs[lhs_l.index(c)], out_size, **window[n])
        return Cost(2.0 * non_spatial * taps * in_features, 0.0, operand_bytes + out_bytes)


def _window(attrs: str, rank: int) -> list[dict[str, int]]:
    """Per spatial dimension: size, stride, padding (low), lhs and rhs dilation."""
    m = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(part.split("=", 1) for part in m.group(1).split()) if m else {}

    def per_dim(key: str, default: int) -> list[int]:
        if key not in fields:
            return [default] * rank
        return [int(v) for v in fields[key].split("x")]

    pads = [0] * rank
    if "pad" in fields:
        pads = [int(p.split("_")[0]) for p in fields["pad"].split("x")]
    size, stride = per_dim("size", 1), per_dim("stride", 1)
    lhs_dilate, rhs_dilate = per_dim("lhs_dilate", 1), per_dim("rhs_dilate", 1)
    return [
        {
            "size": size[i],
            "stride": stride[i],
            "pad_low": pads[i],
            "lhs_dilate": lhs_dilate[i],
            "rhs_dilate": rhs_dilate[i],
        }
        for i in range(rank)
    ]


def _valid_taps(in_size, out_size, size, stride, pad_low, lhs_dilate, rhs_dilate) -> int:
    """Window taps over every output position that read a real input element."""
    dilated = (in_size - 1) * lhs_dilate + 1 if in_size else 0
    count = 0
    for o in range(out_size):
        for k in range(size):
            pos = o * stride + k * rhs_dilate - pad_low
            if 0 <= pos < dilated and pos % lhs_dilate == 0:
                count += 1
    return count


def _arrays(shape: str) -> list[str]:
    """Each array of a shape string, with its layout (tuples flattened)."""
    return re.findall(r"[a-z][a-z0-9]*\[[0-9,]*\](?:\{[^{}]*(?:\([^)]*\)[^{}]*)*\})?", shape)


def hbm_bytes(shape: str) -> float:
    """Bytes of a shape's arrays held in HBM (a layout's S(n), n >= 1: on-chip memory)."""
    return float(sum(_shape_bytes_elems(a)[0] for a in _arrays(shape) if not _ON_CHIP.search(a)))
