"""The uptraining figures: `gqa_uptrain`, an MHA model converted to fewer KV heads by
mean-pooling, the first head or a random init and fine-tuned (Ainslie et al. 2023), against the
same GQA model trained from scratch for the same tokens; `mla_uptrain`, MHA converted to MLA by
partial RoPE and a joint SVD of keys and values (MHA2MLA, Ji et al. 2025) against GQA at equal KV
bytes. Means over seeds with 95% Student-t intervals."""

from __future__ import annotations

import pandas as pd
from matplotlib import ticker
from matplotlib.patches import Patch

from kvjax.plotting.quality import _bars, _handles, key_row, model_title, shifts
from kvjax.stats import summarize

UPTRAIN_COLORS = {
    "mean": "#4c72b0",
    "first": "#dd8452",
    "random": "#55a868",
    "scratch": "0.35",
    "mha2mla": "#c44e52",
}
MLA_UPTRAIN_LABELS = {"mean": "GQA (mean-pooled)", "mha2mla": "MLA (MHA2MLA)"}
CURVE_TICKS = (1.4, 1.5, 1.6, 1.7, 1.8, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0)


def _mha_band(ax, mha: pd.DataFrame) -> float | None:
    if mha.empty:
        return None
    m = summarize(mha, ["method"], ["val_loss"]).iloc[0]
    ci = m.get("val_loss_ci", 0.0)
    ci = 0.0 if pd.isna(ci) else ci
    ax.axhspan(m.val_loss - ci, m.val_loss + ci, color="0.85", zorder=0)
    ax.axhline(m.val_loss, color="0.3", lw=0.8, label="MHA (trained)")
    return float(m.val_loss)


def _methods(ax, s: pd.DataFrame, x: str, line: bool) -> None:
    """One error bar series per method, the methods side by side at each x."""
    methods = list(dict.fromkeys(s.method))
    for method, shift in zip(methods, shifts(len(methods)), strict=True):
        sm = s[s.method == method].sort_values(x)
        ls = ("--" if method == "scratch" else "-") if line else "none"
        _bars(
            ax, sm[x], sm, "val_loss", UPTRAIN_COLORS.get(method, "0.5"), method, ls=ls, shift=shift
        )


