"""Shared by the tests: a missing prerequisite skips a test on a developer's machine, but fails it
in CI (`.ci/run` sets CI=true and installs every prerequisite), so nothing is skipped silently
where it matters."""

import importlib
import os

import pytest


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it: see .ci/run)")
    pytest.skip(reason)


def require_module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        require(False, f"needs the Python package {name!r} ({exc})")


def check_hf_parity(model, ref, toks, prefixes=(3, 9), atol=2e-4):
    """kvjax's logits against a Hugging Face model's `ref` on `toks`: the uncached forward, and
    prefill of each prefix then decode of the rest; returns HF's logits."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    with torch.no_grad():
        want = ref(torch.tensor(toks)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(toks))), want, atol=atol)
    B, T = toks.shape
    for prefix in prefixes:
        cache = model.init_cache(B, T + 2)
        logits, cache = model.prefill(jnp.asarray(toks[:, :prefix]), cache)
        got = [np.asarray(logits)]
        for t in range(prefix, T):
            step, cache = model.decode(jnp.asarray(toks[:, t]), cache)
            got.append(np.asarray(step)[:, None])
        np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=atol)
    return want
