"""Training with optax: AdamW with warm-up + cosine decay and gradient clipping, nnx.Optimizer,
jitted train and eval steps, deterministic data (a function of seed and step), periodic
evaluation, orbax checkpoints that resume bit-identically, a progress bar with loss and tokens/s.

Several processes (`kvjax.runs.distributed`): data parallel over every process's devices. The model
and optimizer state are replicated on a one-axis "data" mesh over all devices, each global batch
(the same on every process: a function of seed and step) is split over it, and XLA all-reduces
the gradients; the loss curve is the single-process one to float tolerance. Checkpoints are
orbax's multi-process ones (every process saves its shards into one shared folder).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kvjax.errors import KvjaxError
from kvjax.nn import Transformer


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    eval_every: int = 50
    eval_batches: int = 4
    checkpoint_every: int = 0  # 0: only at the end (when a checkpoint folder is given)
    seed: int = 0

    def __post_init__(self) -> None:
        """Each field checked before any training: one line naming the field and what is allowed."""
        minimum = {
            "steps": 1,
            "batch_size": 1,
            "seq_len": 2,
            "eval_every": 1,
            "eval_batches": 1,
            "warmup_steps": 0,
            "checkpoint_every": 0,
            "seed": 0,
        }
        for name, low in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise KvjaxError(f"{name}={value!r} must be an integer >= {low}")
        for name in ("learning_rate", "clip_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise KvjaxError(f"{name}={value!r} must be a positive number")
        wd = self.weight_decay
        if isinstance(wd, bool) or not isinstance(wd, int | float) or not wd >= 0:
            raise KvjaxError(f"weight_decay={wd!r} must be a number >= 0")


def make_optimizer(model: Transformer, tc: TrainConfig) -> nnx.Optimizer:
    tx = transformation(tc.learning_rate, tc.warmup_steps, tc.steps, tc.clip_norm, tc.weight_decay)
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


@lru_cache(maxsize=64)
def transformation(
    learning_rate: float, warmup_steps: int, steps: int, clip_norm: float, weight_decay: float
) -> optax.GradientTransformation:
    """AdamW on a warm-up and cosine schedule after global-norm clipping: one object for the same
    hyperparameters. `train_step`'s cache is keyed on the optimizer's structure, which holds this
    transformation's functions, compared by identity: a new one each run compiled the step anew
    (3.5 s a run here, for a seed's or a sweep point's run of the same shapes). Optax's
    transformations are pure (the state is the optimizer's), so runs can share one."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, warmup_steps, max(steps, warmup_steps + 1), 0.1 * learning_rate
    )
    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adamw(schedule, weight_decay=weight_decay),
    )


def loss_and_accuracy(model: Transformer, tokens, targets, mask, kv_dtype=None):
    logits = model(tokens, kv_dtype)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    denom = jnp.maximum(mask.sum(), 1.0)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return (nll * mask).sum() / denom, (correct * mask).sum() / denom


@nnx.jit
def train_step(model: Transformer, optimizer: nnx.Optimizer, tokens, targets, mask):
    def loss_fn(m):
        return loss_and_accuracy(m, tokens, targets, mask)[0]

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


@partial(nnx.jit, static_argnames=("kv_dtype",))
def eval_step(model: Transformer, tokens, targets, mask, kv_dtype=None):
    return loss_and_accuracy(model, tokens, targets, mask, kv_dtype)


def evaluate(
    model, data, tc: TrainConfig, seed_offset: int = 10_000, kv_dtype: str | None = None
) -> dict[str, float]:
    """Validation loss and accuracy; `kv_dtype` ("int8", "fp8", "int4", "int2") attends K and V
    as decoding from a quantized cache would read them (`Transformer.__call__`): a trained
    model's quality with that cache."""
    losses, accs = [], []
    for i in range(tc.eval_batches):
        b = data.batch(tc.seed + seed_offset, i, tc.batch_size, tc.seq_len)
        loss, acc = eval_step(model, *place_batch(model, b.tokens, b.targets, b.mask), kv_dtype)
        losses.append(float(loss))
        accs.append(float(acc))
    return {"val_loss": float(np.mean(losses)), "val_accuracy": float(np.mean(accs))}


# ---- data parallel over processes ---------------------------------------------------------------
def data_parallel_mesh():
    """One "data" axis over every device of every process."""
    from jax.sharding import AxisType

    n = jax.device_count()
    return jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices())


def _global(x, sharding):
    host = np.asarray(x)  # identical on every process (same seed, same step)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def replicate(tree, mesh):
    """Every leaf a global array replicated over `mesh` (from the same value on each process)."""
    from jax.sharding import NamedSharding, PartitionSpec

    rep = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: _global(x, rep), tree)


