"""The sampling view (`watch.sampling_events`, every watched row at once) against the rule
docs/events.md states, computed here one row at a time: each stage filters the row before
it (or, where the request does not apply it, says so and sends no numbers), the candidates are the 10
likeliest allowed tokens plus the chosen one, the draw is the chosen token's slice of the
final distribution. Rows of every kind share a batch, as a class's do."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from kvscope.engine.sampler import apply_min_p, apply_temperature, apply_top_k, apply_top_p, filtered_logits
from kvscope.instrumentation.watch import TokenTexts, sampling_events, token_texts
from kvscope.sampling_params import SamplingParams
from server_harness import check_event

NEG_INF = float("-inf")


class BitmaskGrammar:
    """What the sampling view reads of a grammar: its latest mask, packed 32 tokens a word."""

    def __init__(self, allowed: list[int], vocab: int):
        bits = torch.zeros((vocab + 31) // 32 * 32, dtype=torch.int64)
        bits[allowed] = 1
        words = (bits.view(-1, 32) << torch.arange(32)).sum(1)
        self.last_bitmask = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
        self.vocab_size = vocab


def reference_event(row: torch.Tensor, p: SamplingParams, chosen: int, allowed: list[int] | None) -> dict:
    """One row's stages and draw, by the documented rule, with the engine's own filters."""
    model = row.clone()
    if allowed is not None:
        row = torch.full_like(row, NEG_INF).index_put_((torch.tensor(allowed),), row[allowed])
    finite = int(torch.isfinite(row).sum())
    order = row.topk(min(10, finite)).indices.tolist()
    order += [] if chosen in order else [chosen]
    applies = {"temperature": not p.greedy, "top_k": not p.greedy and p.top_k > 0,
               "top_p": not p.greedy and p.top_p < 1.0, "min_p": not p.greedy and p.min_p > 0.0}
    filters = {"temperature": (apply_temperature, p.temperature), "top_k": (apply_top_k, p.top_k),
               "top_p": (apply_top_p, p.top_p), "min_p": (apply_min_p, p.min_p)}
    stages, cur = [("logits", True, row)], row
    for name, (fn, arg) in filters.items():
        if applies[name]:
            cur = fn(cur[None], torch.tensor([arg]))[0]
        stages.append((name, applies[name], cur))
    shown = []
    for name, applied, t in stages:
        probs = t.softmax(0)
        shown.append({"name": name, "applied": applied, "kept": int(torch.isfinite(t).sum()),
                      "logits": [None if t[i] == NEG_INF else float(t[i]) for i in order],
                      "probs": [float(probs[i]) for i in order]})
    final = stages[-1][2].softmax(0).double()
    above = final > final[chosen]
    low = float(final[above].sum())
    return {"ids": order, "stages": shown, "rank": int(above.sum()), "cdf": (min(low, 1.0), min(low + float(final[chosen]), 1.0)),
            "prob": float(final[chosen]), "logprob": float(model.log_softmax(0)[chosen]),
            "allowed": None if allowed is None else len(allowed)}


def random_batch(rng: random.Random, n: int, vocab: int, masked_share: float):
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(rng.randrange(2**31))) * 4
    seqs, chosen, allowed_rows = [], [], []
    for r in range(n):
        kind = rng.choice(["greedy", "temperature", "top_k", "top_p", "min_p", "all"])
        kw = {"temperature": 0.0} if kind == "greedy" else {"temperature": rng.choice([0.5, 1.0, 1.5])}
        if kind in ("top_k", "all"):
            kw["top_k"] = rng.choice([1, 5, 40])
        if kind in ("top_p", "all"):
            kw["top_p"] = rng.choice([0.5, 0.95])
        if kind in ("min_p", "all"):
            kw["min_p"] = rng.choice([0.02, 0.3])
        params = SamplingParams(max_tokens=4, **kw)
        allowed = None
        if rng.random() < masked_share:
            allowed = sorted(rng.sample(range(vocab), rng.choice([1, 4, 12, vocab // 2])))
        row = logits[r] if allowed is None else torch.full((vocab,), NEG_INF).index_put_(
            (torch.tensor(allowed),), logits[r, allowed])
        if params.greedy:
            token = int(row.argmax())
        else:   # any token the filters keep, the likely and the unlikely alike
            token = rng.choice(filtered_logits(row[None], [params]).isfinite()[0].nonzero().flatten().tolist())
        grammar = None if allowed is None else BitmaskGrammar(allowed, vocab)
        seqs.append(SimpleNamespace(request_id=f"r{r}", num_output_tokens=r + 1, params=params, grammar=grammar))
        chosen.append(token)
        allowed_rows.append(allowed)
    return logits, seqs, chosen, allowed_rows


@pytest.mark.parametrize("seed,n,vocab,masked_share", [(0, 24, 300, 0.3), (3, 16, 300, 0.0), (1, 9, 7, 0.3),
                                                       (2, 1, 300, 0.0)])
def test_sampling_view_follows_the_rule_row_by_row(seed, n, vocab, masked_share):
    rng = random.Random(seed)
    logits, seqs, chosen, allowed_rows = random_batch(rng, n, vocab, masked_share)
    internals = [r % 3 == 0 for r in range(n)]
    events = sampling_events(seqs, 7, logits, chosen, TokenTexts(lambda i: f"t{i}"), 1.25, internals)
    assert len(events) == n
    kinds = set()
    for r, (e, seq) in enumerate(zip(events, seqs)):
        check_event(e)   # docs/events.schema.json
        want = reference_event(logits[r], seq.params, chosen[r], allowed_rows[r])
        p = seq.params
        assert list(e) == ["type", "ts", "request_id", "step", "index", "params", "candidates", "stages", "draw",
                           "chosen"] \
            + (["allowed_tokens"] if want["allowed"] is not None else []) + (["distribution"] if internals[r] else [])
        assert (e["type"], e["ts"], e["request_id"], e["step"], e["index"]) == ("sampling", 1.25, f"r{r}", 7, r)
        assert e["params"] == {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p}
        assert e.get("allowed_tokens") == want["allowed"]
        assert e["candidates"] == {"ids": want["ids"], "texts": [f"t{i}" for i in want["ids"]]}
        for got, ref in zip(e["stages"], want["stages"], strict=True):
            if not ref["applied"]:   # it changed nothing: its name and flag, no numbers
                assert got == {"name": ref["name"], "applied": False}
                continue
            assert list(got) == ["name", "applied", "kept", "logits", "probs"]
            assert (got["name"], got["applied"], got["kept"]) == (ref["name"], ref["applied"], ref["kept"])
            assert [v is None for v in got["logits"]] == [v is None for v in ref["logits"]]   # parallel to the ids
            assert [v for v in got["logits"] if v is not None] == pytest.approx(
                [v for v in ref["logits"] if v is not None], abs=1e-4)
            assert got["probs"] == pytest.approx(ref["probs"], abs=2e-6)
        draw = e["draw"]
        assert draw["method"] == ("greedy" if p.greedy else "sample") and draw["rank"] == want["rank"]
        assert (draw["cdf_low"], draw["cdf_high"]) == pytest.approx(want["cdf"], abs=2e-6)
        assert e["chosen"] == {"id": chosen[r], "text": f"t{chosen[r]}", "prob": pytest.approx(want["prob"], abs=2e-6),
                               "logprob": pytest.approx(want["logprob"], abs=2e-6)}
        applied = [st for st in e["stages"] if st["applied"]]
        numbers = [v for st in applied for v in st["logits"] if v is not None]
        assert all(round(v, 4) == v for v in numbers)   # sent rounded: 4 decimals a logit, 6 a probability
        assert all(round(v, 6) == v for v in [v for st in applied for v in st["probs"]]
                   + [draw["cdf_low"], draw["cdf_high"], e["chosen"]["prob"], e["chosen"]["logprob"]])
        kinds |= {"masked" * (want["allowed"] is not None), "below the top" * (want["rank"] > 0),
                  "chosen added" * (len(e["candidates"]["ids"]) > min(10, want["allowed"] or vocab))}
    if n > 10:   # the big batches have rows of every kind the view treats apart
        assert {"masked" * (masked_share > 0), "below the top", "chosen added"} <= kinds


def test_token_texts_decode_each_id_once_per_tokenizer():
    calls = []

    class Tokenizer:
        def decode(self, ids):
            calls.append(ids)
            return f"<text {ids[0]}>"

    tok = Tokenizer()
    texts = token_texts(tok)
    assert [texts[5], texts[9], texts[5]] == ["<text 5>", "<text 9>", "<text 5>"]
    assert token_texts(tok) is texts and token_texts(tok)[9] == "<text 9>"   # a second observer shares them
    assert calls == [[5], [9]]
    assert token_texts(None)[42] == "<42>"
