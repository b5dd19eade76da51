"""The instrumentation on the engine itself (no server): events are valid, the `kv`
snapshot + deltas reproduce the block manager exactly, attention weights equal
transformers' own (after the trip through a binary frame), watching one request leaves the
others on the compiled path with the same tokens, the sampling view is consistent, the
cost model adds up, and nothing is built when nobody listens."""
from __future__ import annotations

import json

import pytest
import torch

from kvscope.engine.llm_engine import LLMEngine
from kvscope.instrumentation import Instrumentation, WatchSpec, attach_for_bench
from kvscope.instrumentation.cost import attention_pairs, step_cost
from kvscope.instrumentation.encode import binary_frame, decode, json_text
from kvscope.instrumentation.tokens import tokens_event
from kvscope.sampling_params import SamplingParams
from attention_frames import per_layer
from server_harness import check_event, model_path

PROMPTS = ["Once upon a time, a little fox found a shiny stone by the river.",
           "Once upon a time, a little fox found a shiny stone by the sea and",
           "The old lighthouse keeper climbed the stairs every evening and"]


def make_engine(**kw) -> LLMEngine:
    args = dict(model=model_path(), device="cpu", dtype="float32", block_size=4, num_kv_blocks=64,
                max_num_batched_tokens=64, num_threads=1)
    return LLMEngine(**{**args, **kw})


@pytest.fixture(scope="module")
def engine():
    return make_engine()


F16_ATOL = 1e-3   # float16 keeps 11 significant bits: weights up to 1 are within 5e-4 of float32


def wire(e: dict) -> dict:
    """An attention event as a viewer gets it: its recorded form checked against the schema,
    its binary frame decoded (float32 arrays)."""
    check_event(json.loads(json_text(e)))
    return decode(binary_frame(e))


def run_to_end(engine: LLMEngine) -> None:
    while engine.has_unfinished():
        engine.step()


def watched_run(engine: LLMEngine, prompt, params: SamplingParams, spec: WatchSpec = WatchSpec()) -> tuple:
    """`prompt` run to its end with its request watched as `spec` asks; returns (seq, events)."""
    events = []
    instr = Instrumentation(engine, events.extend)
    seq = engine.add_request(prompt, params)
    instr.watch(seq.request_id, "test", spec, seq)
    run_to_end(engine)
    instr.detach()
    return seq, events


def hf_attentions(seq) -> tuple:
    """transformers' eager attention over every token but the last (it has no prefix cache:
    the uncached reference), per layer [1, heads, rows, ctx]."""
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(model_path(), attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([seq.token_ids[:-1]]), output_attentions=True).attentions


def apply_kv(mirror: dict, e: dict) -> None:
    if e["kind"] == "snapshot":
        mirror["blocks"] = {b["id"]: b for b in e["blocks"]}
        mirror["tables"] = dict(e["tables"])
    else:
        mirror["blocks"].update({b["id"]: b for b in e["blocks"]})
        mirror["tables"].update(e["tables"])
        for rid in e["removed_tables"]:
            mirror["tables"].pop(rid)
    mirror.update({k: e[k] for k in ("num_free", "num_cached", "prefix_hits", "evictions")})


def test_no_listener_no_work(engine):
    assert engine.observers == [] and engine.block_manager.events is None
    instr = attach_for_bench(engine, "listen")
    assert engine.block_manager.events == []
    instr.detach()
    assert engine.observers == [] and engine.block_manager.events is None
    assert attach_for_bench(engine, "off") is None and engine.observers == []
    with pytest.raises(ValueError):
        attach_for_bench(engine, "loud")


def mirror_sink(engine: LLMEngine, mirror: dict, events: list):
    """A sink that applies each `kv` event to `mirror` and checks it against the live pool
    after every batch: ref counts, hashes, owners, tables and the totals."""
    def sink(batch):
        for e in batch:
            events.append(check_event(e))
            if e["type"] == "kv":
                apply_kv(mirror, e)
        bm = engine.block_manager
        live = {s.request_id: s for s in engine.scheduler.running + list(engine.scheduler.waiting)}
        assert mirror["num_free"] == bm.num_free_blocks
        assert mirror["num_cached"] == sum(1 for b in bm.blocks if b.ref_count == 0 and b.hash is not None)
        assert (mirror["prefix_hits"], mirror["evictions"]) == (bm.num_prefix_hits, bm.num_evictions)
        assert mirror["tables"] == {rid: s.block_table for rid, s in live.items() if s.block_table}
        for b in bm.blocks:
            shown = mirror["blocks"][b.block_id]
            assert shown["ref"] == b.ref_count and (shown["hash"] is None) == (b.hash is None)
            assert sorted(shown["owners"]) == sorted(r for r, s in live.items() if b.block_id in s.block_table)
    return sink


