"""What a finished request returns to the caller."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.engine.sequence import Sequence


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]          # generated tokens only
    text: str
    finish_reason: str | None     # stop | length | abort | error
    error: str | None = None
    logprobs: list[dict] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    ttft: float | None = None
    inter_token_latencies: list[float] = field(default_factory=list)

    @classmethod
    def from_sequence(cls, seq: Sequence) -> "RequestOutput":
        return cls(seq.request_id, list(seq.prompt_token_ids), list(seq.output_token_ids), seq.text,
                   seq.finish_reason, seq.error, list(seq.logprobs), seq.num_cached_tokens,
                   seq.num_preemptions, seq.ttft, seq.inter_token_latencies)

    def __getitem__(self, key: str):   # nano-vllm style dict access: out["text"]
        return getattr(self, key)
