"""JAX's multi-process runtime (issue 30): 2 local processes of 4 simulated CPU devices each,
joined by kvjax.runs.distributed, against the same programs in one process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from multiprocess_worker import SHAPES, TC

from kvjax import KvjaxError, get_model_config
from kvjax.cli.runs import without_processes
from kvjax.nn import Transformer
from kvjax.quality.data import StdlibBytes
from kvjax.quality.train import TrainConfig, train
from kvjax.runs import distributed
from kvjax.runs.launcher import assign
from kvjax.traced.collectives import collectives, summarize
from kvjax.traced.sharded import trace_sharded_step

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("multiprocess_worker.py")


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """What process 0 of the 2-process worker saw (both processes exited 0)."""
    out = tmp_path_factory.mktemp("multiprocess")
    # the timeout only guards against a hang: 69-84 s with busy processes beside it
    status = distributed.launch([str(out)], 2, timeout_s=900, program=[str(WORKER)])
    assert status == 0, f"the 2-process worker exited {status}"
    return json.loads((out / "result.json").read_text()), np.load(out / "logits.npy")


@pytest.mark.slow
def test_sharded_logits_over_two_processes_equal_single_process(worker):
    result, got = worker
    assert (result["process_count"], result["device_count"]) == (2, 8)
    cfg = get_model_config("tiny-gqa", **SHAPES, weight_dtype="f32", kv_dtype="f32")
    toks = jax.random.randint(jax.random.key(3), (2, 5), 0, cfg.vocab_size)
    want = np.asarray(Transformer(cfg, rngs=nnx.Rngs(7))(toks))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_sharded_trace_over_two_processes_equals_single_process(worker, devices):
    result, _ = worker
    cfg = get_model_config("tiny-gqa", **SHAPES, weight_dtype="f32", kv_dtype="f32")
    one = trace_sharded_step(cfg, "decode", 2, 16, 8, devices_per_host=4).to_dict()
    two = result["trace"]
    assert (two["hosts"], two["host_source"]) == (2, "processes")
    assert two["collectives"] == one["collectives"]  # counts, bytes, and which cross hosts
    assert two["flops_per_device"] == one["flops_per_device"]
    # tp=8 over 2 hosts: every all-reduce / all-gather group spans both
    assert two["cross_host_collective_bytes"] == two["collective_bytes"] > 0
    alone = trace_sharded_step(cfg, "decode", 2, 16, 8).to_dict()
    assert alone["collective_bytes"] == two["collective_bytes"]
    assert alone["cross_host_collective_bytes"] == 0


@pytest.mark.slow
def test_data_parallel_training_with_checkpoint_equals_single_process(worker):
    result, _ = worker
    qcfg = get_model_config("tiny-gqa", vocab_size=256)
    history = train(Transformer(qcfg, rngs=nnx.Rngs(0)), StdlibBytes("train", max_bytes=2**16),
                    TrainConfig(**TC), progress=False)  # fmt: skip
    got = result["history"]  # the 2-process run was stopped at step 3 and resumed from orbax
    want = [h for h in history if h["step"] > 3]
    assert [h["step"] for h in got] == [h["step"] for h in want] == [4, 6]
    for g, w in zip(got, want, strict=True):
        for key in ("train_loss", "val_loss", "val_accuracy"):
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), key


SWEEP = """experiment: kv_vs_context
model:
  preset: seed-70b
options:
  contexts: [1024, 4096]
  windowed: [mistral-7b]
sweep:
  model.num_kv_heads: [1, 2, 4, 8, 16]
