"""The serving questions of the seed in closed form, model and trace: the extend step (T new
tokens on a cache), speculative decoding, paged caches, the throughput-latency frontier."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import kernels
from kvjax.analytic import Workload, max_batch_that_fits, serving, step_kernels
from kvjax.analytic.sizes import kv_cache_bytes, kv_positions_held, paged, weight_bytes
from kvjax.errors import KvjaxError
from kvjax.hardware import get_chip
from kvjax.model.config import get_model_config
from kvjax.nn.transformer import Transformer

H100 = get_chip("h100-sxm")


def test_hand_derivations_of_capacity_pages_and_speculation():
    """llama-3-8b on an 80 GB H100 at S = 8192, bf16 KV, no pages, activations aside: 59
    sequences; MQA (K/V projections of one head) 479; pages of 16 at S = 8001 hold 8016
    positions; acceptance 0.8 with k = 4 yields 3.3616 tokens a verify step."""
    cfg = get_model_config("llama-3-8b")
    L, D, H = 32, 4096, 128
    per_seq = 2 * L * 8 * H * 8192 * 2  # 2 L h_kv d_h S bytes
    assert (80e9 - weight_bytes(cfg)) // per_seq == 59 == max_batch_that_fits(cfg, 80e9, 8192)
    mqa = cfg.replace(num_kv_heads=1)
    assert weight_bytes(cfg) - weight_bytes(mqa) == 2 * L * D * 7 * H * 2  # k and v: 7 heads fewer
    assert max_batch_that_fits(mqa, 80e9, 8192) == 479
    assert paged(8001, 16) == 8016 and paged(8001) == 8001 and paged(16, 16) == 16
    assert kv_positions_held(cfg, 8001, 16)["total"] == 32 * 8016
    assert kv_cache_bytes(cfg, 8001, 3, 16) == 3 * 32 * 8016 * 2 * 8 * 128 * 2
    assert max_batch_that_fits(cfg, 80e9, 8001, 16) == max_batch_that_fits(cfg, 80e9, 8016)
    assert serving.expected_tokens(4, 0.8) == pytest.approx(3.3616)
    assert serving.expected_tokens(3, 1.0) == 4 and serving.expected_tokens(2, 0.0) == 1
    for bad, words in (((0, 0.5), "spec_tokens=0"), ((2, 1.5), "acceptance=1.5")):
        with pytest.raises(KvjaxError, match=words):
            serving.expected_tokens(*bad)
    with pytest.raises(KvjaxError, match="page_size=-1"):
        paged(10, -1)


def test_speculative_verify_step_is_an_extend_of_k_plus_one():
    """The verify step reads the weights once for B(k + 1) tokens: its FLOPs are about k + 1
    times decode's, its bytes barely more, so per generated token it costs verify / E."""
    cfg = get_model_config("llama-3-8b")
    wl = Workload("decode", 1, 8192)
    out = serving.speculative(cfg, wl, H100, 4, 0.8)
    verify = step_kernels(cfg, Workload("extend", 1, 8196, new_tokens=5), H100)
    assert out["verify_flops"] == sum(k.flops for k in verify.values())
    decode = step_kernels(cfg, wl, H100)
    assert out["verify_flops"] / sum(k.flops for k in decode.values()) == pytest.approx(5, rel=0.02)
    assert out["verify_bytes"] / sum(k.bytes for k in decode.values()) < 1.1
    assert out["s_per_token"] == pytest.approx(out["verify_step_s"] / 3.3616)
    assert 3 < out["speedup_over_decode"] < 3.3616
    drafted = serving.speculative(
        cfg, wl, H100, 4, 0.8, draft=cfg.replace(num_layers=2, name="draft")
    )
    assert drafted["s_per_token"] == pytest.approx(
        (drafted["verify_step_s"] + 4 * drafted["draft_step_s"]) / 3.3616
    )
    with pytest.raises(KvjaxError, match="applies to --phase decode"):
        serving.speculative(cfg, Workload("prefill", 1, 64), H100, 4, 0.8)