def test_kv_snapshot_plus_deltas_track_the_pool_through_preemption_and_hits():
    engine = make_engine(num_kv_blocks=24, max_num_batched_tokens=32)   # small: forces preemption
    mirror, events = {}, []
    bm = lambda: engine.block_manager   # noqa: E731
    sink = mirror_sink(engine, mirror, events)

    instr = Instrumentation(engine, sink)
    sink([instr.kv_snapshot()])
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for p in PROMPTS * 2:
        engine.add_request(p, params)
    run_to_end(engine)
    steps = [e for e in events if e["type"] == "step"]
    assert any(s["preempted"] for s in steps), "the test pool should force a preemption"
    assert any(e["op"] == "hit" for e in events if e["type"] == "kv" and e["kind"] == "delta" for e in e["events"])
    assert mirror["num_free"] == bm().num_blocks
    finished = [e for e in events if e["type"] == "request.finished"]
    assert len(finished) == 6 and all(f["num_output_tokens"] == 24 for f in finished)
    rid = engine.add_request(PROMPTS[2], params).request_id
    engine.step()
    engine.abort(rid)                      # between steps: a delta arrives at once
    assert events[-1]["type"] == "kv" and rid in events[-1]["removed_tables"]
    instr.detach()


def test_kv_tracker_attached_mid_run_follows_forks_and_drafts():
    """The tracker reads the pool once, when it attaches (here with requests already
    holding blocks), then only the steps' events and tables: forked choices sharing a
    prompt, copy-on-write, drafts trimmed after rejection and evictions must all show."""
    engine = make_engine(num_kv_blocks=40, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine.add_request(PROMPTS[0] * 2, params)
    engine.step()
    engine.step()
    mirror, events = {}, []
    sink = mirror_sink(engine, mirror, events)
    instr = Instrumentation(engine, sink)
    sink([instr.kv_snapshot()])
    assert mirror["tables"], "attached while a request holds blocks"
    ids = engine.tokenize(PROMPTS[1])
    ids = ids[:len(ids) // 4 * 4 - 2]   # a partial last block: the first write of each fork copies it
    engine.add_request(ids, SamplingParams(temperature=0.8, seed=1, n=3, max_tokens=12, ignore_eos=True))
    for p in PROMPTS:
        engine.add_request(p, params)
    run_to_end(engine)
    ops = {ev["op"] for e in events if e["type"] == "kv" and e["kind"] == "delta" for ev in e["events"]}
    assert {"share", "cow", "hit", "evict"} <= ops, ops
    instr.detach()


def test_attention_weights_match_transformers(engine):
    seq, events = watched_run(engine, PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    frames = [wire(e) for e in events if e["type"] == "attention"]
    cfg = engine.model_config
    assert len(frames) == 4                                     # prefill + 3 decode steps: one event each
    assert all(a["layers"] == list(range(cfg.num_layers)) for a in frames)
    att = per_layer(frames)
    check_against_transformers(att, seq)


def check_against_transformers(att: list[dict], seq) -> None:
    ref = hf_attentions(seq)
    for a in att:
        ours = torch.from_numpy(a["weights"])                    # [heads, rows, ctx]
        want = ref[a["layer"]][0][a["heads"]][:, a["query_positions"], :a["context_len"]]
        assert torch.allclose(ours, want, atol=F16_ATOL), (a["layer"], a["query_positions"][0])
        assert torch.allclose(torch.from_numpy(a["mean"]), ref[a["layer"]][0].mean(0)[a["query_positions"], :a["context_len"]],
                              atol=F16_ATOL)
        first = a["context_len"] - len(a["token_ids"])   # the whole context, or what is new since the last event
        assert first in (0, a["query_positions"][0]) and a["token_ids"] == seq.token_ids[first:a["context_len"]]


def test_attention_token_ids_are_sent_once_and_again_whole_to_a_viewer_that_joins(engine):
    """A request's first attention event lists its whole context, each later one the key
    positions new since the last; a viewer joining the watch gets the whole context again."""
    events = []
    instr = Instrumentation(engine, events.extend)
    seq = engine.add_request(PROMPTS[2], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    instr.watch(seq.request_id, "first", WatchSpec(layers=frozenset({0})), seq)
    for _ in range(3):
        engine.step()
    instr.watch(seq.request_id, "second", WatchSpec(layers=frozenset({1})), seq)
    run_to_end(engine)
    instr.detach()
    att = [e for e in events if e["type"] == "attention"]
    starts = [a["context_len"] - len(a["token_ids"]) for a in att]
    joined = next(i for i, a in enumerate(att) if 1 in a["layers"])   # the first after the second viewer
    assert joined == 3 and len(att) > joined + 1 and starts[0] == starts[joined] == 0
    assert all(starts[i] == att[i]["query_positions"][0] > 0 for i in range(1, len(att)) if i != joined)
    for a, first in zip(att, starts):
        assert a["token_ids"] == seq.token_ids[first:a["context_len"]]


def test_watching_leaves_the_others_compiled_and_their_tokens_unchanged():
    """One request watched (layers 1 and 3, heads 0 and 5): every decode step still runs the
    compiled graph, every request draws the same tokens as unwatched, and the watched one's
    attention equals transformers' for just those layers and heads."""
    engine = make_engine(cpu_compile=True, max_num_seqs=8)
    compiled_runs = []
    run = engine.runner.compiled.run
    engine.runner.compiled.run = lambda inputs: compiled_runs.append(len(inputs.input_ids)) or run(inputs)

    def generate(watch: bool) -> tuple[list[list[int]], list[dict]]:
        events = []
        instr = Instrumentation(engine, events.extend)
        seqs = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)) for p in PROMPTS]
        if watch:
            instr.watch(seqs[1].request_id, "test", WatchSpec(layers=frozenset({1, 3}), heads=frozenset({0, 5})),
                        seqs[1])
        run_to_end(engine)
        instr.detach()
        engine.block_manager.reset_prefix_cache()
        return [s.output_token_ids for s in seqs], events, seqs

    plain, _, _ = generate(watch=False)
    unwatched_runs, compiled_runs[:] = list(compiled_runs), []
    watched, events, seqs = generate(watch=True)
    assert watched == plain
    assert compiled_runs == unwatched_runs and len(compiled_runs) == 5   # 5 decode steps, all 3 rows each
    frames = [wire(e) for e in events if e["type"] == "attention"]
    assert len(frames) == 6 and all(a["layers"] == [1, 3] for a in frames)   # the prompt and 5 decode steps
    att = per_layer(frames)
    assert all(a["heads"] == [0, 5] for a in att)
    assert len([e for e in events if e["type"] == "sampling"]) == 6
    check_against_transformers(att, seqs[1])


def test_prefix_cached_rows_are_recomputed_and_equal_an_uncached_run():
    engine = make_engine()
    first = engine.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=1))
    run_to_end(engine)
    seq, events = watched_run(engine, PROMPTS[0], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert seq.num_cached_tokens >= 8 and first.num_prompt_tokens == seq.num_prompt_tokens
    att = per_layer([wire(e) for e in events if e["type"] == "attention"])
    ref = hf_attentions(seq)
    for layer in range(engine.model_config.num_layers):
        rows = {p: a for a in att if a["layer"] == layer for p in a["query_positions"]}
        assert sorted(rows) == list(range(len(seq.token_ids) - 1))      # no blank prompt row
        for a in (a for a in att if a["layer"] == layer):
            assert a["recomputed"] == (a["query_positions"][-1] < seq.num_cached_tokens)
            want = ref[layer][0][:, a["query_positions"], :a["context_len"]]
            assert torch.allclose(torch.from_numpy(a["weights"]), want, atol=F16_ATOL)


def test_sampling_event_follows_each_filter(engine):
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, max_tokens=3, seed=3, ignore_eos=True)
    seq, events = watched_run(engine, PROMPTS[1], params, WatchSpec(layers=frozenset()))
    _, greedy_events = watched_run(engine, PROMPTS[1], SamplingParams(temperature=0, max_tokens=1),
                                   WatchSpec(layers=frozenset()))
    events += greedy_events
    samples = [check_event(e) for e in events if e["type"] == "sampling"]
    assert [s["chosen"]["id"] for s in samples[:3]] == seq.output_token_ids
    assert not [e for e in events if e["type"] == "attention"]        # layers=[] : no attention asked
    for s in samples[:3]:
        stage = {st["name"]: st for st in s["stages"]}
        assert stage["top_k"]["kept"] == 50 and stage["top_p"]["kept"] <= 50
        assert stage["min_p"] == {"name": "min_p", "applied": False}   # not applied: no numbers of its own
        raw = stage["logits"]["probs"][:10]
        assert raw == sorted(raw, reverse=True)
        assert s["draw"]["cdf_low"] < s["draw"]["cdf_high"] <= 1.0
        assert abs(s["draw"]["cdf_high"] - s["draw"]["cdf_low"] - s["chosen"]["prob"]) < 1e-4
    g = samples[-1]
    assert g["draw"] == {"method": "greedy", "rank": 0, "cdf_low": 0.0, "cdf_high": g["draw"]["cdf_high"]}
    assert g["chosen"]["id"] == g["candidates"]["ids"][0]