"""


@pytest.mark.slow
def test_sweep_split_over_two_processes_writes_each_point_once(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(SWEEP)
    cmd = [sys.executable, "-m", "kvjax", "run", str(config), "--runs", str(tmp_path / "runs"),
           "--processes", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = (tmp_path / "runs" / "kv_vs_context").iterdir()
    files = sorted((run / "points").glob("*.json"))
    writers = [json.loads(f.read_text())["writer"]["process"] for f in files]
    assert len(files) == 5 and sorted(writers) == [0, 0, 0, 1, 1]
    # each point computed by exactly one process: one progress line a point (counted over the
    # whole stream: the two processes share stderr, so their lines can interleave)
    assert done.stderr.count("kv_vs_context model.") == 5
    env_json = json.loads((run / "environment.json").read_text())
    assert env_json["process_count"] == 2 and len(env_json["hosts"]) == 2
    assert not (run / ".lock").exists()
    # resumable as before: a lost point is recomputed, and only it
    files[3].unlink()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sum("kv_vs_context model." in ln for ln in again.stderr.splitlines()) == 1
    assert len(list((run / "points").glob("*.json"))) == 5


# ---- without processes ------------------------------------------------------------------------
def test_environment_names_the_processes():
    assert distributed.requested({}) is None
    env = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "h:1"}
    assert distributed.requested(env)["process_id"] == 1
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "3",
             "SLURM_STEP_NODELIST": "n[1-4]"}  # fmt: skip
    assert distributed.requested(slurm)["num_processes"] == 4
    assert distributed.requested({**slurm, "SLURM_NTASKS": "1"}) is None
    for bad, message in (
        ({**env, "JAX_PROCESS_ID": "2"}, "JAX_PROCESS_ID='2' must be an integer >= 0 and < 2"),
        ({**env, "JAX_NUM_PROCESSES": "x"}, "JAX_NUM_PROCESSES='x' must be an integer >= 1"),
        ({k: v for k, v in env.items() if k != "JAX_COORDINATOR_ADDRESS"},
         "JAX_COORDINATOR_ADDRESS must be set too"),
    ):  # fmt: skip
        with pytest.raises(KvjaxError, match=message):
            distributed.requested(bad)
    with pytest.raises(KvjaxError, match="--processes=0 must be a positive integer"):
        distributed.check_processes(0)


def test_local_processes_get_their_own_devices():
    env = distributed.process_env(
        2,
        1,
        1234,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo", "SLURM_PROCID": "0"},
    )
    assert env["JAX_PROCESS_ID"] == "1" and env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:1234"
    assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=4"
    assert "SLURM_PROCID" not in env
    argv = ["run", "c.yaml", "--processes", "2", "x=1", "--processes=3"]
    assert without_processes(argv) == ["run", "c.yaml", "x=1"]


class _Sweep:
    @staticmethod
    def runs_together(point):
        return point == "sharded"


def test_points_divided_among_processes():
    todo = [(i, f"k{i}", p) for i, p in enumerate(["a", "sharded", "b", "c"])]
    zero, one = (assign(_Sweep, todo, r, 2) for r in (0, 1))
    assert [(k, w) for _, k, _, w in zero] == [("k0", True), ("k1", True), ("k3", True)]
    assert [(k, w) for _, k, _, w in one] == [("k1", False), ("k2", True)]

    class Timed:
        MEASURED = True

    assert len(assign(Timed, todo, 0, 2)) == 4 and assign(Timed, todo, 1, 2) == []


HLO = """HloModule jit_step, num_partitions=8
  %a = f32[100]{0} all-reduce(%x), replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, use_global_device_ids=true
  %b = f32[100]{0} all-reduce(%x), replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add
"""  # noqa: E501


def test_collectives_crossing_hosts():
    a, b = collectives(HLO)
    assert a.groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and b.groups[0] == (0, 4)
    hosts = [0, 0, 0, 0, 1, 1, 1, 1]
    s = summarize([a, b], hosts)["all-reduce"]
    assert s["count"] == 2 and s["cross_host_count"] == 1  # a stays within each host
    assert s["cross_host_bytes_per_device"] == b.bytes_per_device == 400
    assert s["inter_host_link_bytes"] == 4 * 2 * 400  # 4 groups, each over 2 hosts