def test_frontier_ends_where_memory_ends_and_never_beats_the_weights_floor():
    cfg = get_model_config("llama-3-8b")
    f = serving.frontier(cfg, H100, 8192)
    points = f["points"]
    assert points[-1]["batch"] == f["max_batch"] <= 59
    assert [p["batch"] for p in points[:3]] == [1, 2, 4]
    tps = [p["tokens_per_s"] for p in points]
    assert tps == sorted(tps)
    assert all(p["ms_per_token"] >= f["weights_floor_ms_per_token"] for p in points)
    assert all(p["memory_bytes"] <= H100.memory_bytes for p in points)
    over = serving.step_memory_bytes(cfg, Workload("decode", f["max_batch"] + 1, 8192))
    assert over > H100.memory_bytes  # one more sequence does not fit
    # chunked prefill: the chunks' extend steps; one chunk as long as the prompt is the prefill
    whole = serving.time_to_first_token_s(cfg, H100, 4096)
    assert serving.time_to_first_token_s(cfg, H100, 4096, chunk=4096) == whole
    assert 0 < serving.time_to_first_token_s(cfg, H100, 4096, chunk=1024) < whole


def test_extend_refuses_what_the_model_does_not_run():
    cfg = get_model_config("tiny-gqa", sliding_window=4, layer_pattern="LG")
    with pytest.raises(KvjaxError, match="sliding-window"):
        step_kernels(cfg, Workload("extend", 1, 16, new_tokens=4))
    # the closed form covers fused attention, MLA and 1-byte caches; the model's extend does not
    for over, words in (({"attention_kernel": "flash"}, "attention_kernel='flash'"),
                        ({"kv_dtype": "int8"}, "a scaled kv_dtype='int8'")):  # fmt: skip
        cfg = get_model_config("tiny-gqa", **over)
        assert step_kernels(cfg, Workload("extend", 1, 16, new_tokens=4))
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        with pytest.raises(KvjaxError, match=words):
            model.extend(jnp.zeros((1, 4), jnp.int32), model.init_cache(1, 16))
    with pytest.raises(KvjaxError, match="new_tokens=17 must lie in 1 .. context=16"):
        Workload("extend", 1, 16, new_tokens=17)


def test_fused_extend_chunks_add_up_to_the_prefill():
    """A fused extend of more than a few queries is prefill's block loop over the cache with the
    causal offset S - T: at T = S it is the prefill kernel (a cache in the compute dtype), and
    8,192 prompt tokens in chunks of 512 (whole query tiles) compute exactly the prefill's
    block-causal pairs. A 1-byte cache is read at 1 byte a position-element."""
    from kvjax.analytic import flash

    cfg = get_model_config("llama-3-8b", attention_kernel="flash")
    pre = step_kernels(cfg, Workload("prefill", 1, 8192), H100)[kernels.ATTENTION]
    whole = step_kernels(cfg, Workload("extend", 1, 8192, new_tokens=8192), H100)
    fused = whole[kernels.ATTENTION]
    assert (fused.flops, fused.bytes) == (pre.flops, pre.bytes)
    chunks = [step_kernels(cfg, Workload("extend", 1, c + 512, new_tokens=512), H100)
              for c in range(0, 8192, 512)]  # fmt: skip
    assert sum(k[kernels.ATTENTION].flops for k in chunks) == pre.flops
    assert kernels.ATTN_COMBINE not in chunks[-1]  # no flash-decoding partials to spill
    few = step_kernels(cfg, Workload("extend", 1, 8192, new_tokens=flash.DECODE_FORM_MAX_QUERIES),
                       H100)  # fmt: skip
    assert kernels.ATTN_COMBINE in few  # a verify step's few queries: flash-decoding
    fp8 = cfg.replace(kv_dtype="fp8")
    chunk = Workload("extend", 1, 8192, new_tokens=512)
    half = flash.plan_for_chip(fp8, chunk, H100)
    shape = flash.attention_shape(fp8, "prefill")
    positions, _ = flash.hbm_kv_positions(512, 8192, half, 4, 8, 2 * 128, 0)
    L, N, H = 32, 32, 128
    q_o = 2 * 512 * N * H * 2
    assert step_kernels(fp8, chunk, H100)[kernels.ATTENTION].bytes == L * (
        q_o + 8 * positions * 2 * shape.key_width * 1
    )


