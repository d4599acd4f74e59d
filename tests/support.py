"""Shared by the tests: a missing prerequisite skips a test on a developer's machine, but fails it
in CI (`.ci/run` sets CI=true and installs every prerequisite), so nothing is skipped silently
where it matters."""

import importlib
import os

import pytest

# the XLA flag the tests compile with (tests/conftest.py)
UNOPTIMISED = "--xla_backend_optimization_level=0"


def optimised_env() -> dict[str, str]:
    """This process's environment for a child that should run optimised code (a benchmark run
    whole): XLA_FLAGS without the tests' `UNOPTIMISED`, the simulated devices kept."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != UNOPTIMISED)
    return env


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


def jitted(model):
    """The model's forward, prefill, decode and extend, each one jitted program (the same functions:
    on XLA:CPU one compile of the whole step is several times faster than running a small
    model op by op, each op compiled on its own)."""
    import jax
    from flax import nnx

    graph, state = nnx.split(model)

    def run(method):
        fn = jax.jit(lambda s, *args: getattr(nnx.merge(graph, s), method)(*args))
        return lambda *args: fn(state, *args)

    return run("__call__"), run("prefill"), run("decode"), run("extend")


def check_hf_parity(model, ref, toks, prefixes=(3, 9), atol=2e-4):
    """kvjax's logits against a Hugging Face model's `ref` on `toks`: the uncached forward, and
    prefill of each prefix then decode of the rest; returns HF's logits."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    with torch.no_grad():
        want = ref(torch.tensor(toks)).logits.numpy()
    forward, prefill, decode, _ = jitted(model)
    np.testing.assert_allclose(np.asarray(forward(jnp.asarray(toks))), want, atol=atol)
    B, T = toks.shape
    for prefix in prefixes:
        cache = model.init_cache(B, T + 2)
        logits, cache = prefill(jnp.asarray(toks[:, :prefix]), cache)
        got = [np.asarray(logits)]
        for t in range(prefix, T):
            step, cache = decode(jnp.asarray(toks[:, t]), cache)
            got.append(np.asarray(step)[:, None])
        np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=atol)
    return want
