"""The committed recordings (frontend/recordings/, made by scripts/make_recordings.py) are
episodes a learner can follow: at least MIN_STEPS engine steps, every request whole
(added, prefilled, decoded, finished, its blocks freed), every prompt a page labels
tokenized (so a replay shows token text, not ids), and a hello that says what the
recorded server could show."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted((ROOT / "frontend" / "recordings").glob("*.jsonl"))
_spec = importlib.util.spec_from_file_location("make_recordings", ROOT / "scripts" / "make_recordings.py")
make_recordings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_recordings)
# recordings whose pages label prompt tokens (cache view, heatmaps, internals)
LABELLED = {"default", "attention", "step-by-step", "internals", "sampling"}


def events_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:] if line.strip()]


def test_every_scenario_is_committed():
    assert {p.stem for p in RECORDINGS} == set(make_recordings.SCENARIOS)


def block_tables_at_end(events: list[dict]) -> dict:
    """The pool's block tables after the last `kv` event (a snapshot, then deltas)."""
    tables: dict = {}
    for e in (e for e in events if e["type"] == "kv"):
        if e["kind"] == "snapshot":
            tables = dict(e["tables"])
        tables.update(e.get("tables", {}))
        for rid in e.get("removed_tables", []):
            tables.pop(rid, None)
    return tables


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_a_recording_is_a_whole_episode(path):
    events = events_of(path)
    added = [e["request_id"] for e in events if e["type"] == "request.added"]
    finished = [e["request_id"] for e in events if e["type"] == "request.finished"]
    assert added and sorted(added) == sorted(finished), "every request that arrives also finishes"
    hello = events[0]
    assert hello["type"] == "hello" and hello["backend"]["engine"] == "kvscope"
    if path.stem in make_recordings.KEEP_ONLY:   # kept to its widget's events: no steps to check
        assert "step" not in make_recordings.KEEP_ONLY[path.stem]
        assert not any(e["type"] == "step" for e in events)
        return
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) >= make_recordings.MIN_STEPS, f"{path.stem}: {len(steps)} steps"
    # each request is prefilled (a prefill row) and decodes (tokens) before it finishes
    for rid in added:
        rows = [q for s in steps for q in s.get("seqs", []) if q["request_id"] == rid]
        # (a prompt found in the prefix cache but for its last token is admitted as a one-token row)
        assert any(q["kind"] == "prefill" or q.get("reason") == "new request" for q in rows), f"{rid} has no prefill step"
        assert sum(e["type"] == "request.token" and e["request_id"] == rid for e in events) >= 1
    assert block_tables_at_end(events) == {}, "every request's blocks are freed in the recording"


@pytest.mark.parametrize("name", sorted(LABELLED))
def test_labelled_prompts_were_tokenized(name):
    events = events_of(ROOT / "frontend" / "recordings" / f"{name}.jsonl")
    tokenized = [e["ids"] for e in events if e["type"] == "tokens"]
    for added in (e for e in events if e["type"] == "request.added"):
        ids = added["prompt_token_ids"]
        assert any(t == ids[:len(t)] and len(t) == len(ids) for t in tokenized), \
            f"{name}: the prompt of {added['request_id']} has no recorded token text"


def test_step_plan_shows_the_v1_rule():
    """Chapter 14's <kv-step-plan> recording: running requests' decodes are planned first, the
    budget they leave goes to a long prompt over several steps, and a prompt behind it waits."""
    steps = [e for e in events_of(ROOT / "frontend" / "recordings" / "step-plan.jsonl") if e["type"] == "step"]
    mixed = [s for s in steps if {"decode", "prefill chunk"} <= {q["reason"] for q in s["seqs"]}]
    assert len(mixed) >= 2
    for s in mixed:
        reasons = [q["reason"] for q in s["seqs"]]
        assert reasons.index("prefill chunk") > max(i for i, r in enumerate(reasons) if r == "decode")
        assert sum(q["num_tokens"] for q in s["seqs"]) == s["num_batched_tokens"] <= s["token_budget"]
    cut = [s for s in mixed if not any(q["samples"] for q in s["seqs"] if q["reason"] == "prefill chunk")]
    assert cut and all(s["num_batched_tokens"] == s["token_budget"] and s["queues"]["waiting"] >= 1 for s in cut)