def test_mla_extend_is_its_prefill_over_the_cached_latents():
    """MLA's extend expands every cached latent (kv_b_proj over S positions) and runs MHA of the
    T queries over them: at T = S its expansion, scores and av are prefill's."""
    cfg = get_model_config("tiny-mla", weight_dtype="f32", kv_dtype="f32")
    pre = step_kernels(cfg, Workload("prefill", 2, 64))
    ext = step_kernels(cfg, Workload("extend", 2, 64, new_tokens=64))
    for name in (kernels.KV_B_PROJ, kernels.SCORES, kernels.AV):
        assert (ext[name].flops, ext[name].bytes) == (pre[name].flops, pre[name].bytes), name
    assert ext[kernels.KV_WRITE].bytes == pre[kernels.KV_WRITE].bytes
    chunk = step_kernels(cfg, Workload("extend", 2, 64, new_tokens=16))
    A, N, U, W = 20, 12, 6, 7  # tiny-mla: kv_lora_rank, heads, nope and value widths
    assert chunk[kernels.KV_B_PROJ].flops == 2 * 2 * 64 * A * N * (U + W) * cfg.num_layers


@pytest.mark.parametrize("kv_heads", [1, 3, 12], ids=["mqa", "gqa", "mha"])
def test_extend_equals_the_full_forward(kv_heads):
    """A prompt prefilled, then T tokens extended on the cache (a second sequence at another
    position), gives the full forward's logits of those positions; the cache then decodes on."""
    cfg = get_model_config("tiny-gqa", num_kv_heads=kv_heads, num_layers=2, weight_dtype="f32",
                           kv_dtype="f32")  # fmt: skip
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(4), (2, 12), 0, cfg.vocab_size)
    want = np.asarray(model(ids))
    cache = model.init_cache(2, 12)
    _, cache = model.prefill(ids[:, :5], cache, lengths_B=jnp.array([5, 3]))
    got, cache = jax.jit(lambda m, t, c: m.extend(t, c))(model, ids[:, 5:9].at[1].set(ids[1, 3:7]),
                                                        cache)  # fmt: skip
    np.testing.assert_allclose(np.asarray(got[0]), want[0, 5:9], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), want[1, 3:7], atol=1e-5, rtol=1e-5)
    assert np.asarray(cache.pos).tolist() == [9, 7]
    step, _ = model.decode(jnp.array([ids[0, 9], ids[1, 7]]), cache)
    np.testing.assert_allclose(np.asarray(step[0]), want[0, 9], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(step[1]), want[1, 7], atol=1e-5, rtol=1e-5)
    with pytest.raises(KvjaxError, match="cannot extend by T=4: sequence 0 holds 9 positions"):
        model.extend(ids[:, :4], cache)


@pytest.mark.parametrize("T", [1, 5, 64])
def test_extend_trace_equals_the_closed_form_per_kernel(T):
    """The extend step at T in {1, 5, 64} on a cache of 100, traced (lowered) against the closed
    form: every kernel's FLOPs exact; the products' bytes too (the write and the softmax move
    more, as `kernels.bytes_note` explains for prefill and decode)."""
    from kvjax.traced.step import compare, trace_step

    cfg = get_model_config("tiny-gqa", num_layers=2)
    trace = trace_step(cfg, "extend", 2, 100, new_tokens=T)
    rows = {r.name: r for r in compare(trace)}
    closed = step_kernels(cfg, Workload("extend", 2, 100, new_tokens=T))
    for name in closed:
        assert rows[name].traced_flops == closed[name].flops, (name, rows[name])
    for name in (kernels.Q_PROJ, kernels.SCORES, kernels.AV, kernels.LM_HEAD):  # unfused: exact
        assert rows[name].traced_bytes == pytest.approx(closed[name].bytes, rel=0.01), name


