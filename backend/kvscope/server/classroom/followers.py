"""Request followers: the REST/SSE callers waiting on one request's `request.*` events,
each through its own asyncio queue."""
from __future__ import annotations

import asyncio
from collections import defaultdict


class Followers(defaultdict):
    """request id -> the queues of those following it."""

    def __init__(self):
        super().__init__(list)

    def follow(self, rid: str) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self[rid].append(q)
        return q

    def unfollow(self, rid: str, q: asyncio.Queue) -> None:
        qs = self.get(rid)
        if qs and q in qs:
            qs.remove(q)
