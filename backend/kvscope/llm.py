"""The offline API, shaped as vLLM's: LLM(model, ...).generate(prompts, params) returns one
RequestOutput per prompt, LLM.chat(messages) formats with the tokenizer's chat template.
A script that imports LLM and SamplingParams from vllm runs unchanged on kvscope."""
from __future__ import annotations

from kvscope.config import EngineConfig
from kvscope.engine.llm_engine import LLMEngine
from kvscope.outputs import RequestOutput
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
        while self.engine.has_unfinished():
            self.engine.step()
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None \
            else next(iter(self.engine.model_config.eos_token_ids), None)
        return [RequestOutput.from_sequences(group, prompt_text(p), self.tokenizer, eos_token_id=eos)
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
