"""What every report's rendering shares: the console, the attention label, ratios, a hybrid's
state line. The report modules (`render`, `render_calc`, `render_parallel`, `render_target`) take
them from here; only `render_calc` calls another, for calc's placements (`render_parallel`) and
predictions (`validate`)."""

from __future__ import annotations

from typing import Any


def console(stderr: bool = False):
    """A console that does not squeeze tables into 80 columns when piped or captured (`stderr`:
    one that writes there, beside a JSON report on stdout)."""
    from rich.console import Console

    con = Console(highlight=False, soft_wrap=True, stderr=stderr)
    if con.is_terminal:
        return con
    return Console(highlight=False, soft_wrap=True, width=200, stderr=stderr)


def progress_bar(con):
    """A progress bar on `con` that goes when done: its task's words, the bar, done of total."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=con,
        transient=True,
    )


def attention_label(m: dict[str, Any]) -> str:
    """`num_kv_heads=8` for MHA/GQA/MQA; the latent, RoPE width and decode form for MLA."""
    if m.get("kv_lora_rank"):
        return f"MLA latent {m['kv_lora_rank']}+{m['qk_rope_head_dim']} ({m['mla_decode']})"
    return f"num_kv_heads={m['num_kv_heads']}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


# the state layers' names in `kvjax calc` (config_hybrid.LAYER_KINDS's letters)
_KIND_NAMES = {"D": "Gated DeltaNet", "H": "Mamba-2 (beside attention)", "C": "short conv"}


def state_line(report: dict[str, Any]) -> str | None:
    """A hybrid's states in one line (None for a transformer): per kind of layer its count and
    a sequence's recurrent state and conv cache, the total for B sequences, and the whole cache."""
    from kvjax.units import fmt_bytes

    state = report.get("state")
    if not state:
        return None
    B, S = report["workload"]["batch"], report["workload"]["context"]
    parts = [
        f"{v['count']} {_KIND_NAMES[k]} layers: "
        + (
            f"{fmt_bytes(v['recurrent'], 'KiB')} state ({state['state_dtype']}) + "
            if v["recurrent"]
            else ""
        )
        + f"{fmt_bytes(v['conv'], 'KiB')} conv cache each"
        for k, v in state["layers"].items()
    ]
    return (
        f"  state       {'; '.join(parts)}: {fmt_bytes(report['state_bytes'])} for B={B:,}, flat "
        f"in S; KV + state {fmt_bytes(report['cache_bytes'])} at S={S:,}"
    )
