"""A paged KV pool with prefix caching, as vLLM v1's block manager keeps it. Pure Python.

The pool holds `num_pages` pages of `page_size` token positions. A request holds a list of
pages; a page that is full of a prompt's tokens gets a hash chained from the page before it
(its content and everything before it), and is kept in a cache under that hash: another request
whose prompt starts with the same tokens takes the page (its reference count goes up) instead
of computing it. A page nobody holds is free; a free page that is cached stays in the cache
(least recently freed first to go) until an allocation needs it.

kvjax simulates lengths, not token ids: a request's prompt is its shared prefix (`prefix_id`,
`prefix_len` tokens, the same for every request that names it) and then tokens of its own, so
page i of a prompt hashes to (prefix_id, i) when the prefix covers it and to (request id, i)
otherwise, which is what hashing the real tokens would give.
"""

from __future__ import annotations

from collections import OrderedDict

from kvjax.errors import KvjaxError


class PagePool:
    def __init__(self, num_pages: int, page_size: int):
        for name, value in (("num_pages", num_pages), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise KvjaxError(f"{name}={value!r} must be a positive integer")
        self.num_pages, self.page_size = num_pages, page_size
        self.refs = [0] * num_pages
        self.hash_of: dict[int, object] = {}  # page -> its content hash (full prompt pages)
        self.cached: dict[object, int] = {}  # hash -> page
        # free pages: the never-used ones first (pages `fresh` on, not listed: a pool of
        # millions of pages costs nothing until used), then the freed ones, least recently
        # freed first (a cached one stays cached until an allocation takes it)
        self.fresh = 0
        self.free: OrderedDict[int, None] = OrderedDict()
        # prompt pages found in the cache / looked up, once per admitted request (first
        # admissions; re-admissions after a preemption apart, as vLLM's PrefixCacheStats)
        self.hits = self.lookups = 0
        self.preempted_hits = self.preempted_lookups = 0

    @property
    def free_pages(self) -> int:
        return self.num_pages - self.fresh + len(self.free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - self.free_pages

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def cached_prefix(self, hashes: list) -> list[int]:
        """The pages already holding the leading pages `hashes` of a prompt, in order."""
        out = []
        for h in hashes:
            page = self.cached.get(h)
            if page is None:
                break
            out.append(page)
        return out

    def count_lookup(self, pages: int, hits: int, resumed: bool = False) -> None:
        """An admitted request looked up `pages` prompt pages and found `hits` of them."""
        if resumed:
            self.preempted_lookups += pages
            self.preempted_hits += hits
        else:
            self.lookups += pages
            self.hits += hits

    def take(self, pages: list[int]) -> None:
        """Hold cached pages (a prefix hit): each one more reference, out of the free list."""
        for p in pages:
            self.refs[p] += 1
            self.free.pop(p, None)

    def allocate(self, n: int) -> list[int] | None:
        """n fresh pages, evicting the least recently freed cached ones; None if fewer are free."""
        if n > self.free_pages:
            return None
        out = []
        for _ in range(n):
            if self.fresh < self.num_pages:  # a never-used page
                p, self.fresh = self.fresh, self.fresh + 1
            else:
                p, _ = self.free.popitem(last=False)
            h = self.hash_of.pop(p, None)
            if h is not None and self.cached.get(h) == p:
                del self.cached[h]
            self.refs[p] = 1
            out.append(p)
        return out

    def register(self, page: int, h: object) -> None:
        """A page just filled with prompt tokens: cached under its hash (first one wins)."""
        if h not in self.cached:
            self.cached[h] = page
            self.hash_of[page] = h

    def release(self, pages: list[int]) -> None:
        """Drop one reference to each page; a page nobody holds goes to the free list's end
        (released in reverse, so a request's last pages are evicted first, as vLLM does)."""
        for p in reversed(pages):
            self.refs[p] -= 1
            if self.refs[p] < 0:
                raise AssertionError(f"page {p} released more often than taken")
            if self.refs[p] == 0:
                self.free[p] = None
