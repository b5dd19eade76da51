"""`spec` events: per request and step, what was drafted, what the target accepted (and,
for sampled requests, the p, q and uniform draw behind each decision), the bonus token, and
the request's running acceptance rate and tokens per target pass. A watched, sampled request
also gets the target's and the drafter's distributions at the check that decided the pass."""
from __future__ import annotations

from kvscope.engine.llm_engine import StepRecord
from kvscope.engine.spec_decode import SpecStats


DISTRIBUTION_TOP = 12   # tokens listed (the most likely under p or q); the rest summed


def spec_events(record: StepRecord, engine, ts: float, running: dict[int, SpecStats],
                watched: set[int] = frozenset()) -> list[dict]:
    """`running`: each request's totals so far (seq_id -> SpecStats), the caller's, updated here;
    `watched`: seq ids whose events carry the deciding check's p and q (`distribution`)."""
    speculator = engine.speculator
    entries = {e.seq.seq_id: e for e in record.scheduled.entries}
    events = []
    for seq_id, verdict in record.result.spec.items():
        seq = entries[seq_id].seq
        stats = running.setdefault(seq_id, SpecStats())
        stats.add(verdict)
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
        if seq_id in watched and verdict.checks and verdict.checks[0].rows is not None:
            events[-1]["distribution"] = _distribution(engine, verdict.checks)
    return events


def _distribution(engine, checks) -> dict:
    """p and q at the first rejected draft (where the leftover is drawn from), else the last
    check: the most likely tokens under either, and the mass of all the others."""
    i = next((k for k, c in enumerate(checks) if not c.accepted), len(checks) - 1)
    p, q = (row.float() for row in checks[i].rows)
    k = min(DISTRIBUTION_TOP, p.numel())
    likely = set(p.topk(k).indices.tolist()) | {t for t in q.topk(k).indices.tolist() if q[t] > 0}
    ids = sorted(likely, key=lambda t: -float(p[t]))[:DISTRIBUTION_TOP]
    if checks[i].token_id not in ids:
        ids[-1] = checks[i].token_id
    ps, qs = [float(p[t]) for t in ids], [float(q[t]) for t in ids]
    return {"check": i, "ids": ids, "text": _pieces(engine, ids), "p": [round(v, 6) for v in ps], "q": [round(v, 6) for v in qs],
            "p_rest": round(max(0.0, 1 - sum(ps)), 6), "q_rest": round(max(0.0, 1 - sum(qs)), 6)}


def _pieces(engine, ids: list[int]) -> list[str]:
    tok = engine.tokenizer
    return [tok.decode([i]) for i in ids] if tok is not None else [str(i) for i in ids]
