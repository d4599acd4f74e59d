"""The goodput figure: requests per second served within the SLO against the arrival rate, one
line per attention variant, a panel per KV dtype, a star at each variant's knee (the largest
rate at which the attainment target holds), and beside each variant the quality it costs in the
committed quality results (records of `experiments/serving_goodput.py`)."""

from __future__ import annotations

import pandas as pd

from kvjax.plotting.serving import WIDTH, _kind, _variant_colors


def _quality(row) -> str:
    """The variant's (and an fp8 cache's) committed quality cost, val loss in nats/byte."""
    parts = []
    mla = _kind(row["variant"]) == "MLA"
    for kind, name in (("variant", "MLA" if mla else "h_kv"), ("kv_dtype", "fp8")):
        delta = row.get(f"quality_{kind}_delta")
        if delta is None or pd.isna(delta):
            continue
        if delta == 0 and kind == "variant":
            continue  # MHA: the baseline
        lo, hi = row.get(f"quality_{kind}_low"), row.get(f"quality_{kind}_high")
        span = "" if lo is None or pd.isna(lo) else f" [{lo:+.3f}, {hi:+.3f}]"
        parts.append(f"{name} {delta:+.3f}{span}")
    if not parts and mla:
        return "quality: none committed"
    return ("quality " + ", ".join(parts) + " nats/B") if parts else "quality: the baseline"


def goodput(records: pd.DataFrame, fig) -> bool | None:
    df = records[records.experiment == "serving_goodput"]
    if "variants_compared" in df:  # the variants' comparison (a prefix sweep is one variant's)
        df = df[df.variants_compared.fillna(True).astype(bool)]
    if "in_goodput_figure" in df:  # configs/serving_goodput_predicted.yaml's are not drawn
        df = df[df.in_goodput_figure.fillna(True).astype(bool)]
    if df.empty:
        return False
    df = df.assign(knee=df.knee.astype(bool))
    dtypes = list(dict.fromkeys(df.kv_dtype))
    fig.set_size_inches(3.6 * len(dtypes), 3.6)
    grid = fig.add_gridspec(2, len(dtypes), height_ratios=[1.0, 0.42])
    colors = _variant_colors()
    r0 = df.iloc[0]
    fig.suptitle(
        f"{r0.model} on {r0.chip} (closed-form steps): {int(r0.prompt_len)}-token prompts, "
        f"{int(r0.output_len)} out; SLO TTFT <= {r0.slo_ttft_s:g} s and ITL P99 <= "
        f"{r0.slo_itl_s * 1e3:g} ms; star: the knee (90% within the SLO)",
        fontsize=6,
    )
    for i, kv in enumerate(dtypes):
        ax = fig.add_subplot(grid[0, i])
        g = df[df.kv_dtype == kv]
        top = 0.0
        seen: set[str] = set()
        for variant, line in g.groupby("variant", sort=False):
            kind = _kind(variant)
            color = colors.get(kind, "0.4")
            again = kind in seen  # a second curve of a kind (MLA at another latent): dashed
            seen.add(kind)
            name = " ".join(str(variant).split()[:2]) if kind == "MLA" else kind
            runs = line.sort_values("rate_requests_per_s")  # the rates and the knee's
            served = runs.rate_requests_per_s * runs.attainment
            knee = line[line.knee].iloc[0]
            energy = knee.energy_j_per_output_token
            label = (
                f"{name}: knee {knee.rate_requests_per_s:.2f}/s, {energy:.2f} J/token\n"
                f"    {_quality(knee)}"
            )
            ax.plot(
                runs.rate_requests_per_s,
                served,
                "--o" if again else "-o",
                ms=2,
                color=color,
                lw=WIDTH.get(kind, 0.9),
                label=label,
            )
            ax.plot(
                [knee.rate_requests_per_s],
                [knee.rate_requests_per_s * knee.attainment],
                "*",
                ms=6,
                color=color,
            )
            top = max(top, runs.rate_requests_per_s.max())
        ax.plot([0, top], [0, top], color="0.7", lw=0.6, ls=":", label="every request in the SLO")
        ax.set_title(f"({chr(ord('a') + i)}) {kv} KV cache", fontsize=6)
        ax.set_xlabel("arrival rate (requests/s, Poisson)", fontsize=5.5)
        ax.set_ylabel("goodput (requests/s within the SLO)", fontsize=5.5)
        ax.tick_params(labelsize=5)
        legend = fig.add_subplot(grid[1, i])
        legend.axis("off")
        legend.legend(
            *ax.get_legend_handles_labels(), loc="upper center", fontsize=4.8, frameon=False
        )
    return True
