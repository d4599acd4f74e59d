"""The one error type kvjax raises for bad input.

Every message names the field (or file, or flag) and what is allowed, so the CLI can print it as a
single line and exit 2 instead of showing a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KvjaxError(ValueError):
    """Bad input: a config field, a preset name, a file, or a request that cannot be served."""


def unknown_name_error(kind: str, name: str, known: Iterable[str]) -> KvjaxError:
    """`unknown model 'lama-2-7b'; did you mean: llama-2-7b? (known: ...)`."""
    known = sorted(known)
    prefixed = [k for k in known if k.startswith(name) or name.startswith(k)]
    close = prefixed + [
        k for k in difflib.get_close_matches(name, known, n=3, cutoff=0.5) if k not in prefixed
    ]
    close = close[:3]
    hint = f"; did you mean: {', '.join(close)}?" if close else ""
    return KvjaxError(f"unknown {kind} {name!r}{hint} (known: {', '.join(known)})")
