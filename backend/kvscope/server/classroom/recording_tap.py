"""The recording tap: while the instructor records, every event the hub fans out (and the
replies a replay needs) is written to a JSONL file that /ws/replay can play back."""
from __future__ import annotations

from pathlib import Path

from kvscope.instrumentation.encode import dumps
from kvscope.instrumentation.recording import Recorder

RECORDED_REPLIES = ("tokens", "sandbox", "kv_quant")


class RecordingTap:
    def __init__(self):
        self.recorder: Recorder | None = None

    def start(self, path: Path, name: str, model: str, preamble: list[dict], stamp) -> Recorder:
        rec = Recorder(path, name, model)
        for e in preamble:
            e = dict(e)
            stamp(e)
            rec.write_text(dumps(e))
        self.recorder = rec
        return rec

    def stop(self) -> Recorder | None:
        rec, self.recorder = self.recorder, None
        if rec is not None:
            rec.close()
        return rec
