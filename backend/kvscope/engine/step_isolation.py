"""When a step fails, find the requests that make it fail and run the others' step again
without them, so one bad request ends alone instead of taking every stream with it.

Only the error path pays: each request's part of the step is tried on its own, then the
step runs again for the rest. Running a step again is safe because writing a position's
K/V is idempotent (the same inputs write the same values to the same slots), and the
seeded generators are rewound so the rest draw exactly what they would have drawn."""
from __future__ import annotations

from dataclasses import replace

import torch

from kvscope.engine.model_runner import StepResult
from kvscope.engine.scheduler import SchedulerOutput


def run_isolating(runner, out: SchedulerOutput, generators: dict[int, torch.Generator]):
    """(step result, {seq_id: why its step failed}). Re-raises an error no single request explains."""
    states = {seq_id: gen.get_state() for seq_id, gen in generators.items()}
    try:
        return runner.run(out, generators), {}
    except Exception as error:
        failed = {}
        for entry in out.entries:
            _rewind(generators, states)
            try:
                runner.run(replace(out, entries=[entry]), generators)
            except Exception as alone:
                failed[entry.seq.seq_id] = f"{type(alone).__name__}: {alone}"
        if not failed:
            raise error
    kept = [e for e in out.entries if e.seq.seq_id not in failed]
    _rewind(generators, states)
    if not kept:
        return StepResult(), failed
    return runner.run(replace(out, entries=kept), generators), failed


def _rewind(generators: dict[int, torch.Generator], states: dict[int, torch.Tensor]) -> None:
    for seq_id, state in states.items():
        generators[seq_id].set_state(state)
