"""The offline API: LLM(model).generate(prompts, params) and LLM.chat(messages)."""
from __future__ import annotations

from kvscope.config import EngineConfig
from kvscope.engine.llm_engine import LLMEngine
from kvscope.outputs import RequestOutput
from kvscope.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, **engine_args):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        else:
            params = [params] * len(prompts)
        seqs = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        choices = [c for s in seqs for c in (s, *s.forks)]   # with n > 1, a prompt's n choices in a row
        while self.engine.has_unfinished():
            self.engine.step()
        return [RequestOutput.from_sequence(c) for c in choices]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [apply_chat_template(self.tokenizer, conv) for conv in conversations]
        return self.generate(prompts, sampling_params)


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
