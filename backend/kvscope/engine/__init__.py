"""The inference engine, importable without any web stack."""
from kvscope.engine.llm_engine import EngineObserver, LLMEngine, StepRecord, TokenDelta

__all__ = ["LLMEngine", "TokenDelta", "EngineObserver", "StepRecord"]
