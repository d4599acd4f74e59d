"""Rendering of `kvjax calc`'s report (a plain dict) as lines and rich tables, a function a part:
the model and its weights, the cache, the roofline, speculation, the floors and memory, the
variants, the kernels. No numbers are computed here."""

from __future__ import annotations

import math
from typing import Any

from kvjax.cli.render_common import console, state_line
from kvjax.units import fmt_bytes, fmt_count, fmt_rate, fmt_seconds, sig


def print_calc(report: dict[str, Any]) -> None:
    """`kvjax calc`: the summary, the MHA/GQA/MQA table with --variants, the kernels, and the
    per-device table with --tp."""
    con = console()
    heads, ratio = _attention(report)
    m, wl, chip = report["model"], report["workload"], report["chip"]
    B, S = wl["batch"], wl["context"]
    con.print(
        f"[bold]{m['name']}[/bold] ({heads}) | {wl['phase']} | B={B:,} | S={S:,} | "
        f"chip {chip['name']}"
    )
    _print_weights(con, report)
    _print_cache(con, report)
    _print_roofline(con, report, ratio)
    if report.get("speculative"):
        _print_speculative(con, report["speculative"])
    _print_floors(con, report)
    if report.get("variants"):
        _print_variants(con, report["variants"], wl["phase"])
    _print_kernels(con, report)
    if report.get("tensor_parallel") or report.get("pipeline"):
        from kvjax.cli.render_parallel import print_placements

        print_placements(report)
    if report.get("predicted"):
        from kvjax.cli.validate import print_predicted

        print_predicted(report["predicted"], con)


def _attention(report: dict[str, Any]) -> tuple[str, str]:
    """The attention in the header's words, and how its intensity follows from its shape."""
    m = report["model"]
    if m.get("kv_lora_rank"):
        heads = (
            f"MLA, {m['num_heads']} heads, latent {m['kv_lora_rank']} + RoPE "
            f"{m['qk_rope_head_dim']} cached, {m['mla_decode']} decode"
        )
        ratio = f"absorbed 2N(2A+P)/((A+P)*bytes), N={m['num_heads']}"
        if m["mla_decode"] == "naive":
            ratio = "naive: over the re-expanded per-head K and V, like MHA"
    else:
        heads = (
            f"{report['attention_variant']}, num_kv_heads={m['num_kv_heads']} of {m['num_heads']}"
        )
        ratio = f"h/h_kv = {m['num_heads']}/{m['num_kv_heads']}"
    return heads, ratio


def _print_weights(con, report: dict[str, Any]) -> None:
    """The parameters and weights; an MoE model's experts; the weights per expert-parallel
    device."""
    m, B = report["model"], report["workload"]["batch"]
    con.print(
        f"  params      {report['params']:,} ({fmt_count(report['params'])}); weights "
        f"{fmt_bytes(report['weight_bytes'])} = {fmt_rate(report['weight_bytes'], 'B')} "
        f"in {m['weight_dtype']}"
        + (f" (experts in {m['expert_weight_dtype']})" if m.get("expert_weight_dtype") else "")
    )
    if report.get("moe"):
        e = report["moe"]
        con.print(
            f"  experts     {e['num_experts']} routed ({e['experts_per_token']} a token) + "
            f"{e['num_shared_experts']} shared in {e['moe_layers']} MoE layers; active "
            f"{fmt_count(report['active_params'])} of {fmt_count(report['params'])}; B={B:,} "
            f"decode touches {e['experts_touched_per_layer']:.1f} a layer (uniform routing; "
            f"{e['experts_touched_best']}..{e['experts_touched_worst']}): reads "
            f"{fmt_bytes(e['decode_weight_bytes_read'])} of weights"
        )
    for e in report.get("expert_parallel") or []:
        con.print(
            f"  ep={e['ep']:<8} {e['experts_per_device']} experts a layer per device: weights "
            f"{fmt_bytes(e['weight_bytes_per_device'])} each; a step touches "
            f"{e['experts_touched_per_device_per_layer']:.1f} of them ("
            f"{fmt_bytes(e['expert_bytes_read_per_device'])}) and sends "
            f"{fmt_bytes(e['all_to_all_bytes_per_device'])} all-to-all"
        )


