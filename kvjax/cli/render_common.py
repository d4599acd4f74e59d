"""What every report's rendering shares: the console, the attention label, ratios. The report
modules (`render`, `render_parallel`, `render_target`) import from here, never each other."""

from __future__ import annotations

from typing import Any


def console():
    """A console that does not squeeze tables into 80 columns when piped or captured."""
    from rich.console import Console

    con = Console(highlight=False, soft_wrap=True)
    return con if con.is_terminal else Console(highlight=False, soft_wrap=True, width=200)


def attention_label(m: dict[str, Any]) -> str:
    """`num_kv_heads=8` for MHA/GQA/MQA; the latent, RoPE width and decode form for MLA."""
    if m.get("kv_lora_rank"):
        return f"MLA latent {m['kv_lora_rank']}+{m['qk_rope_head_dim']} ({m['mla_decode']})"
    return f"num_kv_heads={m['num_kv_heads']}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