def test_frontier_command_json(capsys):
    """`kvjax frontier --model llama-3-8b --chip h100-sxm --context 8192 --variants --json`: each
    variant's last point is its max_batch, tokens/s rises with B, ms/token never falls below
    the weights floor, and GQA/MQA/MLA reach more tokens/s than MHA at MHA's slowest ms/token."""
    import json

    from kvjax.cli.main import main

    argv = ["frontier", "--model", "llama-3-8b", "--chip", "h100-sxm", "--context", "8192",
            "--variants", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    curves = {c["variant"].split()[0]: c for c in report["variants"]}
    assert set(curves) == {"MHA", "GQA", "MQA", "MLA"}
    for name, c in curves.items():
        points = c["points"]
        assert points[-1]["batch"] == c["max_batch"] == report["max_batch"][c["variant"]]
        tps = [p["tokens_per_s"] for p in points]
        assert tps == sorted(tps), name
        assert min(p["ms_per_token"] for p in points) >= c["weights_floor_ms_per_token"], name
    assert curves["GQA"]["max_batch"] == 59 and curves["MQA"]["max_batch"] == 474  # activations

    def tokens_at(curve, ms):  # the best tokens/s a curve reaches within `ms` per token
        return max(p["tokens_per_s"] for p in curve["points"] if p["ms_per_token"] <= ms)

    worst_mha = max(p["ms_per_token"] for p in curves["MHA"]["points"])
    for name in ("GQA", "MQA", "MLA"):
        assert tokens_at(curves[name], worst_mha) > tokens_at(curves["MHA"], worst_mha), name
    assert main(argv[:-1] + ["--page-size", "16"]) == 0  # the table renders, on pages
    assert "max batch 59" in capsys.readouterr().out


def test_calc_extend_pages_and_speculation(capsys):
    import json

    from kvjax.cli.main import main

    base = ["calc", "--model", "llama-3-8b", "--json"]
    assert main([*base, "--phase", "extend", "--context", "8001", "--new-tokens", "5",
                 "--page-size", "16"]) == 0  # fmt: skip
    r = json.loads(capsys.readouterr().out)
    assert r["workload"]["new_tokens"] == 5 and r["attention_kernel"] is None
    assert r["kv_positions_held"]["global_positions"] == 8016
    assert r["kv_page_waste_bytes"] == 32 * 15 * 2 * 8 * 128 * 2  # 15 padded positions a layer
    closed = step_kernels(get_model_config("llama-3-8b"), Workload("extend", 1, 8001, new_tokens=5))
    assert r["step_flops"] == sum(k.flops for k in closed.values())
    assert main([*base, "--spec-tokens", "4", "--acceptance", "0.8"]) == 0
    spec = json.loads(capsys.readouterr().out)["speculative"]
    assert spec["expected_tokens_per_step"] == pytest.approx(3.3616)
    assert main(base[:-1] + ["--spec-tokens", "4", "--acceptance", "0.8"]) == 0
    assert "3.36 tokens per verify step" in capsys.readouterr().out
    for argv, words in (
        ([*base, "--spec-tokens", "4"], "needs --spec-tokens K and --acceptance A"),
        ([*base, "--phase", "extend"], "--phase extend needs --new-tokens T"),
        ([*base, "--new-tokens", "3"], "--new-tokens applies to --phase extend"),
        ([*base, "--model", "tiny-lfm2", "--phase", "extend", "--new-tokens", "2"], "state layers"),
    ):
        assert main(argv) == 2, argv
        assert words in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--acceptance", "1.5"])


def test_serving_frontier_experiment_and_figure(tmp_path):
    """configs/serving_frontier.yaml's points as records (llama-3-8b on one chip, the 70B on 8,
    deepseek-v3 on 8 two ways), each curve ending at its max batch; the figure draws them."""
    import pandas as pd

    from kvjax.plotting import make_figures
    from kvjax.runs.launcher import run_config

    runs = run_config("configs/serving_frontier.yaml", runs_root=tmp_path / "runs", progress=False)
    records = pd.DataFrame([r for run in runs for r in run.records()])
    assert set(records.model) == {"llama-3-8b", "seed-70b", "deepseek-v3"}
    assert set(zip(records.tp, records.dp_attention, records.ep, strict=True)) == {(1, 1, 1),
        (8, 1, 1), (1, 8, 8)}  # fmt: skip
    gqa = records[(records.model == "llama-3-8b") & (records.variant == "GQA")
                  & (records.kv_dtype == "bf16") & (records.context == 8192)
                  & (records.chip == "h100-sxm")]  # fmt: skip
    f = serving.frontier(get_model_config("llama-3-8b", attention_kernel="flash"), H100, 8192,
                         label="GQA")  # fmt: skip
    assert list(gqa.batch) == [p["batch"] for p in f["points"]]
    assert list(gqa.tokens_per_s) == pytest.approx([p["tokens_per_s"] for p in f["points"]])
    # MLA over tp = 8: the latent replicated on every device (kvjax.analytic.parallel), drawn
    seventy = records[(records.model == "seed-70b") & records.variant.str.startswith("MLA")]
    assert len(seventy) and seventy.note.isna().all() and (seventy.tokens_per_s > 0).all()
    written = make_figures(records.assign(experiment="serving_frontier"), tmp_path / "figs")
    assert "serving_frontier.png" in {p.name for p in written}


def test_extend_is_measured_alone_and_as_served():
    """`kvjax bench --phase extend`: the attention over the written cache timed alone (its closed
    form the extend step's scores + softmax + av) and the served step (T tokens on a donated
    cache of S - T, positions rewound each step), each beside XLA's bytes."""
    from kvjax.analytic import attention_cost, step_cost
    from kvjax.hardware import chip_from_numbers
    from kvjax.measured.bench import bench_point

    cfg = get_model_config("tiny-gqa", num_layers=1)
    wl = Workload("extend", 2, 64, new_tokens=4)
    ceilings = chip_from_numbers(100e9, 10e9, dtype="f32")
    by = {p["kernel"]: p for p in bench_point(cfg, wl, ceilings, budget_s=0.05)}
    assert by[kernels.ATTENTION]["closed_bytes"] == attention_cost(cfg, wl).bytes
    assert by[kernels.STEP_KERNEL]["closed_bytes"] == step_cost(cfg, wl).bytes
    assert by[kernels.Q_PROJ]["traced_bytes"] == pytest.approx(by[kernels.Q_PROJ]["closed_bytes"])
    assert all(p["median_s"] > 0 for p in by.values())


def test_eviction_quality_experiment_pairs_the_same_weights(tmp_path):
    """experiments/eviction_quality.py on a few steps: per seed the full cache, s sinks + a
    window and a plain window of each budget, from the same weights; a budget as long as the
    sequence evicts nothing (its loss is the full cache's)."""
    import pandas as pd

    from kvjax.runs.launcher import run_config

    config = tmp_path / "c.yaml"
    config.write_text(
        "experiment: eviction_quality\nmodel:\n  preset: tiny-gqa\n  num_layers: 2\n"
        "  vocab_size: 256\noptions:\n  task: stdlib\n  steps: 3\n  batch_size: 2\n"
        "  seq_len: 32\n  eval_every: 3\n  eval_batches: 1\n  max_bytes: 65536\n"
        "  budgets: [[8, 2], [32, 4]]\n"
    )
    (run,) = run_config(config, runs_root=tmp_path / "runs", progress=False)
    df = pd.DataFrame(run.records()).set_index(["eviction", "kv_budget"])
    assert set(df.index) == {("full", 32), ("sinks + window", 8), ("window", 8),
                             ("sinks + window", 32), ("window", 32)}  # fmt: skip
    full = df.loc[("full", 32), "val_loss"]
    assert df.loc[("window", 32), "val_loss"] == pytest.approx(full, rel=1e-6)
    assert df.loc[("sinks + window", 32), "val_loss"] == pytest.approx(full, rel=1e-6)
    assert df.loc[("window", 8), "val_loss"] != pytest.approx(full, rel=1e-6)


def test_frontier_experiment_on_a_deepseek_placement(tmp_path):
    """configs/serving_frontier_deepseek_dp8_ep8.yaml's records: the placement's curve, per chip
    (the README's DP8 + EP8 row), with its split in every record."""
    from kvjax.runs.launcher import run_experiment
    from kvjax.runs.records import load_records

    run_experiment("configs/serving_frontier_deepseek_dp8_ep8.yaml", runs_root=tmp_path,
                   progress=False)  # fmt: skip
    records = load_records(tmp_path).to_dict("records")
    cfg = get_model_config("deepseek-v3", weight_dtype="fp8", attention_kernel="flash")
    curve = serving.frontier(cfg, get_chip("h200"), 32768, ep=8, dp_attention=8)
    assert [r["batch"] for r in records] == [p["batch"] for p in curve["points"]]
    assert {(r["ep"], r["dp_attention"], r["devices"], r["max_batch"]) for r in records} == {
        (8, 8, 8, curve["max_batch"])}  # fmt: skip
    assert records[-1]["tokens_per_s"] == pytest.approx(curve["points"][-1]["tokens_per_s"])
