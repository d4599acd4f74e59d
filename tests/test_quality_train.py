"""Training: a step lowers the loss; a resumed run continues bit-identically; the data."""

import jax
import numpy as np
from flax import nnx

from kvjax import get_model_config
from kvjax.nn import Transformer
from kvjax.quality.data import SKIP, AssociativeRecall, StdlibBytes, python_files, stdlib_files
from kvjax.quality.train import TrainConfig, loss_and_accuracy, make_optimizer, train, train_step

CFG = get_model_config("tiny-gqa").replace(vocab_size=256)
TC = TrainConfig(steps=8, batch_size=4, seq_len=32, eval_every=4, eval_batches=1, warmup_steps=2)


def fresh():
    return Transformer(CFG, rngs=nnx.Rngs(0))


def test_one_train_step_lowers_the_loss_on_a_fixed_batch():
    model = fresh()
    opt = make_optimizer(model, TrainConfig(learning_rate=1e-2, warmup_steps=0, steps=10))
    b = StdlibBytes("train", max_bytes=2**18).batch(0, 0, 4, 32)
    before = float(loss_and_accuracy(model, b.tokens, b.targets, b.mask)[0])
    train_step(model, opt, b.tokens, b.targets, b.mask)
    after = float(loss_and_accuracy(model, b.tokens, b.targets, b.mask)[0])
    assert after < before


def test_runs_of_one_shape_and_schedule_share_one_compiled_step():
    """The optimizer's transformation is one object per hyperparameters, so a second run (a
    seed, a sweep point of the same shapes) reuses the compiled step."""
    b = StdlibBytes("train", max_bytes=2**16).batch(0, 0, 4, 32)
    before = train_step.jitted_fn._cache_size()
    for seed in (0, 1):
        model = Transformer(CFG, rngs=nnx.Rngs(seed))
        train_step(model, make_optimizer(model, TC), b.tokens, b.targets, b.mask)
    assert train_step.jitted_fn._cache_size() - before <= 1
    other = TrainConfig(**{**TC.__dict__, "learning_rate": 2 * TC.learning_rate})
    assert make_optimizer(fresh(), other).tx is not make_optimizer(fresh(), TC).tx


def test_resumed_run_continues_bit_identically(tmp_path):
    data = StdlibBytes("train", max_bytes=2**18)
    straight = fresh()
    h_straight = train(straight, data, TC, progress=False)
    interrupted = fresh()
    train(interrupted, data, TC, checkpoint_dir=tmp_path, progress=False, stop_after=4)
    resumed = fresh()  # a new process would start from scratch objects like this
    h_resumed = train(resumed, data, TC, checkpoint_dir=tmp_path, progress=False)
    for a, b in zip(
        jax.tree_util.tree_leaves(nnx.state(straight, nnx.Param)),
        jax.tree_util.tree_leaves(nnx.state(resumed, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    assert h_resumed[-1]["val_loss"] == h_straight[-1]["val_loss"]


def test_stdlib_split_is_by_file_and_fixed():
    files = stdlib_files()
    assert files == sorted(files) and len(files) > 100
    train, val = StdlibBytes("train", max_bytes=2**18), StdlibBytes("val", max_bytes=2**18)
    assert len(train.data) >= 2**18 and len(val.data) > 0
    a, b = train.batch(3, 7, 2, 16), train.batch(3, 7, 2, 16)
    np.testing.assert_array_equal(a.tokens, b.tokens)  # a function of (seed, step)
    np.testing.assert_array_equal(a.targets[:, :-1], a.tokens[:, 1:])


def test_python_files_are_what_rglob_finds_outside_the_skipped_folders(tmp_path):
    for rel in ("a.py", "b.txt", "pkg/c.py", "pkg/tests/d.py", "site-packages/jax/e.py",
                "pkg/sub/__pycache__/f.py", "pkg/sub/g.py", "lib2to3/h.py"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "linked").symlink_to(tmp_path / "pkg", target_is_directory=True)
    parts = [p.relative_to(tmp_path).parts for p in tmp_path.rglob("*.py")]
    by_rglob = sorted(tmp_path.joinpath(*ps) for ps in parts if not set(ps) & set(SKIP))
    got = python_files(str(tmp_path))
    assert list(got) == by_rglob
    assert [str(p.relative_to(tmp_path)) for p in got] == ["a.py", "pkg/c.py", "pkg/sub/g.py"]


def test_associative_recall_answers_are_in_context():
    task = AssociativeRecall(num_pairs=6, num_queries=4, vocab_size=40)
    b = task.batch(0, 0, 3)
    assert b.tokens.shape == (3, task.seq_len) and b.mask.sum() == 3 * 4
    for seq, tgt, m in zip(b.tokens, b.targets, b.mask, strict=True):
        pairs = dict(zip(seq[0:12:2], seq[1:12:2], strict=True))
        for pos in np.flatnonzero(m):
            assert tgt[pos] == pairs[seq[pos]]  # the answer is the value paired with the query
