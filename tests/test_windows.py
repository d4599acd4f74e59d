"""Sliding-window layers in the three views: the closed form's cache against hand derivations, the
trace against the closed form per kernel (rolling buffer included), the model's rolling cache
against its own uncached forward. (Parity with transformers' Mistral: tests/test_nn_hf.py.)"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvjax import KvjaxError, analytic, get_model_config, kernels
from kvjax.analytic import Workload
from kvjax.model.hf import from_hf_config
from kvjax.nn import Transformer, generate
from kvjax.traced.step import trace_step

GiB = 2**30


def test_mistral_7b_v01_cache_at_32k_is_half_a_gib():
    cfg = get_model_config("mistral-7b")  # the preset's source: "sliding_window": 4096
    assert (cfg.sliding_window, cfg.num_sliding_layers) == (4096, 32)
    # 32 layers x 4096 positions x (2 x 8 x 128 x 2 bytes) = 0.5 GiB, the paper's 8x at 32k
    assert analytic.kv_cache_bytes(cfg, 32768) == 32 * 4096 * 4096 == GiB // 2
    no_window = cfg.replace(sliding_window=0, layer_pattern="G")
    assert analytic.kv_cache_bytes(no_window, 32768) == 4 * GiB
    assert analytic.kv_cache_bytes(cfg, 4096) == analytic.kv_cache_bytes(no_window, 4096)
    assert analytic.kv_exceeds_weights_at_context(cfg) is None  # 0.5 GiB never passes 13.5 GiB
    assert analytic.kv_exceeds_weights_at_context(cfg, batch=64) == 1727  # before the window


def test_gemma_3_27b_cache_by_hand():
    # Gemma 3 27B (google/gemma-3-27b-it text_config): 62 layers, 16 KV heads of 128, five local
    # layers of 1024 per global one: 52 local, 10 global.
    cfg = get_model_config("gemma-3-27b")
    held = analytic.kv_positions_held(cfg, 32768)
    assert (held["sliding_layers"], held["global_layers"]) == (52, 10)
    per_position = 2 * 16 * 128 * 2  # 8 KiB per layer per token in bf16
    want = (10 * 32768 + 52 * 1024) * per_position
    assert analytic.kv_cache_bytes(cfg, 32768) == want
    assert round(want / GiB, 2) == 2.91
    every_global = cfg.replace(sliding_window=0, layer_pattern="G")
    assert round(analytic.kv_cache_bytes(every_global, 32768) / GiB, 1) == 15.5
    # past the window only the 10 global layers grow: one more token costs 10 x 8 KiB
    assert analytic.kv_cache_bytes(cfg, 40001) - analytic.kv_cache_bytes(cfg, 40000) == 10 * 8192


def test_max_context_and_the_crossover_follow_the_windows():
    cfg = get_model_config("tiny-gqa", sliding_window=16, layer_pattern="LG")  # 1 local, 1 global
    per = analytic.kv_bytes_per_token_per_layer(cfg)
    fits = analytic.max_context_that_fits(cfg, analytic.weight_bytes(cfg) + 100 * per, 1)
    # 100 layer-positions: both layers hold S while S <= 16 (32 rows), then the global one grows
    assert fits == 100 - 16
    assert analytic.kv_cache_bytes(cfg, fits) <= 100 * per < analytic.kv_cache_bytes(cfg, fits + 1)
    all_local = cfg.replace(layer_pattern="L")
    assert (
        analytic.max_context_that_fits(all_local, analytic.weight_bytes(cfg) + 100 * per, 1) is None
    )


@pytest.mark.parametrize("pattern,window", [("L", 4), ("LG", 4), ("GLL", 5), ("L", 9), ("L", 20)])
@pytest.mark.parametrize("phase,batch,context", [("prefill", 1, 7), ("prefill", 3, 12),
                                                 ("decode", 1, 7), ("decode", 3, 12)])  # fmt: skip
@pytest.mark.parametrize("dtype", ["f32", "bf16+fp8"])
def test_windowed_traces_match_the_closed_form(pattern, window, phase, batch, context, dtype):
    from test_traced_step import check_against_closed_form

    weights, kv = dtype.split("+") if "+" in dtype else (dtype, dtype)
    cfg = get_model_config("tiny-gqa", num_layers=3, sliding_window=window, layer_pattern=pattern,
                           weight_dtype=weights, kv_dtype=kv)  # fmt: skip
    check_against_closed_form(trace_step(cfg, phase, batch, context))
    one = trace_step(cfg, phase, batch, context, layers="one")  # one layer of each kind, scaled
    assert one.total.flops == trace_step(cfg, phase, batch, context).total.flops


def test_rolling_decode_reads_the_window_whatever_s():
    cfg = get_model_config("tiny-gqa", sliding_window=16, layer_pattern="L")
    attention = (kernels.SCORES, kernels.SOFTMAX, kernels.AV)
    seen = []
    for context in (64, 256, 1024):
        by = trace_step(cfg, "decode", 2, context).by_kernel()
        seen.append([(by[k].flops, by[k].bytes) for k in attention])
    assert seen[0] == seen[1] == seen[2]  # past the window, nothing grows with S
    full = cfg.replace(sliding_window=0, layer_pattern="G")
    grows = [trace_step(full, "decode", 2, s).by_kernel()[kernels.SCORES].bytes for s in (64, 256)]
    assert grows[1] > 3 * grows[0]


@pytest.mark.parametrize("pattern,window,max_len", [("L", 4, 16), ("LG", 4, 16), ("LLG", 5, 16),
                                                    ("L", 20, 16)])  # fmt: skip
@pytest.mark.parametrize("prefix", [2, 7])
def test_rolling_cache_decodes_what_the_banded_forward_computes(pattern, window, max_len, prefix):
    cfg = get_model_config("tiny-gqa", num_layers=3, sliding_window=window, layer_pattern=pattern)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
    full = model(ids)
    unwindowed = Transformer(cfg.replace(sliding_window=0, layer_pattern="G"), rngs=nnx.Rngs(0))
    if window < 12:
        assert float(jnp.abs(unwindowed(ids) - full).max()) > 0.1  # the window matters
    cache = model.init_cache(2, max_len)
    logits, cache = model.prefill(ids[:, :prefix], cache)
    out = [logits]
    for t in range(prefix, 12):
        step, cache = model.decode(ids[:, t], cache)
        out.append(step[:, None])
    np.testing.assert_allclose(np.asarray(jnp.concatenate(out, 1)), np.asarray(full), atol=2e-5)
    lens = [k.shape[-1] for k in cache.k]
    assert lens == [min(window, max_len) if cfg.layer_is_sliding(i) else max_len for i in range(3)]
    assert cache.nbytes == analytic.kv_cache_bytes(cfg, max_len, 2)


def test_rolling_cache_with_padded_prompts_and_past_max_len():
    cfg = get_model_config("tiny-gqa", sliding_window=3, layer_pattern="L")
    model = Transformer(cfg, rngs=nnx.Rngs(2))
    a, b = (jax.random.randint(jax.random.key(i), (n,), 0, 97) for i, n in ((1, 7), (2, 5)))
    prompt = jnp.stack([a, jnp.concatenate([b, jnp.zeros(2, jnp.int32)])])
    out = generate(model, prompt, 6, lengths_B=jnp.asarray([7, 5]))
    np.testing.assert_array_equal(out[0], generate(model, a[None], 6)[0])
    np.testing.assert_array_equal(out[1], generate(model, b[None], 6, use_cache=False)[0])
    # every layer rolls: a cache of 8 slots (3 used) decodes past 8 positions
    assert model.init_cache(1, 8).max_len == 2**31 - 1
    assert generate(model, a[None], 12, max_len=8).shape == (1, 12)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"layer_pattern": "LX"}, "layer_pattern='LX' must be a string of G"),
        ({"layer_pattern": "L"}, "has sliding (L) layers but sliding_window=0"),
        ({"sliding_window": 8}, "sliding_window=8 but layer_pattern='G' has no sliding"),
        ({"sliding_window": -1}, "sliding_window=-1 must be a non-negative integer"),
    ],
)
def test_bad_window_configs_name_the_field(changes, message):
    with pytest.raises(KvjaxError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_model_config("tiny-gqa", **changes)


@pytest.mark.parametrize(
    "extra,want",
    [
        ({"model_type": "mistral", "sliding_window": 4096}, (4096, "L")),
        ({"model_type": "mistral", "sliding_window": None}, (0, "G")),
        ({"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False}, (0, "G")),
        (
            {
                "model_type": "qwen2",
                "sliding_window": 64,
                "use_sliding_window": True,
                "max_window_layers": 2,
            },
            (64, "GGLL"),
        ),  # fmt: skip
        (
            {
                "model_type": "llama",
                "sliding_window": 64,
                "layer_types": ["sliding_attention", "full_attention"] * 2,
            },
            (64, "LG"),  # an explicit list is written as its period
        ),  # fmt: skip
    ],
)
def test_hf_config_windows(tmp_path, extra, want):
    data = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
            "num_hidden_layers": 4, "num_key_value_heads": 2, "vocab_size": 50}  # fmt: skip
    data.update(extra)
    (tmp_path / "config.json").write_text(json.dumps(data))
    cfg = from_hf_config(tmp_path)
    assert (cfg.sliding_window, cfg.layer_pattern) == want


def test_hf_layer_types_of_the_wrong_length_are_refused(tmp_path):
    data = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
            "num_hidden_layers": 4, "vocab_size": 50, "sliding_window": 8,
            "layer_types": ["sliding_attention"] * 3}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(KvjaxError, match="layer_types must list 4 entries"):
        from_hf_config(tmp_path)


def test_decode_workload_of_a_window_attends_it():
    cfg = get_model_config("mistral-7b")
    ks = analytic.layer_kernels(cfg, Workload("decode", 1, 32768), sliding=True)
    assert ks[kernels.SCORES].kv_bytes == 4096 * 8 * 128 * 2  # the 4096 slots of K


def test_calc_reports_the_window_split_and_takes_window_flags(capsys):
    from kvjax.cli import main

    def calc(*flags):
        assert main(["calc", "--json", "--model", "mistral-7b", "--context", "32k", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    out = calc()
    assert out["kv_cache_bytes"] == GiB // 2 and out["kv_exceeds_weights_at_context"] is None
    assert out["kv_positions_held"] == {
        "global_layers": 0, "sliding_layers": 32, "global_positions": 32768,
        "sliding_positions": 4096, "total": 32 * 4096,
    }  # fmt: skip
    assert calc("--sliding-window", "0", "--layer-pattern", "G")["kv_cache_bytes"] == 4 * GiB
    assert main(["calc", "--model", "mistral-7b", "--sliding-window", "0"]) == 2
    assert "has sliding (L) layers but sliding_window=0" in capsys.readouterr().err


@pytest.mark.parametrize("phase,batch,context", [("prefill", 1, 5), ("prefill", 3, 12),
                                                 ("decode", 1, 7), ("decode", 3, 12)])  # fmt: skip
@pytest.mark.parametrize("pattern", ["L", "GLL"])
def test_sink_tokens_trace_as_the_closed_form_counts(pattern, phase, batch, context):
    """Eviction to a budget (StreamingLLM: s sinks + a window of W): the traced step equals the
    closed form per kernel (the rolling slot's 4 more ops a sequence, the band's sink compare
    and or, the ring's gather past s + W), and decoding past the budget reads s + W rows."""
    from test_traced_step import check_against_closed_form

    cfg = get_model_config("tiny-gqa", num_layers=3, sliding_window=4, layer_pattern=pattern,
                           sink_tokens=2)  # fmt: skip
    check_against_closed_form(trace_step(cfg, phase, batch, context))
    held = analytic.kv_positions_held(cfg, 100)
    assert held["sliding_positions"] == 6 and held["total"] == 100 * held["global_layers"] + 6 * (
        3 - held["global_layers"]
    )  # fmt: skip


def test_sink_cache_holds_sinks_and_window_and_decodes_past_them():
    cfg = get_model_config("tiny-gqa", sliding_window=3, layer_pattern="L", sink_tokens=2)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    cache = model.init_cache(2, 16)
    assert {k.shape[-1] for k in cache.k} == {5} and cache.max_len == 2**31 - 1
    assert cache.nbytes == analytic.kv_cache_bytes(cfg, 16, 2)
    ids = jax.random.randint(jax.random.key(3), (1, 20), 0, cfg.vocab_size)
    np.testing.assert_array_equal(generate(model, ids[:, :4], 12, max_len=6),
                                  generate(model, ids[:, :4], 12, use_cache=False))  # fmt: skip
    for changes, words in (({"sink_tokens": 2}, "sink_tokens=2 keeps tokens beside a sliding"),
                           ({"sink_tokens": -1, "sliding_window": 3, "layer_pattern": "L"},
                            "sink_tokens=-1 must be")):  # fmt: skip
        with pytest.raises(KvjaxError, match=words):
            get_model_config("tiny-gqa", **changes)
    with pytest.raises(KvjaxError, match="sink_tokens=2 is not supported"):
        Transformer(cfg.replace(attention_kernel="flash"), rngs=nnx.Rngs(0))


def test_calc_evicts_to_a_budget(capsys):
    """`--kv-budget N --sink-tokens s`: every layer holds N positions, whatever S."""
    import json

    from kvjax.cli.main import main

    argv = ["calc", "--model", "llama-3-8b", "--context", "131072", "--kv-budget", "4096",
            "--sink-tokens", "4", "--json"]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["model"]["sliding_window"] == 4092 and r["model"]["sink_tokens"] == 4
    assert r["kv_cache_bytes"] == 32 * 4096 * 2 * 8 * 128 * 2  # N positions a layer, not S
    assert main(argv[:-3] + ["--sink-tokens", "4096"]) == 2
    assert "--kv-budget 4096 must exceed --sink-tokens 4096" in capsys.readouterr().err
