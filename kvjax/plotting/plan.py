"""`kvjax plan --figure`: the options searched, output tokens/s per chip against tokens/s per user,
the refined ones with their 80% interval and their bound (prefill and decode apart as squares),
the frontier joined, the best marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plan_figure(report: dict[str, Any], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["options"]
    fig, ax = plt.subplots(figsize=(5.2, 3.4), dpi=200)
    screened = [r for r in rows if r.get("screened") and not r.get("predicted")]
    ax.scatter(
        [r["screened_per_user"] for r in screened],
        [r["screened"] for r in screened],
        s=8,
        color="0.7",
        label="screened (half the requests)",
    )
    refined = [r for r in rows if r.get("predicted")]
    for r in refined:
        color = "C0" if r.get("meets_slo") else "C3"
        ax.errorbar(
            r["per_user"],
            r["predicted"],
            yerr=[[r["predicted"] - r["predicted_lo"]], [r["predicted_hi"] - r["predicted"]]],
            fmt="s" if r.get("prefill") else "o",
            ms=3,
            lw=0.6,
            color=color,
        )
        ax.scatter(r["per_user"], r["bound"], marker="_", s=40, color=color, lw=0.8)
        ax.annotate(
            r["option"],
            (r["per_user"], r["predicted"]),
            fontsize=4,
            xytext=(3, 2),
            textcoords="offset points",
        )
    edge = report["frontier"]
    ax.plot([r["per_user"] for r in edge], [r["predicted"] for r in edge], lw=0.8, color="C0")
    if report["best"]:
        b = report["best"]
        ax.scatter(
            b["per_user"],
            b["predicted"],
            marker="*",
            s=60,
            color="C2",
            zorder=3,
            label="best under the SLO",
        )
    ax.scatter([], [], marker="_", color="C0", label="bound (system, per chip)")
    ax.errorbar([], [], yerr=[], fmt="o", ms=3, color="C0", label="predicted [80%], SLO met")
    if any(r.get("prefill") for r in refined):
        ax.errorbar([], [], yerr=[], fmt="s", ms=3, color="C0", label="prefill and decode apart")
    ax.set(
        xlabel="tokens/s per user (1 / mean TPOT)",
        ylabel="output tokens/s per chip",
        title=f"kvjax plan: {report['model']} on {report['chips']} x {report['chip']}",
    )
    ax.title.set_fontsize(7)
    ax.tick_params(labelsize=5)
    ax.xaxis.label.set_fontsize(6)
    ax.yaxis.label.set_fontsize(6)
    ax.legend(fontsize=4, frameon=True)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