def _print_cache(con, report: dict[str, Any]) -> None:
    """The KV cache, a hybrid's states, a quantized cache's scales, the windows' positions."""
    m, wl = report["model"], report["workload"]
    B, S = wl["batch"], wl["context"]
    exceeds = report["kv_exceeds_weights_at_context"]
    con.print(
        f"  KV cache    {fmt_bytes(report['kv_bytes_per_token'], 'KiB')} per token "
        f"({fmt_bytes(report['kv_bytes_per_token_per_layer'], 'KiB')} per layer) "
        f"in {m['kv_dtype']}; {fmt_bytes(report['kv_cache_bytes'])} at S={S:,} x B={B:,}; "
        + (
            f"for B={B:,} {'KV + state' if report.get('state') else ''} larger than the weights "
            f"from S={exceeds:,}"
            if exceeds is not None
            else f"for B={B:,} never larger than the weights (every layer's window is smaller)"
        )
    )
    if line := state_line(report):
        con.print(line)
    if report["kv_scales"] != "none":
        per = report["kv_scale_bytes_per_token_per_layer"]
        kind = report["kv_scales"]
        if kind == "token_head":
            what = f"f32 scales per token per KV head: {per:,} B per token per layer, included"
        elif kind == "group":
            what = (
                f"an f16 scale and zero point per {m['kv_group_size']} elements (KIVI-style, "
                f"closed form only): {per:,g} B per token per layer, included"
            )
        else:
            what = (
                f"one f32 scale per tensor: {report['kv_tensor_scale_bytes']:,} B in all, included"
            )
        con.print(f"  scales      {m['kv_dtype']} cache quantized with {what}")
    held = report["kv_positions_held"]
    if held["sliding_layers"]:
        # Llama 4's chunked layers: a rolling buffer of the chunk (the slots below t mod W read)
        kind, span = ("chunked", "chunk") if m.get("chunked_attention") else ("sliding", "window")
        con.print(
            f"  windows     {held['sliding_layers']} {kind} layers hold "
            f"{held['sliding_positions']:,} positions ({span} {m['sliding_window']:,}"
            + (f" + {m['sink_tokens']:,} sink tokens" if m.get("sink_tokens") else "")
            + "), "
            f"{held['global_layers']} global layers {held['global_positions']:,}: "
            f"{held['total']:,} layer-positions (vs {m['num_layers'] * S:,} without windows)"
        )


def _print_roofline(con, report: dict[str, Any], ratio: str) -> None:
    """The chip's roofline, the decode and step intensities, the attention both ways, the
    extend step, the pages."""
    wl, chip = report["workload"], report["chip"]
    B, S = wl["batch"], wl["context"]
    con.print(
        f"  roofline    {fmt_rate(chip['peak_flops_per_s'], 'FLOP/s')} ({chip['compute_dtype']}), "
        f"{fmt_rate(chip['bandwidth_bytes_per_s'], 'B/s')}: ridge "
        f"{sig(report['ridge_flops_per_byte'])} FLOP/byte"
    )
    con.print(
        f"  decode      intensity {sig(report['decode_intensity'])} FLOP/byte (B={B}); attention "
        f"intensity {sig(report['attention_intensity'])} ({ratio}), "
        f"{sig(report['attention_kernel_intensity'])} with scores and probabilities"
    )
    con.print(
        f"  {wl['phase']:<11} {fmt_count(report['step_flops'])}FLOP, "
        f"{fmt_rate(report['step_bytes'], 'B')}: intensity {sig(report['step_intensity'])}, "
        f"attainable {fmt_rate(report['attainable_flops_per_s'], 'FLOP/s')} = "
        f"{sig(100 * report['fraction_of_peak'])}% of peak"
    )
    if report["attention_kernel"] is not None:
        _print_attention_kernel(con, report["attention_kernel"], wl["phase"])
    if wl["phase"] == "extend":
        con.print(
            f"  extend      T={wl['new_tokens']:,} new tokens per sequence on "
            f"{S - wl['new_tokens']:,} cached: each attends the cache up to itself"
        )
    if report.get("page_size"):
        P, held = report["page_size"], report["kv_positions_held"]
        con.print(
            f"  pages       {P}-token pages: {held['global_positions']:,} positions held per "
            f"sequence and layer at S={S:,}; {fmt_bytes(report['kv_page_waste_bytes'])} of the "
            f"cache is page padding; capacity below counted on pages"
        )


def _print_speculative(con, spec: dict[str, Any]) -> None:
    """The verify step of speculative decoding against plain decoding."""
    draft = (
        f" + {spec['spec_tokens']} steps of {spec['draft_model']} "
        f"({fmt_seconds(spec['draft_step_s'])} each)"
        if spec["draft_model"]
        else " (draft not counted)"
    )
    con.print(
        f"  speculative k={spec['spec_tokens']}, acceptance {spec['acceptance']:g}: "
        f"{sig(spec['expected_tokens_per_step'])} tokens per verify step of "
        f"{spec['spec_tokens'] + 1} (intensity {sig(spec['verify_intensity'])}, bound "
        f"{fmt_seconds(spec['verify_step_s'])}){draft}: {fmt_seconds(spec['s_per_token'])} "
        f"per token vs {fmt_seconds(spec['s_per_token_plain_decode'])} decoding, "
        f"{sig(spec['speedup_over_decode'])}x"
    )


