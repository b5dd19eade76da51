"""One request as the engine sees it: its tokens, how many have been computed, its blocks.
Its text and who sent it live outside the engine (kvscope/detokenizer.py, the server)."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from kvscope.sampling_params import SamplingParams


_ids = itertools.count()


@dataclass(eq=False, slots=True)   # its fields are read several times per row and step
class Sequence:
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    seq_id: int = field(default_factory=lambda: next(_ids))
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0      # tokens whose K/V are in the cache
    num_cached_tokens: int = 0        # of those, how many came from prefix-cache hits
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chained hash of each full block
    cache_salt: str | None = None     # vLLM's per-request salt: only equal salts share cached blocks
    grammar: object | None = None     # its structured-output matcher (engine/sampler.py)
    last_block_recomputed: bool = False   # its whole last block was cached, yet computed again (vLLM's rule)
    finish_reason: str | None = None  # stop | length | abort | error; None while queued or running
    error: str | None = None
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    logprobs: list[dict] = field(default_factory=list)
    paused: bool = False              # left out of the steps, its blocks kept, until resumed (LLMEngine.pause)
    prefill_chunk_size: int | None = None   # its own cap on prompt tokens per step, under the engine's
    forks: list["Sequence"] = field(default_factory=list)  # choices 1..n-1, forked when the prompt is done
    spec_token_ids: list[int] = field(default_factory=list)   # drafts awaiting verification

    def __post_init__(self):
        self.request_id = self.request_id or f"req-{self.seq_id}"
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def choices(self) -> list["Sequence"]:
        """This sequence and the choices still waiting to fork from it (a request's n > 1
        choices before its prompt is computed): what ends when its prompt ends."""
        return [self, *self.forks]

    def append_token(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        self.token_ids.append(token_id)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time
