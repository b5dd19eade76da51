"""The offline API, shaped as vLLM's: LLM(model, ...).generate(prompts, params) returns one
RequestOutput per prompt, LLM.chat(messages) formats with the tokenizer's chat template.
A script that imports LLM and SamplingParams from vllm runs unchanged on kvscope.

What a request returns, in vLLM's shape (below LLM): one RequestOutput per prompt, its n
choices in `outputs` (CompletionOutput), logprobs as one {token_id: Logprob} dict per
generated token, so a script written for vllm.LLM reads the same field names."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvscope.config import EngineConfig
from kvscope.detokenizer import output_text
from kvscope.engine.llm_engine import LLMEngine
from kvscope.engine.sequence import Sequence
from kvscope.sampling_params import SamplingParams

# str, token ids, or vLLM's TextPrompt / TokensPrompt dicts
Prompt = str | list[int] | dict


class LLM:
    def __init__(self, model: str | None = None, *, num_gpu_blocks_override: int | None = None,
                 skip_tokenizer_init: bool = False, **engine_args):
        """Engine arguments take vLLM's names (dtype, seed, max_model_len, max_num_seqs,
        max_num_batched_tokens, block_size, enable_prefix_caching, enable_chunked_prefill,
        enforce_eager, tensor_parallel_size, speculative_config, gpu_memory_utilization,
        kv_cache_memory_bytes, num_gpu_blocks_override, skip_tokenizer_init) plus kvscope's
        own (EngineConfig)."""
        if num_gpu_blocks_override is not None:
            engine_args["num_kv_blocks"] = num_gpu_blocks_override
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))
        if skip_tokenizer_init:   # token ids in and out, no text (as vLLM)
            self.engine.tokenizer = None

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run every prompt to the end; one RequestOutput per prompt, in prompt order.
        (use_tqdm is accepted for vLLM's signature; kvscope draws no progress bar.)"""
        prompts = as_prompt_list(prompts)
        params = sampling_params or SamplingParams()
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        else:
            params = [params] * len(prompts)
        requests = [self.engine.add_request(prompt_input(p), sp) for p, sp in zip(prompts, params)]
        groups = [seq.choices for seq in requests]   # taken now: the forks leave seq.forks as they fork
        token_times: dict[int, list[float]] = {}   # seq_id -> when its tokens arrived (for the metrics)
        while self.engine.has_unfinished():
            deltas, _ = self.engine.step()
            now = time.perf_counter()
            for d in deltas:
                token_times.setdefault(d.seq.seq_id, []).append(now)
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None \
            else next(iter(self.engine.model_config.eos_token_ids), None)
        return [RequestOutput.from_sequences(group, prompt_text(p), self.tokenizer, eos_token_id=eos,
                                             token_times=token_times.get(group[0].seq_id))
                for p, group in zip(prompts, groups)]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [apply_chat_template(self.tokenizer, conv) for conv in conversations]
        return self.generate(prompts, sampling_params)

    def close(self) -> None:
        """Stop the engine's workers and free what it holds; the LLM is unusable afterwards."""
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def as_prompt_list(prompts: Prompt | list[Prompt]) -> list[Prompt]:
    """One prompt (text, token ids or a prompt dict) or a list of them, as a list."""
    if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


def prompt_input(prompt: Prompt) -> str | list[int]:
    """What the engine takes: text or token ids. Dicts are vLLM's {"prompt": ...} (TextPrompt)
    or {"prompt_token_ids": [...]} (TokensPrompt)."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return prompt["prompt"]
        raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
    return prompt


def prompt_text(prompt: Prompt) -> str | None:
    if isinstance(prompt, dict):
        return prompt.get("prompt")
    return prompt if isinstance(prompt, str) else None


def apply_chat_template(tokenizer, messages: list[dict]) -> str:
    """The tokenizer's own chat template; plain 'role: content' lines when it has none."""
    if tokenizer is None:
        raise ValueError("this checkpoint has no tokenizer, so it cannot format a chat")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError("each chat message needs 'role' and 'content'")
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nassistant:"


# -- what a request returns ---------------------------------------------------------------
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
                       indices: list[int] | None = None, eos_token_id: int | None = None,
                       token_times: list[float] | None = None) -> "RequestOutput":
        """One prompt's choices (choice 0 first) as one output; `indices` overrides their
        positions when only some choices are reported (a stream closing one choice).
        `eos_token_id`: the model's main end token (default: the tokenizer's); `token_times`:
        when choice 0's tokens arrived, as its caller measured them (the engine keeps none)."""
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        first = choices[0]
        indices = indices or list(range(len(choices)))
        return cls(first.request_id, prompt, list(first.prompt_token_ids),
                   [completion(seq, i, tokenizer, eos_token_id) for seq, i in zip(choices, indices)],
                   finished=all(seq.is_finished for seq in choices), metrics=metrics(choices, token_times or []),
                   num_cached_tokens=first.num_cached_tokens,
                   error=next((seq.error for seq in choices if seq.error), None))


def completion(seq: Sequence, index: int, tokenizer=None, eos_token_id: int | None = None) -> CompletionOutput:
    logprobs = None
    cumulative = None
    if seq.params.logprobs is not None:
        logprobs = [position_logprobs(entry, token, tokenizer)
                    for entry, token in zip(seq.logprobs, seq.output_token_ids)]
        cumulative = sum(entry["logprob"] for entry in seq.logprobs)
    text, stop_string = output_text(seq, tokenizer)
    reason = stop_reason(seq, stop_string, eos_token_id)
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


def stop_reason(seq: Sequence, stop_string: str | None, eos_token_id: int | None) -> int | str | None:
    """What stopped a sequence that finished with "stop", as vLLM reports it: one of its
    stop_token_ids, the stop string its text was cut at, None for the model's main end token,
    and the token id for its other end tokens (generation_config's)."""
    if seq.finish_reason != "stop" or not seq.output_token_ids:
        return None
    last = seq.output_token_ids[-1]
    if last in seq.params.stop_token_ids:
        return last
    if stop_string is not None:
        return stop_string
    return None if last == eos_token_id else last


def metrics(choices: list[Sequence], token_times: list[float]) -> RequestMetrics:
    """Choice 0's timings; tokens and preemptions counted over every choice."""
    seq = choices[0]
    return RequestMetrics(seq.arrival_time, seq.first_token_time, token_times[-1] if token_times else None,
                          seq.ttft, sum(s.num_output_tokens for s in choices),
                          sum(s.num_preemptions for s in choices),
                          [b - a for a, b in zip(token_times, token_times[1:])])