def _print_floors(con, report: dict[str, Any]) -> None:
    """The memory floors and the step's bound; whether the weights and cache fit the chip."""
    wl, mem = report["workload"], report["chip"]["memory_bytes"]
    B, S = wl["batch"], wl["context"]
    floor = report["weight_floor_s_per_token"]
    con.print(
        f"  floors      weights only {fmt_seconds(floor)}/token ({sig(1 / floor)} tokens/s); "
        f"weights + KV {fmt_seconds(report['weights_kv_floor_s_per_token'])}; whole step bound "
        f"{fmt_seconds(report['step_floor_s'])} (unfused kernels: "
        f"{fmt_seconds(report['kernel_sum_bound_s'])})"
    )
    if mem is not None and report["weight_bytes"] > mem:
        con.print(
            f"  memory      the weights alone ({fmt_rate(report['weight_bytes'], 'B')}) exceed one "
            f"chip's {fmt_rate(mem, 'B')}: at least {math.ceil(report['weight_bytes'] / mem)} "
            f"chips are needed before any KV cache"
        )
    elif mem is not None:
        fits = "fits" if report["fits_in_memory"] else "does NOT fit"
        longest = report["max_context_at_batch"]
        longest = "any S" if longest is None else f"S={longest:,}"
        con.print(
            f"  memory      weights + KV cache {fits} in {fmt_rate(mem, 'B')}; at most "
            f"B={report['max_batch_at_context']:,} at S={S:,}, "
            f"or {longest} at B={B:,} (activations not counted)"
        )


def _print_variants(con, variants: list[dict[str, Any]], phase: str) -> None:
    """--variants: the KV cache, parameters, floor and intensities of MHA, GQA, MQA (and MLA)."""
    from rich.table import Table

    t = Table(title="KV cache by attention variant (sizes binary: KiB, GiB, TiB)")
    mla_note = variants[0]["params"] is None
    for col in ("variant", "h_kv", "per token"):
        t.add_column(col, justify="right")
    for c in variants[0]["cache"]:
        t.add_column(f"{c['context'] // 1024}k ctx x {c['batch']} seq", justify="right")
    for col in ("vs MHA", "params", "B=1 floor", "attn I"):
        t.add_column(col, justify="right")
    for col in (f"{phase} attn I unfused", f"{phase} attn I fused"):
        t.add_column(col, justify="right")
    for row in variants:
        t.add_row(
            row["variant"],
            str(row["num_kv_heads"]),
            fmt_bytes(row["kv_bytes_per_token"], "KiB"),
            *(fmt_bytes(c["kv_cache_bytes"]) for c in row["cache"]),
            f"{sig(row['cache_reduction_vs_mha'])}x smaller"
            if row["cache_reduction_vs_mha"] != 1
            else "baseline",
            "n/a" if row["params"] is None else fmt_count(row["params"]),
            "n/a"
            if row["weight_floor_s_per_token"] is None
            else fmt_seconds(row["weight_floor_s_per_token"]),
            sig(row["attention_intensity"]),
            *(
                ("n/a", "n/a")
                if row.get("attention_kernel") is None
                else (sig(row["attention_kernel"][k]["intensity"]) for k in ("xla", "flash"))
            ),
        )
    con.print(t)
    if mla_note:
        con.print(
            "  (MHA/GQA/MQA rows of an MLA model: K heads of keys (head_dim) and values "
            "(v_head_dim) cached; weights not sized)"
        )


def _print_kernels(con, report: dict[str, Any]) -> None:
    """The step's kernels summed over layers, each on the roofline."""
    from rich.table import Table

    t = Table(title=f"kernels of the {report['workload']['phase']} step (summed over layers)")
    for col in ("kernel", "FLOPs", "bytes", "FLOP/byte", "bound", "side"):
        t.add_column(col, justify="left" if col in ("kernel", "side") else "right")
    for k in report["kernels"]:
        t.add_row(
            k["name"],
            fmt_count(k["flops"]) if k["flops"] else "0",
            fmt_rate(k["bytes"], "B"),
            sig(k["intensity"]) if k["flops"] else "0",
            fmt_seconds(k["bound_s"]),
            k["bound"],
        )
    con.print(t)


def _print_attention_kernel(con, att: dict[str, Any], phase: str) -> None:
    """The step's attention both ways: XLA's einsums and the fused kernel, on the roofline."""
    x, f = att["xla"], att["flash"]
    tiles = f"{att['block_q']} x {att['block_k']} tiles"
    if phase == "decode":
        tiles += f", cache in {att['splits']} splits"
    con.print(
        f"  attention   {'fused (flash)' if att['kernel'] == 'flash' else 'xla (unfused)'} counted "
        f"above. xla: {fmt_count(x['flops'])}FLOP, {fmt_rate(x['bytes'], 'B')}, {x['bound']}-"
        f"bound {fmt_seconds(x['bound_s'])}; flash ({tiles}): {fmt_count(f['flops'])}FLOP = "
        f"{sig(att['flash_over_exact_flops'])}x the exact causal pairs, "
        f"{fmt_rate(f['bytes'], 'B')} (Q+K+V+O {fmt_rate(att['qkvo_bytes'], 'B')}), intensity "
        f"{sig(f['intensity'])}, {f['bound']}-bound {fmt_seconds(f['bound_s'])}"
    )
