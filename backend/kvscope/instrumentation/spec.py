"""`spec` events: per request and step, what was drafted, what the target accepted (and,
for sampled requests, the p, q and uniform draw behind each decision), the bonus token, and
the request's running acceptance rate and tokens per target pass."""
from __future__ import annotations

from kvscope.engine.llm_engine import StepRecord


def spec_events(record: StepRecord, engine, ts: float) -> list[dict]:
    speculator = engine.speculator
    entries = {e.seq.seq_id: e for e in record.scheduled.entries}
    events = []
    for seq_id, verdict in record.result.spec.items():
        seq = entries[seq_id].seq
        stats = speculator.stats.get(seq_id)
        if stats is None:   # the request finished this step: its totals went with it
            stats = speculator.last_stats.get(seq_id)
        events.append({
            "type": "spec", "ts": ts, "step": record.scheduled.step, "request_id": seq.request_id,
            "method": speculator.config.method, "greedy": seq.params.greedy,
            "proposed": list(verdict.proposed), "proposed_text": _pieces(engine, verdict.proposed),
            "accepted": verdict.num_accepted, "token_ids": list(verdict.token_ids),
            "token_text": _pieces(engine, verdict.token_ids), "bonus": verdict.bonus,
            "rejected_slots": len(verdict.proposed) - verdict.num_accepted,
            "checks": [{"token_id": c.token_id, "p": round(c.p, 6), "q": round(c.q, 6),
                        "u": None if c.u is None else round(c.u, 6), "accepted": c.accepted}
                       for c in verdict.checks],
            "running": {"proposed": stats.proposed, "accepted": stats.accepted,
                        "acceptance_rate": round(stats.acceptance_rate, 4),
                        "target_passes": stats.target_passes,
                        "tokens_per_pass": round(stats.tokens_per_pass, 4)}})
    return events


def _pieces(engine, ids: list[int]) -> list[str]:
    tok = engine.tokenizer
    return [tok.decode([i]) for i in ids] if tok is not None else [str(i) for i in ids]
