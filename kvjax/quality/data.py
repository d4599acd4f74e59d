"""Training data that exists on every machine, with no download.

- Byte-level language modelling on the source of the running interpreter's standard library
  (a fixed, sorted file list; a file goes to the held-out split by a hash of its path).
- Multi-query associative recall: key-value pairs in context, then queries of some keys; the
  loss and accuracy count only the answers, which only what the KV cache holds can give.

Batches are a pure function of (seed, step), so a resumed run sees exactly the same data.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BYTE_VOCAB = 256


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # [B, T] int32 inputs
    targets: np.ndarray  # [B, T] int32 next tokens
    mask: np.ndarray  # [B, T] float32: which targets count


SKIP = ("site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__")


def stdlib_files() -> list[Path]:
    """The standard library's `.py` files, sorted, none under a folder named in `SKIP`."""
    return list(python_files(sysconfig.get_paths()["stdlib"]))


@functools.lru_cache(maxsize=4)
def python_files(root: str) -> tuple[Path, ...]:
    """`.py` files under root, sorted, none under a folder named in `SKIP`: skipped folders are
    not entered (an interpreter's site-packages can hold a hundred times the standard library:
    walking it made each call take a second), symbolic links to folders not followed (as
    `Path.rglob` does not), and the list is made once a process."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in SKIP]
        found.extend(Path(folder, f) for f in files if f.endswith(".py"))
    return tuple(sorted(found))


class StdlibBytes:
    """Byte windows from the standard library's source, split by file."""

    def __init__(self, split: str = "train", max_bytes: int = 8 * 2**20, val_every: int = 10):
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r}; allowed: train, val")
        root = Path(sysconfig.get_paths()["stdlib"])
        chunks, total = [], 0
        for path in stdlib_files():
            rel = str(path.relative_to(root))
            in_val = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % val_every == 0
            if in_val != (split == "val"):
                continue
            data = path.read_bytes()
            chunks.append(data + b"\n")
            total += len(data) + 1
            if total >= max_bytes:
                break
        self.data = np.frombuffer(b"".join(chunks), np.uint8).astype(np.int32)
        self.split = split

    def batch(self, seed: int, step: int, batch_size: int, seq_len: int) -> Batch:
        rng = np.random.default_rng([seed, step, 0 if self.split == "train" else 1])
        starts = rng.integers(0, len(self.data) - seq_len - 1, size=batch_size)
        windows = np.stack([self.data[s : s + seq_len + 1] for s in starts])
        return Batch(windows[:, :-1], windows[:, 1:], np.ones((batch_size, seq_len), np.float32))


class AssociativeRecall:
    """`k1 v1 k2 v2 ... kn vn q1 a1 q2 a2 ...`: keys and values from disjoint token ranges; each
    query is one of the context's keys and its answer the paired value."""

    def __init__(self, num_pairs: int = 16, num_queries: int = 8, vocab_size: int = 128):
        if vocab_size < 2 * num_pairs + 2:
            raise ValueError("vocab_size too small for distinct keys")
        self.num_pairs, self.num_queries, self.vocab_size = num_pairs, num_queries, vocab_size
        self.seq_len = 2 * (num_pairs + num_queries) - 1

    def batch(self, seed: int, step: int, batch_size: int, seq_len: int | None = None) -> Batch:
        rng = np.random.default_rng([seed, step, 2])
        half = self.vocab_size // 2
        n, q = self.num_pairs, self.num_queries
        seqs = np.zeros((batch_size, 2 * (n + q)), np.int32)
        for b in range(batch_size):
            keys = rng.choice(half, size=n, replace=False)
            values = half + rng.integers(0, half, size=n)
            seqs[b, 0 : 2 * n : 2], seqs[b, 1 : 2 * n : 2] = keys, values
            which = rng.integers(0, n, size=q)
            seqs[b, 2 * n :: 2], seqs[b, 2 * n + 1 :: 2] = keys[which], values[which]
        mask = np.zeros((batch_size, seqs.shape[1] - 1), np.float32)
        mask[:, 2 * n :: 2] = 1.0  # predict the answer right after each query
        return Batch(seqs[:, :-1], seqs[:, 1:], mask)
