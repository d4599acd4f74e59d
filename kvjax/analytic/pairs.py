"""The (query, key) pairs a mask allows, in closed form: exact (`exact_pairs`: causal, a sliding
window with its sinks, Llama 4's chunks) and by tiles (`block_pairs`: a block loop computes a tile
whole when any of its pairs is unmasked, and loads each key block its band reaches). O(log S)
by floor sums (`floor_sum`: the Euclid-like reduction), checked against loops in the tests.
Letters: `kvjax.kernels` (T queries at the end of S positions)."""

from __future__ import annotations

from kvjax.errors import KvjaxError


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum_{i=0}^{n-1} floor((a*i + b) / m) in O(log) steps (the Euclid-like reduction of
    floor sums), for integers n >= 0, m > 0; a and b of any sign."""
    if n <= 0:
        return 0
    total = 0
    if a < 0 or a >= m:
        total += (n - 1) * n // 2 * (a // m)
        a %= m
    if b < 0 or b >= m:
        total += n * (b // m)
        b %= m
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b, m, a = y_max // m, y_max % m, a, m


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _sum_range(lo: int, hi: int) -> int:
    """lo + (lo+1) + ... + hi (0 when hi < lo)."""
    return (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0


def _sum_min(lo: int, hi: int, cap: int) -> int:
    """sum of min(x, cap) for x in lo .. hi."""
    if hi < lo:
        return 0
    below = min(hi, cap)
    return _sum_range(lo, below) + cap * max(0, hi - max(lo - 1, below))


def exact_pairs(T: int, S: int, window: int = 0, sinks: int = 0, chunk: int = 0) -> int:
    """Causal (query, key) pairs for T queries at the end of S positions, in closed form: query
    at position p = S - T + t sees p + 1 keys, at most `window`, plus the `sinks` first keys
    below its window; under Llama 4's chunked attention (`chunk` C) the keys of its own chunk,
    p mod C + 1. T(T+1)/2 when T = S, no window."""
    first = S - T + 1  # keys seen by the first query
    if chunk:  # sum over p of (p mod C) + 1 = sum p - C * sum floor(p / C) + T
        return _sum_range(S - T, S - 1) - chunk * floor_sum(T, chunk, 1, S - T) + T
    if not window or window >= S:
        return T * first + T * (T - 1) // 2
    seen = _sum_min(first, S, window)  # x = first + t keys up to the query, capped at W
    # sinks below the window: min(sinks, x - W) for x > W
    hi, lo = S, max(first, window + 1)
    sink = _sum_min(lo - window, hi - window, sinks) if hi >= lo else 0
    return seen + (sink if sinks else 0)


def block_pairs(
    T: int,
    S: int,
    bq: int,
    bk: int,
    window: int = 0,
    sinks: int = 0,
    chunk: int = 0,
    causal: bool = True,
) -> tuple[int, int]:
    """(pairs computed, key positions loaded summed over query blocks) of a block loop: a
    (query block, key block) tile is computed whole when any of its pairs is unmasked; the
    sinks' blocks join every query block's band; a chunked layer's query block reaches back to
    its chunk's start. Closed form in O(log S): the band edges of query block j are floors of
    linear functions of j, summed by `floor_sum` (the reference loop is in the tests)."""
    if not causal:  # every query block loads every key
        n_q = ceil_div(T, bq)
        return T * S, n_q * S
    if chunk and (chunk % bq or chunk % bk or (S - T) % bq):
        raise KvjaxError(
            f"chunked attention with chunk={chunk} needs the chunk and the query offset "
            f"{S - T} to be multiples of the tiles block_q={bq}, block_k={bk}"
        )
    offset, last = S - T, (S - 1) // bk
    excess = (last + 1) * bk - S  # the last key block is cut at S

    def loaded(n: int, rows: int, j0: int) -> int:
        """Keys loaded by query blocks j0 .. j0+n-1 of `rows` rows each."""
        if n <= 0:
            return 0
        base = offset + j0 * bq
        hi_blocks = floor_sum(n, bk, bq, base + rows - 1) + n  # sum of (hi // bk + 1)
        # blocks whose band reaches the last key block: cut at S
        j_last = max(0, ceil_div(last * bk - base - rows + 1, bq))
        total = hi_blocks * bk - max(0, n - j_last) * excess
        if chunk:  # the band starts at the chunk's first key: floor(p / C) * C / bk blocks
            total -= floor_sum(n, chunk, bq, base) * chunk
        elif window and window < S:
            # lo = max(0, p - W + 1): zero until p >= W
            j1 = min(n, max(0, ceil_div(window - base, bq)))
            lo_blocks = floor_sum(n - j1, bk, bq, base + j1 * bq - window + 1)
            total -= lo_blocks * bk
            if sinks:  # sink blocks below the band: min(sink blocks, lo // bk) of them
                sb = (sinks - 1) // bk + 1
                j2 = min(n, max(j1, ceil_div(sb * bk - base + window - 1, bq)))
                total += bk * (
                    floor_sum(j2 - j1, bk, bq, base + j1 * bq - window + 1) + sb * (n - j2)
                )
        return total

    full, rest = divmod(T, bq)
    keys_full, keys_rest = loaded(full, bq, 0), loaded(1 if rest else 0, rest, full)
    return bq * keys_full + rest * keys_rest, keys_full + keys_rest
