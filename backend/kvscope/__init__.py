"""kvscope: a readable paged, continuously batched LLM engine that explains itself."""
from kvscope.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "EngineConfig", "RequestOutput"]
__version__ = "0.1.0"


def __getattr__(name):
    # LLM pulls in torch and transformers; import it only when asked for
    if name == "LLM":
        from kvscope.llm import LLM
        return LLM
    if name == "EngineConfig":
        from kvscope.config import EngineConfig
        return EngineConfig
    if name == "RequestOutput":
        from kvscope.outputs import RequestOutput
        return RequestOutput
    raise AttributeError(name)
