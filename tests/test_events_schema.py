"""The schema file, the documentation and the committed recordings agree with each other."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from kvscope.instrumentation.recording import read_recording
from kvscope.instrumentation.schema import EVENTS, RECORDING_HEADER, event_schema_key, full_schema
from server_harness import check_event

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "events.md"
RECORDINGS = sorted((ROOT / "frontend" / "recordings").glob("*.jsonl"))
# Read whole by one widget (kv-throughput: a sweep's request events), never replayed step by
# step as a page's recording; scripts/make_recordings.py keeps it to those events (KEEP_ONLY).
WIDGET_DATA = {"throughput"}


def doc_examples() -> list[dict]:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S)
    return [json.loads(b) for b in blocks]


def test_schema_file_is_generated_from_the_code():
    on_disk = json.loads((ROOT / "docs" / "events.schema.json").read_text())
    assert on_disk == full_schema(), "regenerate: python -m kvscope.instrumentation.schema > docs/events.schema.json"
    Draft202012Validator.check_schema(on_disk)


def test_every_event_has_a_valid_example_in_the_docs():
    examples = [e for e in doc_examples() if e.get("type") != "recording"]
    for event in examples:
        check_event(event)
    documented = {event_schema_key(e) for e in examples}
    assert documented == set(EVENTS), f"undocumented: {set(EVENTS) - documented}"


def test_recording_header_example():
    header = next(e for e in doc_examples() if e.get("type") == "recording")
    Draft202012Validator(RECORDING_HEADER).validate(header)


def test_schema_rejects_what_it_should():
    bad_hello = {**next(e for e in doc_examples() if e.get("type") == "hello")}
    bad_hello["model"] = {**bad_hello["model"], "surprise": 1}
    with pytest.raises(AssertionError):
        check_event(bad_hello)
    attention = next(e for e in doc_examples() if e.get("type") == "attention")
    with pytest.raises(AssertionError):
        check_event({**attention, "weights": [[[1.5]]]})


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_committed_recordings_are_valid(path):
    header, events = read_recording(path)
    Draft202012Validator(RECORDING_HEADER).validate(header)
    assert events[0]["type"] == "hello"
    for event in events:
        check_event(event)
    if path.stem in WIDGET_DATA:
        page_recordings = set(re.findall(r"^recording: (\S+)$", "".join(p.read_text() for p in (ROOT / "content").glob("*.md")), re.M))
        assert path.stem not in page_recordings, "a page replays its recording step by step: it needs the step events"
        assert any(e["type"] == "request.finished" for e in events)
    else:
        assert any(e["type"] == "step" for e in events)
    ts = [e["ts"] for e in events]
    assert ts == sorted(ts), "events are in time order"


def test_recordings_are_small():
    assert RECORDINGS, "recordings are committed under frontend/recordings"
    # a page loads one recording: each stays quick to fetch, and the set stays small in the repository
    assert all(p.stat().st_size < 300_000 for p in RECORDINGS)
    # (2.5 MB since chapters 13, 14, 16, 18 and 19 each gained a widget replaying its own recording)
    assert sum(p.stat().st_size for p in RECORDINGS) < 2_500_000
