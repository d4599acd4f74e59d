"""The key positions a block of queries attends, in closed form (shared by the fused kernel's
count, `kvjax.analytic.flash`, and the bound's, `kvjax.analytic.compulsory`)."""

from __future__ import annotations


def key_union(
    T: int, S: int, window: int = 0, sinks: int = 0, chunk: int = 0, causal: bool = True
) -> int:
    """Key positions that at least one of T queries at the end of S positions attends: what any
    implementation must read once. Causal: keys 0 .. S-1 (the last query sees them all); a
    sliding window W: the band from the first query's window start, S-T-W+1, to S-1, and the
    `sinks` first keys below it; a chunked layer (chunk C): from the first query's chunk start."""
    if not causal:
        return S
    if chunk:
        return S - (S - T) // chunk * chunk
    if not window or window >= S:
        return S
    lo = max(0, S - T - window + 1)
    return S - lo + min(sinks, lo)
