"""The sharded program's trace: collectives parsed from HLO text, per-device FLOPs and collective
bytes of the compiled module against kvjax.analytic.parallel's closed form (8 simulated CPU devices)."""

import json

import pytest

from kvjax import KvjaxError, get_model_config
from kvjax.analytic.parallel import kv_cache_bytes_per_device, weight_bytes_per_device
from kvjax.traced.collectives import Collective, collectives, summarize
from kvjax.traced.sharded import sharded_memory, trace_in_subprocess, trace_sharded_step

HLO = """HloModule jit_step, num_partitions=8
ENTRY %main {
  %all-reduce.1 = f32[2,1,48]{2,1,0} all-reduce(%x), channel_id=3, replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2] {'axis_1','axis_2'}, use_global_device_ids=true, to_apply=%add
  %ar2 = bf16[4,8]{1,0} all-reduce(%y), replica_groups=[2,4]<=[8], to_apply=%add
  %ag = f32[2,1,104]{1,0,2} all-gather(%z), replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={2}
  ROOT %rs = f32[16]{0} reduce-scatter(%w), replica_groups={}, dimensions={0}, to_apply=%add
  %ars = (f32[10]{0}, f32[10]{0}) all-reduce-start(%v), replica_groups=[1,8]<=[8], to_apply=%add
  %ard = f32[10]{0} all-reduce-done(%ars)
  %cp = s32[3]{0} collective-permute(%u), source_target_pairs={{0,1},{1,0}}
  %not = f32[8]{0} add(%all-reduce.1, %all-reduce.1)
}
"""


def test_collectives_parsed_from_every_replica_group_spelling():
    got = collectives(HLO)
    assert [(c.kind, c.result_bytes, c.group_size) for c in got] == [
        ("all-reduce", 2 * 48 * 4, 8),  # mesh axes 'axis_1' x 'axis_2' = 4 x 2
        ("all-reduce", 4 * 8 * 2, 4),  # iota [groups, size]
        ("all-gather", 2 * 104 * 4, 2),  # explicit groups
        ("reduce-scatter", 16 * 4, 8),  # {} = every partition
        ("all-reduce", 10 * 4, 8),  # async start counted once, its result
        ("collective-permute", 12, 2),
    ]


def test_ring_bytes_per_device():
    assert Collective("all-reduce", "", 800, 8).bytes_per_device == 2 * 7 / 8 * 800
    assert Collective("all-gather", "", 800, 4).bytes_per_device == 3 / 4 * 800
    assert Collective("reduce-scatter", "", 100, 4).bytes_per_device == 300
    assert Collective("collective-permute", "", 12, 2).bytes_per_device == 12
    assert Collective("all-reduce", "", 800, 1).bytes_per_device == 0
    s = summarize(collectives(HLO))
    assert s["all-reduce"]["count"] == 3
    assert s["all-reduce"]["bytes_per_device"] == pytest.approx(2 * 7 / 8 * 384 + 1.5 * 64 + 70)


def f32_model(num_kv_heads, num_layers=2):
    # a real model's shapes (llama-3-8b) so matrix products dominate as they do in practice;
    # f32 because XLA:CPU computes bf16 products in f32 (DESIGN.md)
    return get_model_config(
        "llama-3-8b",
        num_kv_heads=num_kv_heads,
        num_layers=num_layers,
        weight_dtype="f32",
        kv_dtype="f32",
    )


@pytest.mark.parametrize("tp", (1, 2, 4, 8))
@pytest.mark.parametrize("num_kv_heads", (32, 8, 1), ids=("mha", "gqa", "mqa"))
def test_traced_per_device_flops_and_collectives_match_closed_form(devices, num_kv_heads, tp):
    cfg = f32_model(num_kv_heads)
    t = trace_sharded_step(cfg, "decode", 2, 512, tp)
    assert t.flops_per_device == pytest.approx(t.closed_flops_per_device, rel=0.02)
    assert t.collective_bytes == pytest.approx(t.closed_collective_bytes, rel=0.10)
    assert {k: int(v["count"]) for k, v in t.collectives.items()} == t.closed_collective_counts
    # the program's own shardings hold the closed form's bytes
    assert t.kv_cache_bytes_per_device == kv_cache_bytes_per_device(cfg, tp, 511, 2)
    assert t.weight_bytes_per_device == weight_bytes_per_device(cfg, tp)


def test_prefill_and_data_parallel_trace(devices):
    t = trace_sharded_step(f32_model(8), "prefill", 4, 128, tp=4, dp=2)
    assert t.flops_per_device == pytest.approx(t.closed_flops_per_device, rel=0.02)
    assert t.collective_bytes == pytest.approx(t.closed_collective_bytes, rel=0.10)
    assert t.closed_collective_counts == {"all-reduce": 5, "all-gather": 1}