def data_mesh(model):
    """The data-parallel mesh the model is replicated on (`replicate`), else None."""
    leaf = jax.tree.leaves(nnx.state(model, nnx.Param))[0]
    sharding = getattr(leaf, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    return mesh if mesh is not None and tuple(mesh.axis_names) == ("data",) else None


def place_batch(model, *arrays):
    """A global batch split over the model's data mesh (unchanged without one)."""
    mesh = data_mesh(model)
    if mesh is None:
        return arrays
    from jax.sharding import NamedSharding, PartitionSpec

    n = mesh.shape["data"]
    if arrays[0].shape[0] % n:
        raise KvjaxError(
            f"batch_size={arrays[0].shape[0]} must be a multiple of the {n} devices of the "
            "data-parallel mesh (every process's devices)"
        )
    rows = NamedSharding(mesh, PartitionSpec("data"))
    return tuple(_global(a, rows) for a in arrays)


def _share_optimizer(model, optimizer, mesh) -> None:
    nnx.update(model, replicate(nnx.state(model), mesh))
    nnx.update(optimizer, replicate(nnx.state(optimizer), mesh))


# ---- checkpoints -------------------------------------------------------------------------------
def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def save_checkpoint(path: Path, model, optimizer, step: int) -> None:
    state = {
        "model": nnx.to_pure_dict(nnx.state(model, nnx.Param)),
        "optimizer": nnx.to_pure_dict(nnx.state(optimizer)),
        "step": step,
    }
    ckptr = _checkpointer()
    ckptr.save((path / f"step_{step:08d}").absolute(), state, force=True)
    ckptr.wait_until_finished()


def latest_checkpoint(folder: Path) -> Path | None:
    steps = sorted(folder.glob("step_*")) if folder.exists() else []
    return steps[-1].absolute() if steps else None


def restore_checkpoint(path: Path, model, optimizer) -> int:
    model_state, opt_state = nnx.state(model, nnx.Param), nnx.state(optimizer)
    target = {
        "model": nnx.to_pure_dict(model_state),
        "optimizer": nnx.to_pure_dict(opt_state),
        "step": 0,
    }
    restored = _checkpointer().restore(path, target)
    nnx.replace_by_pure_dict(model_state, restored["model"])
    nnx.replace_by_pure_dict(opt_state, restored["optimizer"])
    nnx.update(model, model_state)
    nnx.update(optimizer, opt_state)
    return int(restored["step"])


# ---- the loop ----------------------------------------------------------------------------------
def train(
    model: Transformer,
    data,
    tc: TrainConfig,
    *,
    val_data=None,
    checkpoint_dir: str | Path | None = None,
    progress: bool = True,
    stop_after: int | None = None,
) -> list[dict[str, Any]]:
    """Train for `tc.steps` (resuming from the latest checkpoint in `checkpoint_dir`); returns
    the evaluation history. `stop_after` ends early (tests: a run interrupted at a checkpoint)."""
    import sys

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    optimizer = make_optimizer(model, tc)
    if jax.process_count() > 1:  # one of several processes (kvjax.runs.distributed)
        _share_optimizer(model, optimizer, data_parallel_mesh())
    folder = Path(checkpoint_dir) if checkpoint_dir else None
    start = 0
    if folder and (latest := latest_checkpoint(folder)):
        start = restore_checkpoint(latest, model, optimizer)
    history: list[dict[str, Any]] = []
    val_data = val_data or data
    tokens_seen, t0 = 0, time.perf_counter()
    show = progress and sys.stderr.isatty()
    columns = [TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn()]
    with Progress(*columns, disable=not show, transient=True) as bar:
        task = bar.add_task("training", total=tc.steps, completed=start)
        for step in range(start, tc.steps):
            b = data.batch(tc.seed, step, tc.batch_size, tc.seq_len)
            batch = place_batch(model, b.tokens, b.targets, b.mask)
            loss = float(train_step(model, optimizer, *batch))
            tokens_seen += b.tokens.size
            rate = tokens_seen / (time.perf_counter() - t0)
            bar.update(task, advance=1, description=f"loss {loss:.3f} | {rate:,.0f} tok/s")
            done = step + 1
            if done % tc.eval_every == 0 or done == tc.steps:
                history.append(
                    {
                        "step": done,
                        "train_loss": loss,
                        "tokens_per_s": rate,
                        **evaluate(model, val_data, tc),
                    }
                )
            if folder and (
                done == tc.steps or (tc.checkpoint_every and done % tc.checkpoint_every == 0)
            ):
                save_checkpoint(folder, model, optimizer, done)
            if stop_after is not None and done >= stop_after:
                if folder:
                    save_checkpoint(folder, model, optimizer, done)
                break
    return history
