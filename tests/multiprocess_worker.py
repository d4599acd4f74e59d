"""One of the 2 local processes of tests/test_multiprocess.py (kvjax.runs.distributed.launch):
joins the others, then runs on the global 8-device mesh (a) the tp=8 sharded model's logits,
(b) the tp=8 sharded trace, (c) data-parallel training with an orbax checkpoint and a resume.
Process 0 writes what it saw to OUT/result.json (and logits.npy)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's kvjax

from kvjax.runs import distributed  # noqa: E402

distributed.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from kvjax import get_model_config  # noqa: E402
from kvjax.nn import Transformer  # noqa: E402
from kvjax.nn import sharding as sh  # noqa: E402
from kvjax.quality.data import StdlibBytes  # noqa: E402
from kvjax.quality.train import TrainConfig, train  # noqa: E402
from kvjax.traced.sharded import trace_sharded_step  # noqa: E402

SHAPES = dict(num_heads=16, num_kv_heads=4, head_dim=6, d_ff=56, vocab_size=104)
TC = dict(steps=6, batch_size=8, seq_len=16, eval_every=2, eval_batches=1, warmup_steps=2)


def logits(cfg):
    model = Transformer(cfg, rngs=nnx.Rngs(7))
    mesh = sh.make_mesh(cfg, 8)  # jax.devices(): both processes' devices
    sharded = sh.shard_model(model, mesh)
    toks = np.asarray(jax.random.randint(jax.random.key(3), (2, 5), 0, cfg.vocab_size))
    rep = NamedSharding(mesh, P())
    toks = jax.make_array_from_callback(toks.shape, rep, lambda idx: toks[idx])
    graphdef, state = nnx.split(sharded)
    with jax.set_mesh(mesh):
        out = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t), out_shardings=rep)(state, toks)
    return np.asarray(out)


def main(out: Path) -> None:
    cfg = get_model_config("tiny-gqa", **SHAPES, weight_dtype="f32", kv_dtype="f32")
    got = logits(cfg)
    trace = trace_sharded_step(cfg, "decode", 2, 16, 8).to_dict()
    data = StdlibBytes("train", max_bytes=2**16)
    qcfg = get_model_config("tiny-gqa", vocab_size=256)
    tc = TrainConfig(**TC)
    train(Transformer(qcfg, rngs=nnx.Rngs(0)), data, tc, checkpoint_dir=out / "ckpt",
          progress=False, stop_after=3)  # fmt: skip
    history = train(
        Transformer(qcfg, rngs=nnx.Rngs(1)), data, tc, checkpoint_dir=out / "ckpt", progress=False
    )  # fmt: skip  (resumed from step 3: other init, same curve)
    distributed.barrier("worker-done")
    if jax.process_index() == 0:
        np.save(out / "logits.npy", got)
        result = {"process_count": jax.process_count(), "device_count": jax.device_count(),
                  "trace": trace, "history": history}  # fmt: skip
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
