"""A model traced from one layer of each kind it has: dense or MoE, global or sliding, RoPE or
NoPE, and the hybrids' layer letter (`ModelConfig.layer_kinds`). Layers of one kind lower to the
same kernels, so a measure of the whole model (FLOPs, bytes, collectives) is a linear combination
of the measures of two small models per kind: `by_layer_kind`. `layers="one"` in
`kvjax.traced.step` and `kvjax.traced.sharded` asks for it; tests check it against the full
unrolled trace.
"""

from __future__ import annotations

from kvjax.errors import KvjaxError
from kvjax.model.config import ModelConfig

LAYERS = ("all", "one")


def check_layers(layers: str) -> None:
    if layers not in LAYERS:
        raise KvjaxError(f"layers={layers!r} is not supported; allowed: {', '.join(LAYERS)}")


def kind_of(cfg: ModelConfig, layer: int) -> tuple[bool, bool, bool, str]:
    """(MoE, sliding, NoPE, layer_kinds letter) of a layer: what makes layers' kernels differ."""
    return (
        cfg.layer_is_moe(layer),
        cfg.layer_is_sliding(layer),
        not cfg.layer_has_rope(layer),
        cfg.layer_kind(layer),
    )


def layer_kinds(cfg: ModelConfig) -> list[tuple[bool, bool, bool, str]]:
    """The distinct kinds of layer the model has, dense first (an MoE model's dense layers are
    its first)."""
    return sorted({kind_of(cfg, i) for i in range(cfg.num_layers)})


def config_of_kinds(cfg: ModelConfig, kinds: list[tuple[bool, bool, bool, str]]) -> ModelConfig:
    """`cfg` with one layer of each kind in `kinds` (sorted, dense first; repeats allowed)."""
    pattern = "".join("L" if sliding else "G" for _, sliding, _, _ in kinds)
    rope = "".join("N" if nope else "R" for _, _, nope, _ in kinds)
    dense = sum(not moe for moe, _, _, _ in kinds) if cfg.is_moe else 0
    return cfg.replace(
        num_layers=len(kinds),
        layer_pattern=pattern,
        first_dense_layers=dense,
        rope_pattern=rope,
        moe_layer_step=1,
        layer_kinds="".join(k[3] for k in kinds),
    )


def by_layer_kind(cfg: ModelConfig, measure):
    """`measure(config)` (numbers in nested dicts, lists, tuples) of the whole model from small
    ones: a model with one layer of each kind (A), and for each kind with n_k > 1 layers that
    model with the kind's layer twice (B_k): A + sum_k (n_k - 1) (B_k - A). With one kind this is
    one + (L - 1) (two - one). Returns (total, the layer counts traced)."""
    kinds = layer_kinds(cfg)
    base_cfg = config_of_kinds(cfg, kinds)
    base = measure(base_cfg)
    terms, traced = [(1, base)], [base_cfg.num_layers]
    for i, kind in enumerate(kinds):
        n = sum(kind_of(cfg, j) == kind for j in range(cfg.num_layers))
        if n > 1:
            twice = config_of_kinds(cfg, kinds[: i + 1] + kinds[i:])
            terms += [(n - 1, measure(twice)), (1 - n, base)]
            traced.append(twice.num_layers)
    return linear_combination(terms), tuple(traced)


def linear_combination(terms):
    """sum of coef * tree over (coef, tree) pairs, leaf by leaf (a key missing from a dict is
    zero there)."""
    trees = [t for _, t in terms]
    first = next((t for t in trees if t is not None), None)
    if isinstance(first, dict):
        keys = list(dict.fromkeys(k for t in trees for k in (t or {})))
        return {k: linear_combination([(c, (t or {}).get(k)) for c, t in terms]) for k in keys}
    if isinstance(first, tuple | list):
        return type(first)(
            linear_combination([(c, t[i]) for c, t in terms]) for i in range(len(first))
        )
    return sum(c * (t or 0) for c, t in terms)
