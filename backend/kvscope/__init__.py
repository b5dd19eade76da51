"""kvscope: a readable paged, continuously batched LLM engine that explains itself."""
from kvscope.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "EngineConfig", "RequestOutput", "CompletionOutput", "Logprob",
           "TokensPrompt", "TextPrompt"]
__version__ = "0.1.0"

# vLLM's prompt dicts: {"prompt_token_ids": [...]} and {"prompt": "..."}
TokensPrompt = TextPrompt = dict


def __getattr__(name):
    # LLM and the outputs pull in torch and transformers; import them only when asked for
    if name == "LLM":
        from kvscope.llm import LLM
        return LLM
    if name == "EngineConfig":
        from kvscope.config import EngineConfig
        return EngineConfig
    if name in ("RequestOutput", "CompletionOutput", "Logprob"):
        from kvscope import llm
        return getattr(llm, name)
    raise AttributeError(name)
