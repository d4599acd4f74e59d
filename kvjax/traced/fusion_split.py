"""A fusion's costs split over the kernels its instructions compute (`kvjax.traced.target_costs`).

Inside one fusion of an accelerator's optimized module: each instruction's FLOPs go to its kernel
(the op metadata the `jax.named_scope`s leave: `kvjax.traced.fusion_scopes`), each parameter's
read to the kernel of the instruction that computes with it (a weight's read to the weight's own
kernel), each output's write to the kernel that produces it. A product XLA fused horizontally
(x @ [W_q; W_k; W_v]) gives each of its products the share of its weights. The fusion's total is
XLA's HloCostAnalysis rule for it (`kvjax.traced.target_rules`); what the rules above leave
unplaced (large constants) goes to the kernel that computes most.
"""

from __future__ import annotations

from collections import defaultdict

from kvjax.traced.compiled import UNNAMED
from kvjax.traced.fusion_scopes import (
    _computing_user,
    _inner_kernels,
    _kernel,
    _param_sources,
    _producer,
    _product_pieces,
)
from kvjax.traced.hlo import CostModel, Instr, _shape_bytes_elems
from kvjax.traced.target_rules import OWN_RULES, TargetCostModel


def split_fusion(
    ins, model: TargetCostModel, names, fallback, per, weights=None, operand_pieces=None
) -> list:
    """Add a fusion's costs to per[(layer, kernel)], split by its instructions' kernels; the
    keys it touched, the one computing most first. `weights`: operand index -> the kernel whose
    weight it is (its read, and a product without metadata that reads it, go to that kernel);
    `operand_pieces`: operand index -> the weights a concatenated operand holds."""
    return FusionSplit(ins, model, names, fallback, per, weights, operand_pieces).run()


class FusionSplit:
    """One fusion's FLOPs, reads and writes added to `per` in turn, then what none placed."""

    def __init__(self, ins, model, names, fallback, per, weights=None, operand_pieces=None):
        self.model, self.names, self.fallback, self.per = model, names, fallback, per
        self.body = model.comps[model._callee(ins)]
        self.by_name = {sub.name: sub for sub in self.body}
        self.kinds = _inner_kernels(self.body, names, fallback)
        weights, operand_pieces = weights or {}, operand_pieces or {}
        params = [sub for sub in self.body if sub.opcode == "parameter"]
        self.param_keys = {
            sub.name: weights[int(sub.operands[0])]
            for sub in params
            if int(sub.operands[0]) in weights
        }
        self.param_pieces = {
            sub.name: operand_pieces[int(sub.operands[0])]
            for sub in params
            if int(sub.operands[0]) in operand_pieces
        }
        self.touched: dict[tuple, float] = defaultdict(float)
        self.whole = model.instruction_cost(ins)

    def run(self) -> list:
        """The steps in order; the keys touched, the one computing most first."""
        inner_flops = self._add_flops()
        read_total = self._add_reads()
        outputs = self._add_writes()
        return self._add_remainder(inner_flops, read_total, outputs)

    def _pieces(self, sub: Instr) -> list:
        """The (key, share) of each product a horizontally fused product computes; [] else."""
        if sub.opcode != "dot":
            return []
        return _product_pieces(sub, self.by_name, self.param_keys, self.param_pieces)

    def _add_flops(self) -> float:
        """Each instruction's FLOPs (and converts) to its kernel; their sum."""
        inner_flops = 0.0
        for sub in self.body:
            if sub.opcode in OWN_RULES:
                c = self.model.instruction_cost(sub)
            else:
                c = CostModel.instruction_cost(self.model, sub)
            key = self.kinds[sub.name]
            pieces = self._pieces(sub)
            if sub.opcode == "dot" and not _kernel(sub.op_name, self.names):
                # a product whose metadata XLA dropped: the kernel of the weight it reads
                sources = _param_sources(sub, self.by_name)
                read = [self.param_keys[o] for o in sources if o in self.param_keys]
                key = read[0] if read else key
            if pieces:
                total = sum(n for _, n in pieces)
                for piece_key, n in pieces:
                    self.per[piece_key].add(c.flops * n / total)
                    self.touched[piece_key] += c.flops * n / total
                inner_flops += c.flops
                continue
            convert = c.flops if sub.opcode == "convert" else 0.0
            if sub.opcode == "fusion":  # the converts of a fusion nested in this one
                convert = _nested_converts(sub, self.model)
            self.per[key].add(c.flops, c.transcendentals, 0.0, convert)
            inner_flops += c.flops
            self.touched[key] += c.flops + c.transcendentals
        return inner_flops

    def _add_reads(self) -> float:
        """Each parameter's read to the kernel computing with it (a weight's to its own); their
        sum."""
        users: dict[str, list[str]] = defaultdict(list)
        for sub in self.body:
            for o in dict.fromkeys(sub.operands):
                users[o].append(sub.name)
        last = _producer(self.body[-1].name, self.by_name)
        read_total = 0.0
        for sub in self.body:
            if sub.opcode != "parameter":
                continue
            size = self.model._parameter_read_bytes(sub, [self.by_name[u] for u in users[sub.name]])
            user = _computing_user(sub.name, users, self.by_name)
            key = self.kinds[user] if user else self.kinds[last]
            key = self.param_keys.get(sub.name, key)  # a weight's read is its kernel's
            self.per[key].add(bytes_=size)
            self.touched[key] += 0.0
            read_total += size
        return read_total

    def _written(self, out: Instr) -> float:
        """The bytes an output writes (a dynamic-update-slice writes its update only)."""
        if out.opcode == "dynamic-update-slice":
            return self.model._bytes(out.operands[1])
        return self.model._bytes(out.name)

    def _add_writes(self) -> list[Instr]:
        """Each output's write to the kernel producing it (a fused product's to each product)."""
        root = self.body[-1]
        outputs = [self.by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]
        for o in outputs:
            size = self._written(o)
            producer = self.by_name[_producer(o.name, self.by_name)]
            pieces = self._pieces(producer)
            total = sum(n for _, n in pieces)
            for piece_key, n in pieces:  # a horizontally fused product writes each one's output
                self.per[piece_key].add(bytes_=size * n / total)
            if not pieces:
                self.per[self.kinds[producer.name]].add(bytes_=size)
                self.touched[self.kinds[producer.name]] += 0.0
        return outputs

    def _add_remainder(self, inner_flops: float, read_total: float, outputs: list) -> list:
        """Large constants and anything the steps above did not place: to the heaviest kernel."""
        placed = read_total + sum(self._written(o) for o in outputs)
        keys = sorted(self.touched, key=lambda k: -self.touched[k])
        keys = keys or [self.fallback or (None, UNNAMED)]
        if abs(self.whole.bytes - placed) > 0.5:
            self.per[keys[0]].add(bytes_=self.whole.bytes - placed)
        if abs(self.whole.flops - inner_flops) > 0.5:
            self.per[keys[0]].add(flops=self.whole.flops - inner_flops)
        return keys


def _nested_converts(ins: Instr, model: TargetCostModel) -> float:
    """The FLOPs XLA counts for the converts inside a fusion, nested fusions included."""
    total = 0.0
    for sub in model.comps[model._callee(ins)]:
        if sub.opcode == "convert":
            total += _shape_bytes_elems(sub.shape)[1]
        elif sub.opcode == "fusion":
            total += _nested_converts(sub, model)
    return total
