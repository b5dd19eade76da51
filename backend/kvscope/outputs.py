"""What a request returns, in vLLM's shape: one RequestOutput per prompt, its n choices in
`outputs` (CompletionOutput), logprobs as one {token_id: Logprob} dict per generated token.
A script written for vllm.LLM reads kvscope's results with the same field names."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.engine.sequence import Sequence


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None            # 1 = the most likely token; None when outside the top n asked for
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One choice of a request."""
    index: int
    text: str
    token_ids: list[int]               # generated tokens only
    cumulative_logprob: float | None   # sum of the chosen tokens' logprobs, when logprobs were asked for
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None   # stop | length | abort | error
    stop_reason: int | str | None = None   # the stop token id or stop string that ended it; None for EOS

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Timings of a request (vLLM's RequestStateStats names; perf_counter seconds)."""
    arrival_time: float
    first_token_ts: float | None
    last_token_ts: float | None
    first_token_latency: float | None  # time to first token
    num_generation_tokens: int
    num_preemptions: int
    inter_token_latencies: list[float] = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0         # prompt tokens served from the prefix cache
    prompt_logprobs: None = None       # not computed by kvscope
    error: str | None = None           # why finish_reason is "error" (vLLM raises instead)

    @classmethod
    def from_sequences(cls, choices: list[Sequence], prompt: str | None = None, tokenizer=None,
                       indices: list[int] | None = None, eos_token_id: int | None = None) -> "RequestOutput":
        """One prompt's choices (choice 0 first) as one output; `indices` overrides their
        positions when only some choices are reported (a stream closing one choice).
        `eos_token_id`: the model's main end token (default: the tokenizer's)."""
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        first = choices[0]
        indices = indices or list(range(len(choices)))
        return cls(first.request_id, prompt, list(first.prompt_token_ids),
                   [completion(seq, i, tokenizer, eos_token_id) for seq, i in zip(choices, indices)],
                   finished=all(seq.is_finished for seq in choices), metrics=metrics(choices),
                   num_cached_tokens=first.num_cached_tokens,
                   error=next((seq.error for seq in choices if seq.error), None))


def completion(seq: Sequence, index: int, tokenizer=None, eos_token_id: int | None = None) -> CompletionOutput:
    logprobs = None
    cumulative = None
    if seq.params.logprobs is not None:
        logprobs = [position_logprobs(entry, token, tokenizer)
                    for entry, token in zip(seq.logprobs, seq.output_token_ids)]
        cumulative = sum(entry["logprob"] for entry in seq.logprobs)
    reason = stop_reason(seq, tokenizer, eos_token_id)
    text = seq.text
    if isinstance(reason, int) and tokenizer is not None:   # a stop token stays in token_ids, not in the text
        text = tokenizer.decode(seq.output_token_ids[:-1], skip_special_tokens=True)
    return CompletionOutput(index, text, list(seq.output_token_ids), cumulative, logprobs,
                            seq.finish_reason, reason)


def position_logprobs(entry: dict, chosen: int, tokenizer) -> dict[int, Logprob]:
    """The engine's {logprob, top} of one position as vLLM's dict: the chosen token first,
    then the top n with their ranks."""
    def decoded(token_id: int) -> str | None:
        return None if tokenizer is None else tokenizer.decode([token_id])
    ranks = {token_id: rank for rank, (token_id, _) in enumerate(entry["top"], start=1)}
    out = {chosen: Logprob(entry["logprob"], ranks.get(chosen), decoded(chosen))}
    for token_id, logprob in entry["top"]:
        out.setdefault(token_id, Logprob(logprob, ranks[token_id], decoded(token_id)))
    return out


def stop_reason(seq: Sequence, tokenizer, eos_token_id: int | None) -> int | str | None:
    """What stopped a sequence that finished with "stop", as vLLM reports it: one of its
    stop_token_ids, one of its stop strings (the text was cut where it starts), None for the
    model's main end token, and the token id for its other end tokens (generation_config's)."""
    if seq.finish_reason != "stop" or not seq.output_token_ids:
        return None
    last = seq.output_token_ids[-1]
    if last in seq.params.stop_token_ids:
        return last
    if seq.params.stop and tokenizer is not None:
        rest = tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)[len(seq.text):]
        found = next((s for s in seq.params.stop if rest.startswith(s)), None)
        if found is not None:
            return found
    return None if last == eos_token_id else last


def metrics(choices: list[Sequence]) -> RequestMetrics:
    """Choice 0's timings; tokens and preemptions counted over every choice."""
    seq = choices[0]
    return RequestMetrics(seq.arrival_time, seq.first_token_time, seq.token_times[-1] if seq.token_times else None,
                          seq.ttft, sum(s.num_output_tokens for s in choices),
                          sum(s.num_preemptions for s in choices), seq.inter_token_latencies)
