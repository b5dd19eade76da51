"""Python's cyclic garbage collector and a long-running engine.

Start-up leaves about half a million long-lived objects (the model's modules, the compiled
step's guards and caches, the tokenizer). Each full collection walks all of them again, and
the allocations of a watched step (its events) trigger collections often: a full pass took
0.1 s on kvscope-mini. Moving what start-up made out of the collector's sight (gc.freeze)
leaves it only the objects made since; they are still collected as before."""
from __future__ import annotations

import gc


def freeze_start_up() -> None:
    """Call once start-up is done (model loaded, steps compiled), before serving."""
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Call when serving stops: what start-up made is the collector's again, so an engine
    dropped in a process that goes on (tests, notebooks) is freed with its cycles."""
    gc.unfreeze()
