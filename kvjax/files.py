"""Atomic file writes: a temporary file in the same folder, then `os.replace`, so a reader (or an
interrupted run) never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from kvjax.errors import KvjaxError


def write_text_atomic(path: str | Path, text: str) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next(p for p in path.parents if p.exists())
        raise KvjaxError(f"cannot write {str(path)!r}: {str(blocker)!r} is not a folder") from None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600: honour the umask like open() does
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | Path, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
