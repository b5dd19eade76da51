"""Token buckets: a steady rate with a burst allowance."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    rate: float              # tokens per second
    burst: float
    tokens: float = -1.0
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self):
        if self.tokens < 0:
            self.tokens = self.burst

    def take(self, n: float = 1.0) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def retry_after(self, n: float = 1.0) -> float:
        return max(0.0, (n - self.tokens) / self.rate) if self.rate > 0 else float("inf")


def per_minute(n: float) -> TokenBucket:
    """n per minute, with a burst of a quarter of that (at least 1)."""
    return TokenBucket(rate=n / 60.0, burst=max(1.0, n / 4))