def _log_loss(ax) -> None:
    """A log loss axis ticked at plain numbers (CURVE_TICKS) within its limits."""
    lo, hi = ax.get_ylim()
    ax.set_yscale("log")
    ticks = [t for t in CURVE_TICKS if lo <= t <= hi]
    ax.yaxis.set_major_locator(ticker.FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _plain_ticks(ax, values, labels=None) -> None:
    values = sorted(values)
    ax.set_xticks(values, labels or [f"{v:g}" for v in values])
    ax.xaxis.set_minor_locator(ticker.NullLocator())


def _compared(df: pd.DataFrame) -> pd.DataFrame:
    """The GQA conversions the figure compares: per (h_kv, steps) the groups of two methods or
    more (a method alone there is MHA2MLA's twin: figure mla_uptrain), each on the seeds all of
    its methods ran, and the MHA models of those seeds."""
    tuned = df[~df.method.isin(["mha", "mha2mla"])]
    groups = []
    for _, g in tuned.groupby(["num_kv_heads", "steps"]):
        runs = [set(m.seed) for _, m in g.groupby("method")]
        if len(runs) > 1:
            groups.append(g[g.seed.isin(set.intersection(*runs))])
    if not groups:
        return df.iloc[:0]
    kept = pd.concat(groups)
    return pd.concat([df[(df.method == "mha") & df.seed.isin(kept.seed)], kept])


def gqa_uptrain(records: pd.DataFrame, fig) -> None:
    """(a) validation loss after the fine-tune against num_kv_heads per conversion method and
    from scratch for the same tokens, at the smallest fine-tune budget, the MHA model's as a band;
    (b) when a num_kv_heads was run at several budgets: the same against the fine-tune steps, the
    methods run at each budget only (markers, no line: two budgets are not a curve); (c) the
    longest fine-tune's validation curves, every seed thin and their mean thick."""
    df = _compared(records[records.experiment == "gqa_uptrain"])
    # runs at several budgets retrain the same MHA model per seed: count each once
    df = df.drop_duplicates(["method", "num_kv_heads", "seed", "steps"])
    mha = df[df.method == "mha"]
    pretrain = int(mha.steps.min()) if not mha.empty else 0
    tuned = df[df.method != "mha"].assign(finetune=lambda d: d.steps - pretrain)
    budget = int(tuned.finetune.min())
    fig.set_size_inches(fig.get_figwidth(), 3.6)
    grid = fig.add_gridspec(2, 3, height_ratios=[1.0, 0.3])
    ax, ax_budget, ax_curve = (fig.add_subplot(grid[0, i]) for i in range(3))
    s = summarize(tuned[tuned.finetune == budget], ["method", "num_kv_heads"], ["val_loss"])
    _methods(ax, s, "num_kv_heads", line=True)
    _mha_band(ax, mha)
    ax.set_xscale("log", base=2)
    _plain_ticks(ax, s.num_kv_heads.unique())
    ax.set_xlabel("num_kv_heads after conversion")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title(f"(a) validation loss after {budget} fine-tune steps, per h_kv", fontsize=7.5)
    caption = [
        "(a), (b): means over seeds, bars 95% Student-t intervals, the methods side by side "
        "(dodged in x); scratch: the GQA model trained from scratch for the same tokens "
        f"({pretrain} + fine-tune steps)"
    ]
    budgets = tuned.groupby("num_kv_heads").finetune.nunique()
    if budgets.max() > 1:  # the h_kv with the most (method, budget) runs
        runs_k = tuned.drop_duplicates(["num_kv_heads", "method", "finetune"]).num_kv_heads
        k = int(runs_k.value_counts().sort_index().idxmax())
        tk = tuned[tuned.num_kv_heads == k]
        runs = tk.groupby("method").finetune.nunique()
        both = tk[tk.method.isin(runs[runs == runs.max()].index)]
        s = summarize(both, ["method", "finetune"], ["val_loss"])
        _methods(ax_budget, s, "finetune", line=False)
        _mha_band(ax_budget, mha)
        ax_budget.set_xscale("log")
        steps = sorted(s.finetune.unique())
        _plain_ticks(ax_budget, steps, [f"{v:g} ({v / pretrain:.0%})" for v in steps])
        ax_budget.set_xlim(steps[0] / 1.6, steps[-1] * 1.6)
        ax_budget.set_xlabel(f"fine-tune steps (% of {pretrain} pre-training)")
        ax_budget.set_title(f"(b) h_kv={k}: validation loss per fine-tune budget", fontsize=7.5)
        left_out = sorted(set(tk.method) - set(both.method))
        if left_out:
            caption.append(
                f"(b) {', '.join(left_out)} ran at {budget} fine-tune steps only (shown in a)"
            )
    else:
        ax_budget.set_axis_off()
    _curves(ax_curve, tuned, mha, caption)
    handles = _handles([ax, ax_budget, ax_curve])
    if "MHA (trained)" in handles:  # the line on its band, as drawn
        handles["MHA (trained), 95% CI"] = (Patch(color="0.85"), handles.pop("MHA (trained)"))
    key_row(fig, grid[1, :], handles, caption, ncol=len(handles))
    fig.suptitle(
        f"MHA converted to GQA and fine-tuned: {model_title(df)}, {pretrain} pre-training steps",
        fontsize=8.5,
    )


def _curves(ax, tuned: pd.DataFrame, mha: pd.DataFrame, caption: list[str]) -> None:
    """The longest fine-tune of the fewest KV heads run that long: each seed's validation curve
    (thin) and the mean over seeds (thick, its final value in the key)."""
    longest = tuned.finetune.max()
    runs = tuned[tuned.method.isin(["mean", "first", "random"]) & (tuned.finetune == longest)]
    runs = runs[runs.num_kv_heads == runs.num_kv_heads.min()]
    k = int(runs.num_kv_heads.min())
    for method, g in runs.groupby("method", sort=False):
        _seed_curves(ax, g, UPTRAIN_COLORS.get(method, "0.5"), f"(c) {method}")
    m = _mha_band(ax, mha)
    _log_loss(ax)
    ax.set_xlabel("fine-tune step (0: right after conversion)")
    ax.set_ylabel("validation loss (nats/byte)")
    seeds = int(runs.seed.nunique()) if "seed" in runs else 1
    ax.set_title(
        f"(c) h_kv={k}: validation loss during the {int(longest)}-step fine-tune", fontsize=7.5
    )
    what = f"each of {seeds} seeds (thin) and their mean (thick)" if seeds > 1 else "one seed"
    caption.append(f"(c) {what}" + (f"; MHA {m:.3f}" if m is not None else ""))


def _seed_curves(ax, g: pd.DataFrame, color, label: str) -> None:
    """Each seed's validation curve (thin) and their mean (thick, its final value in the key)."""
    curves = [pd.DataFrame(h).set_index("step").val_loss for h in g.history]
    for c in curves:
        ax.plot(c.index, c, color=color, lw=0.6, alpha=0.45)
    mean = pd.concat(curves, axis=1).mean(axis=1)
    ax.plot(
        mean.index,
        mean,
        color=color,
        lw=1.4,
        marker="o",
        ms=3,
        label=f"{label}, final {mean.iloc[-1]:.3f}",
    )


def mla_uptrain(records: pd.DataFrame, fig) -> bool | None:
    """MHA converted to MLA (MHA2MLA) or to GQA (mean-pooling) at equal KV bytes, both fine-tuned
    for the budget MHA2MLA ran: (a) validation loss after the fine-tune and (b) right after the
    conversion, against KV bytes per token, the MHA model's as a band; (c) the fine-tune's
    validation curves at the fewest bytes, every seed thin and their mean thick."""
    df = records[records.experiment == "gqa_uptrain"]
    mla = df[df.method == "mha2mla"]
    if mla.empty:
        return False
    budget = int(mla.steps.max())
    mha = df[df.method == "mha"].drop_duplicates(["seed", "steps"])
    nbytes = set(mla.kv_bytes_per_token)
    runs = df[
        df.method.isin(["mha2mla", "mean"])
        & (df.steps == budget)
        & df.kv_bytes_per_token.isin(nbytes)
    ].drop_duplicates(["method", "kv_bytes_per_token", "seed"])
    pretrain = int(mha.steps.min())
    fig.set_size_inches(fig.get_figwidth(), 3.6)
    grid = fig.add_gridspec(2, 3, height_ratios=[1.0, 0.3])
    ax, ax_before, ax_curve = (fig.add_subplot(grid[0, i]) for i in range(3))
    after = f"(a) after {budget - pretrain} fine-tune steps"
    _at_equal_bytes(ax, runs, "val_loss", after, mha, nbytes)
    _at_equal_bytes(ax_before, runs, "val_loss_before", "(b) right after conversion", mha, nbytes)
    _log_loss(ax_before)
    small = runs[runs.kv_bytes_per_token == min(nbytes)]
    for method, g in small.groupby("method", sort=False):
        _seed_curves(ax_curve, g, UPTRAIN_COLORS[method], f"(c) {MLA_UPTRAIN_LABELS[method]}")
    _mha_band(ax_curve, mha)
    _log_loss(ax_curve)
    ax_curve.set_xlabel("fine-tune step (0: right after conversion)")
    ax_curve.set_ylabel("validation loss (nats/byte)")
    ax_curve.set_title(
        f"(c) {min(nbytes):g} B/token: the fine-tune's validation loss", fontsize=7.5
    )
    handles = _handles([ax, ax_curve])
    if "MHA (trained)" in handles:
        handles["MHA (trained), 95% CI"] = (Patch(color="0.85"), handles.pop("MHA (trained)"))
    rope = (
        f"RoPE kept on {int(mla.qk_rope_head_dim.iloc[0])} dims a head"
        if ("qk_rope_head_dim" in mla)
        else "partial RoPE"
    )
    caption = [
        f"MHA pre-trained {pretrain} steps, converted at equal KV bytes: MLA by {rope} and a "
        "joint SVD of keys and values",
        "(MHA2MLA, Ji et al. 2025; A: latent width), GQA by mean-pooling heads (Ainslie et al. "
        "2023); means over seeds, bars 95% Student-t intervals; (c) each seed thin, their mean "
        "thick",
    ]
    key_row(fig, grid[1, :], handles, caption, ncol=len(handles))
    fig.suptitle(
        f"MHA converted to MLA or GQA at equal KV bytes and fine-tuned: {model_title(df)}",
        fontsize=8.5,
    )


def _at_equal_bytes(panel, runs: pd.DataFrame, metric: str, title: str, mha, nbytes) -> None:
    """`metric` per method against KV bytes per token (ticked at `nbytes`), MLA's points tagged
    with their latent width A, the MHA model's as a band."""
    s = summarize(runs, ["method", "kv_bytes_per_token"], [metric])
    for (method, sm), shift in zip(s.groupby("method"), shifts(2), strict=True):
        sm = sm.sort_values("kv_bytes_per_token")
        _bars(
            panel,
            sm.kv_bytes_per_token,
            sm,
            metric,
            UPTRAIN_COLORS[method],
            MLA_UPTRAIN_LABELS[method],
            shift=shift,
        )
        if method == "mha2mla":
            for _, r in sm.iterrows():
                a = int(
                    runs[
                        (runs.method == method) & (runs.kv_bytes_per_token == r.kv_bytes_per_token)
                    ].kv_lora_rank.iloc[0]
                )
                panel.annotate(
                    f"A={a}",
                    (r.kv_bytes_per_token, r[metric]),
                    fontsize=5.5,
                    color=UPTRAIN_COLORS[method],
                    xytext=(4, -8),
                    textcoords="offset points",
                )
    _mha_band(panel, mha)
    panel.set_xscale("log", base=2)
    _plain_ticks(panel, sorted(nbytes))
    panel.set_xlabel("KV cache per token (bytes)")
    panel.set_ylabel("validation loss (nats/byte)")
    panel.set_title(f"{title}, per KV bytes", fontsize=7.5)