def test_one_layer_extrapolation_equals_full_compile(devices):
    cfg = f32_model(8, num_layers=4)
    full = trace_sharded_step(cfg, "decode", 2, 256, 4, layers="all")
    fast = trace_sharded_step(cfg, "decode", 2, 256, 4, layers="one")
    assert fast.layers_traced == (1, 2) and full.layers_traced == (4,)
    assert fast.flops_per_device == pytest.approx(full.flops_per_device, rel=1e-6)
    assert fast.bytes_per_device == pytest.approx(full.bytes_per_device, rel=1e-6)
    for kind, row in full.collectives.items():
        assert fast.collectives[kind] == pytest.approx(row)
    assert set(fast.collectives) == set(full.collectives)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(phase="decode", batch=3, context=64, tp=2, dp=2), "batch=3 is not divisible by dp=2"),
        (dict(phase="train", batch=1, context=64, tp=2), "phase='train'"),
        (dict(phase="decode", batch=1, context=64, tp=2, layers="two"), "layers='two'"),
        (dict(phase="decode", batch=1, context=64, tp=5), "tp=5 does not divide num_heads=32"),
    ],
)
def test_bad_sharded_trace_requests(kwargs, message):
    with pytest.raises(KvjaxError, match=message):
        trace_sharded_step(f32_model(8), **kwargs)


def test_cli_trace_tp_json(devices, capsys):
    from kvjax.cli import main

    argv = ["trace", "--model", "llama-3-8b", "--layers", "2", "--weight-dtype", "f32"]
    argv += ["--kv-dtype", "f32", "--context", "512", "--batch", "2", "--tp", "4", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tp"] == 4 and out["stage"] == "compiled"
    assert out["flops_ratio"] == pytest.approx(1, rel=0.02)
    assert out["collective_ratio"] == pytest.approx(1, rel=0.10)
    assert out["collectives"]["all-reduce"]["count"] == 5
    c = out["closed_form"]
    # L=2, K and V, B=2, S=512, 8/4 KV heads, H=128, f32
    assert c["kv_cache_bytes_per_device"] == 2 * 2 * 2 * 512 * 2 * 128 * 4
    # the table view renders the same report
    assert main(argv[:-1]) == 0
    text = capsys.readouterr().out
    assert "all-reduce" in text and "collective bytes sent" in text


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--tp", "2", "--stage", "lowered"], "--tp/--dp trace the compiled module"),
        (["--tp", "3"], "tp=3 does not divide num_heads=32"),
        (["--tp", "2", "--dp", "2", "--batch", "3"], "--batch=3 is not divisible by --dp=2"),
    ],
)
def test_cli_trace_tp_errors(capsys, extra, message):
    from kvjax.cli import main

    assert main(["trace", "--model", "llama-3-8b", "--layers", "2", *extra]) == 2
    assert message in capsys.readouterr().err


def test_trace_in_subprocess_equals_in_process(devices):
    cfg = f32_model(8)
    here = trace_sharded_step(cfg, "decode", 2, 256, 4).to_dict()
    there = trace_in_subprocess(cfg, "decode", 2, 256, 4, layers="all")
    for key in ("flops_per_device", "bytes_per_device", "collective_bytes",
                "kv_cache_bytes_per_device", "weight_bytes_per_device"):  # fmt: skip
        assert there[key] == pytest.approx(here[key], rel=1e-9), key
    with pytest.raises(KvjaxError, match="tp=5 dp=1 failed: error: .*tp=5 does not divide"):
        trace_in_subprocess(cfg, "decode", 2, 256, 5)


@pytest.mark.parametrize("tp,dp", [(1, 1), (4, 1), (16, 1), (64, 2)])
@pytest.mark.parametrize("num_kv_heads", (64, 8, 1))
def test_sharded_memory_of_a_70b_needs_no_devices(num_kv_heads, tp, dp):
    # llama-2-70b's shapes, 4 of its 80 layers (identical layers; keeps the test quick)
    cfg = get_model_config("llama-2-70b", num_kv_heads=num_kv_heads, num_layers=4)
    got = sharded_memory(cfg, tp, dp, batch=4, context=32768)
    assert got["kv_cache_bytes_per_device"] == kv_cache_bytes_per_device(cfg, tp, 32768, 4 // dp)
    assert got["weight_bytes_per_device"] == weight_bytes_per_device(cfg, tp)


@pytest.mark.parametrize("tp", (2, 8))
def test_served_decode_step_moves_the_closed_form_bytes(devices, tp):
    # attend (cache read) + append (cache donated), as CompiledSteps serves it: at B=1 in f32 the
    # fused per-device module moves the closed form's bytes (a long cache makes a copy visible)
    t = trace_sharded_step(f32_model(8), "decode", 1, 8192, tp)
    assert t.bytes_per_device == pytest.approx(t.closed_bytes_per_device, rel=0.05)


def test_host_device_flag_is_added_once():
    from kvjax.devices import FLAG, request_host_devices, with_host_devices

    assert with_host_devices("", 8) == f"{FLAG}=8"
    assert with_host_devices("--xla_dump_to=/tmp/x", 4) == f"--xla_dump_to=/tmp/x {FLAG}=4"
    assert with_host_devices(f"{FLAG}=2", 8) == f"{FLAG}=2"  # the user's count wins
    env = {}
    request_host_devices(1, env)
    assert env == {}
    request_host_devices(16, env)
    assert env == {"XLA_FLAGS": f"{FLAG}=16"}
