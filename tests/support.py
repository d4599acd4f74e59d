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
