"""The inference engine, importable without any web stack."""
from kvscope.engine.llm_engine import LLMEngine, TokenDelta
from kvscope.engine.observer import EngineObserver, StepRecord

__all__ = ["LLMEngine", "TokenDelta", "EngineObserver", "StepRecord"]
