"""The engine's named publication points. Instrumentation subclasses EngineObserver and
registers with `engine.add_observer`; with no observer registered the engine skips
building any payload, so listening costs nothing when nobody listens."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.engine.model_runner import StepResult
from kvscope.engine.scheduler import SchedulerOutput
from kvscope.engine.sequence import Sequence


@dataclass
class StepRecord:
    """Everything one step did, handed to observers after the step."""
    scheduled: SchedulerOutput
    result: StepResult
    finished: list[Sequence]
    block_events: list[tuple] = field(default_factory=list)  # (kind, block_id, detail)
    schedule_seconds: float = 0.0
    model_seconds: float = 0.0
    total_seconds: float = 0.0
    num_waiting: int = 0
    num_running: int = 0


class EngineObserver:
    def on_request_added(self, seq: Sequence) -> None: ...
    # after scheduling, before the model runs: the moment to install forward hooks on the
    # model (and set `engine.runner.force_eager`) for the sequences about to run
    def on_scheduled(self, scheduled: SchedulerOutput) -> None: ...
    def on_step(self, record: StepRecord) -> None: ...
    def on_token(self, seq: Sequence, token_id: int, text_delta: str) -> None: ...
    def on_request_finished(self, seq: Sequence) -> None: ...
    def on_reset(self) -> None: ...   # every request aborted, the KV pool emptied
