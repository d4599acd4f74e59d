"""Validation of the layers whose state does not grow: linear attention (Gated DeltaNet,
Qwen3-Next), Mamba-2 heads beside attention heads (Falcon-H1) and short gated convolutions
(LFM2), each error one line naming the field and what is allowed. Imported by
`kvjax.model.config`; closed forms in `kvjax.analytic.hybrid`."""

from __future__ import annotations

from typing import Any

from kvjax.dtypes import canonical_dtype
from kvjax.errors import KvjaxError

# A layer's kind, one letter a layer in `layer_kinds` (tiled over the layers like layer_pattern):
LAYER_KINDS = {
    "A": "attention (MHA/GQA/MQA/MLA: its KV cache grows with S)",
    "D": "Gated DeltaNet linear attention (Qwen3-Next): a d_k x d_v state per value head",
    "H": "Mamba-2 heads beside the attention heads (Falcon-H1): an N x P state per Mamba head",
    "C": "a short gated convolution (LFM2): (conv_kernel - 1) rows of d_model",
}
STATE_KINDS = "DH"  # kinds holding a recurrent state (and a short convolution before it)
ATTENTION_KINDS = "AH"  # kinds with an attention (and its KV cache)
_STATE_INTS = ("state_heads", "state_groups", "state_key_dim", "state_value_dim")

Fields = Any  # the ModelConfig under construction (read, never built here)


def conv_channels(cfg: Fields, kind: str) -> int:
    """X, the short conv's channels: DeltaNet convolves q, k, v (2*Y*dk + J*dv); Mamba x, B, C
    (J*P + 2*Y*N); LFM2 D."""
    if kind == "C":
        return cfg.d_model
    J, Y, dk, dv = cfg.state_heads, cfg.state_groups, cfg.state_key_dim, cfg.state_value_dim
    return 2 * Y * dk + J * dv


def _int(cfg: Fields, field: str, minimum: int) -> int:
    value = getattr(cfg, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KvjaxError(f"{field}={value!r} must be an integer >= {minimum}")
    return value


def check_hybrid(cfg: Fields) -> None:
    kinds = cfg.layer_kinds
    if not isinstance(kinds, str) or not kinds or set(kinds) - set(LAYER_KINDS):
        raise KvjaxError(
            f"layer_kinds={kinds!r} must be a string of "
            + ", ".join(f"{k} ({v.split(' (')[0]})" for k, v in LAYER_KINDS.items())
            + " tiled over the layers, e.g. 'DDDA' (Qwen3-Next), 'H' (Falcon-H1)"
        )
    for field in _STATE_INTS:
        _int(cfg, field, 0)
    _int(cfg, "conv_kernel", 0)
    _int(cfg, "scan_chunk", 1)
    for field in ("conv_bias", "state_norm", "state_norm_before_gate", "attn_output_gate"):
        if not isinstance(getattr(cfg, field), bool):
            raise KvjaxError(f"{field}={getattr(cfg, field)!r} must be true or false")
    object.__setattr__(cfg, "state_dtype", canonical_dtype(cfg.state_dtype, "state_dtype"))
    stateful = set(kinds) & set(STATE_KINDS)
    if stateful:
        for field in _STATE_INTS:
            if not getattr(cfg, field):
                raise KvjaxError(
                    f"{field}=0 but layer_kinds={kinds!r} has state layers "
                    f"({', '.join(sorted(stateful))}): set it > 0"
                )
        if cfg.state_heads % cfg.state_groups:
            raise KvjaxError(
                f"state_groups={cfg.state_groups} must divide state_heads={cfg.state_heads} "
                "(each q/k head or B/C group serves state_heads / state_groups heads)"
            )
    else:
        for field in _STATE_INTS:
            if getattr(cfg, field):
                raise KvjaxError(
                    f"{field}={getattr(cfg, field)} is a state-layer field, but layer_kinds="
                    f"{kinds!r} has no D or H layer; set {field}=0"
                )
    if set(kinds) - {"A"} and cfg.conv_kernel < 1:
        raise KvjaxError(
            f"conv_kernel={cfg.conv_kernel} must be >= 1 for layer_kinds={kinds!r} (the short "
            "causal convolution's width: 4 in Qwen3-Next and Falcon-H1, 3 in LFM2)"
        )
    if set(kinds) == {"A"}:
        for field in ("conv_kernel", "conv_bias"):
            if getattr(cfg, field):
                raise KvjaxError(
                    f"{field}={getattr(cfg, field)!r} is a state-layer field, but layer_kinds="
                    f"{kinds!r} has no D, H or C layer; set {field}=0"
                )
    if cfg.state_norm_before_gate and not cfg.state_norm:
        raise KvjaxError(
            "state_norm_before_gate=True orders the Mamba-2 gated norm; it needs state_norm=True"
        )
    if cfg.state_norm and "H" not in kinds:
        raise KvjaxError(
            "state_norm=True is the Mamba-2 layers' gated norm (layer_kinds with H); D layers "
            "always have theirs"
        )
    if set(kinds) != {"A"}:
        reasons = [
            reason
            for reason, bad in (
                ("MLA (kv_lora_rank > 0)", cfg.kv_lora_rank),
                (f"layer_pattern={cfg.layer_pattern!r} (sliding layers)", "L" in cfg.layer_pattern),
                (f"kv_dtype={cfg.kv_dtype!r} (a packed cache)", cfg.kv_packed),
            )
            if bad
        ]
        if reasons:
            raise KvjaxError(
                f"layer_kinds={kinds!r} (state layers) is modelled beside full MHA/GQA/MQA "
                f"attention; got " + ", ".join(reasons)
            )
    if cfg.attn_output_gate and cfg.kv_lora_rank:
        raise KvjaxError("attn_output_gate=True is not supported with MLA (kv_lora_rank > 0)")
