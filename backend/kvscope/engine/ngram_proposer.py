"""Prompt lookup (n-gram) drafting: no extra model. The last n tokens of a sequence are
looked up earlier in the same sequence; the tokens that followed the most recent earlier
occurrence are proposed as the continuation. Longest n first, from prompt_lookup_max down
to prompt_lookup_min."""
from __future__ import annotations

from kvscope.engine.spec_decode import Draft


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_max: int, prompt_lookup_min: int):
        self.k = num_speculative_tokens
        self.max_n, self.min_n = prompt_lookup_max, prompt_lookup_min

    def propose(self, seqs: list, ks: list[int]) -> list[Draft]:
        return [Draft(self.lookup(seq.token_ids, k)) for seq, k in zip(seqs, ks)]

    def release(self, seq) -> None:
        """Nothing is kept per sequence."""

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        for n in range(min(self.max_n, len(token_ids) - 1), self.min_n - 1, -1):
            start = self._latest_match(token_ids, n)
            if start is not None:
                return token_ids[start + n:start + n + k]
        return []

    @staticmethod
    def _latest_match(token_ids: list[int], n: int) -> int | None:
        """Start of the most recent earlier occurrence of the last n tokens, or None."""
        tail = token_ids[-n:]
        for start in range(len(token_ids) - n - 1, -1, -1):
            if token_ids[start:start + n] == tail:
                return start
        return None