def test_step_cost_model(engine):
    f = Instrumentation(engine, lambda batch: None).facts
    assert attention_pairs(0, 4) == 1 + 2 + 3 + 4 and attention_pairs(9, 1) == 10
    cost = step_cost(f, [(9, 1, True), (0, 5, True)], model_seconds=0.01)
    kv = f.kv_bytes_per_token
    assert cost["weight_bytes"] == f.read_weight_bytes
    assert cost["kv_read_bytes"] == (10 + 5) * kv and cost["kv_write_bytes"] == 6 * kv
    flops = 2 * f.layer_matmul_params * 6 + 4 * f.num_layers * f.num_heads * f.head_dim * (10 + 15) \
        + 2 * f.lm_head_params * 2
    assert cost["flops"] == flops
    assert cost["achieved_bytes_per_s"] == pytest.approx(cost["bytes"] / 0.01)
    h = cost["h100"]
    assert h["bytes"] == cost["bytes"] // 2 and h["bound"] == "memory"        # fp32 here, bf16 there
    assert h["time_s"] == pytest.approx(max(h["bytes"] / 3.35e12, flops / 989e12))
    cfg = engine.model_config
    assert f.layer_matmul_params == cfg.num_layers * (
        cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        + cfg.num_heads * cfg.head_dim * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size)
    memory = check_event(Instrumentation(engine, lambda b: None).memory())
    assert memory["weights_bytes"] == f.weight_bytes and memory["kv_cache_bytes"] == engine.runner.kv_cache_bytes


def test_bench_modes_count_what_they_build(engine):
    counts = {}
    for mode in ("listen", "watch"):
        instr = attach_for_bench(engine, mode)
        for p in PROMPTS:
            engine.add_request(p, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        run_to_end(engine)
        instr.detach()
        counts[mode] = instr.sink.by_type
    assert counts["listen"]["step"] > 0 and counts["listen"]["request.token"] == 9
    assert counts["listen"]["attention"] == 0
    # the first request, 3 steps, every layer in one event each; its prompt is cached by the
    # listen round, so one more event rebuilds the cached rows
    assert counts["watch"]["attention"] == 4


def test_tokens_event_spans_tile_the_bytes(engine):
    text = "Naïve 🙂 fox<|im_end|>\n"
    e = check_event(tokens_event(engine.tokenizer, text))
    raw = text.encode()
    assert b"".join(raw[t["start"]:t["end"]] for t in e["tokens"]) == raw
    assert [t["piece"] for t in e["tokens"] if t["special"]] == ["<|im_end|>"]
    partial = [t for t in e["tokens"] if not t["complete"]]
    assert all("\\x" in t["text"] for t in partial)
    assert e["ids"] == engine.tokenize(text)
