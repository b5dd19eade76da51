"""The instructor's live controls of a running engine, kept out of the engine itself: the
scheduler knobs (changed between steps) and a reset (every request aborted, the KV pool
and prefix cache emptied)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kvscope.config import EngineConfig
from kvscope.engine.block_manager import BlockManager
from kvscope.engine.sequence import Sequence

if TYPE_CHECKING:
    from kvscope.engine.llm_engine import LLMEngine

KNOBS = ("max_num_batched_tokens", "max_num_seqs", "prefill_chunk_size", "enable_chunked_prefill")


def check_chunking(enable_chunked_prefill: bool, max_num_batched_tokens: int, max_model_len: int) -> None:
    """Without chunked prefill a whole prompt must fit in one step's token budget."""
    if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise ValueError(f"without chunked prefill, max_num_batched_tokens ({max_num_batched_tokens}) "
                         f"must be >= max_model_len ({max_model_len})")


def current_knobs(config: EngineConfig) -> dict:
    return {k: getattr(config, k) for k in KNOBS}


def set_knobs(engine: LLMEngine, **knobs) -> dict:
    """Change scheduler knobs between steps; validated like the engine's constructor.
    Returns the knobs now in force."""
    unknown = set(knobs) - set(KNOBS)
    if unknown:
        raise ValueError(f"unknown knob(s) {sorted(unknown)}; knobs are {', '.join(KNOBS)}")
    merged = {**current_knobs(engine.config), **knobs}
    check_chunking(merged["enable_chunked_prefill"], merged["max_num_batched_tokens"], engine.max_model_len)
    candidate = EngineConfig(**{**engine.config.__dict__, **merged})   # runs the config's checks
    for k in KNOBS:
        setattr(engine.config, k, getattr(candidate, k))
    return current_knobs(engine.config)


def reset(engine: LLMEngine) -> list[Sequence]:
    """Abort every request and empty the KV pool and prefix cache. Returns the aborted."""
    sched = engine.scheduler
    aborted = [s for seq in (*sched.running, *sched.waiting) for s in (seq, *seq.forks)]
    for seq in aborted:
        engine.finish(seq, "abort")
    bm = engine.block_manager
    engine.block_manager = sched.block_manager = BlockManager(bm.num_blocks, bm.block_size,
                                                              bm.enable_prefix_caching)
    engine.block_manager.events = [] if engine.observers else None
    for obs in engine.observers:
        obs.on_reset()
    return aborted
