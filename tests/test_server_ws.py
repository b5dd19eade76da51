"""The WebSocket protocol against a real server and the embedded model: a round trip for
every command, every event checked against the JSON Schema (by the client helper)."""
from __future__ import annotations

import gc
import json
import time

import pytest

from kvscope.instrumentation.schema import SCHEMA_VERSION
from attention_frames import per_layer
from server_harness import TOKEN, Client, check_event

GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
HELLO_FIELDS = {
    "model": {"name", "architecture", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
              "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta", "num_params", "dtype",
              "dtype_bytes", "dtype_reason", "weight_bytes", "kv_bytes_per_token", "tie_word_embeddings"},
    "device": {"type", "name", "total_memory_bytes", "peak_bandwidth_bytes_per_s", "peak_flops"},
    "engine": {"block_size", "num_blocks", "kv_cache_bytes", "max_num_batched_tokens", "max_num_seqs",
               "max_model_len", "enable_prefix_caching", "attention_backend", "speculative",
               "tensor_parallel_size", "rank_weight_bytes", "decode", "kv_cache", "kv_cache_dtype",
               "prefill_attention", "decode_attention"},
}


@pytest.fixture
def learner(server):
    c = Client(server.ws)
    yield c
    c.close()


@pytest.fixture
def instructor(server):
    c = Client(server.ws, token=TOKEN)
    yield c
    c.ok("resume")
    c.close()


def finish_of(client: Client, rid: str, timeout: float = 30) -> dict:
    return client.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, timeout, since=0)


def token_of(client: Client, rid: str, index: int = 0) -> dict:
    return client.until(lambda e: e["type"] == "request.token" and e["request_id"] == rid and e["index"] == index,
                        since=0)


def test_connect_sends_hello_session_engine(server, learner):
    hello, session, engine = (learner.next_event() for _ in range(3))
    assert (hello["type"], session["type"], engine["type"]) == ("hello", "session", "engine")
    for block, fields in HELLO_FIELDS.items():
        assert set(hello[block]) == fields
    cfg = server.engine.model_config
    assert hello["schema_version"] == SCHEMA_VERSION == 5
    assert hello["model"]["num_layers"] == cfg.num_layers and hello["model"]["vocab_size"] == cfg.vocab_size
    assert hello["model"]["kv_bytes_per_token"] == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    assert hello["engine"]["num_blocks"] == server.num_blocks
    assert hello["device"]["peak_bandwidth_bytes_per_s"] > 0 and hello["device"]["total_memory_bytes"] > 0
    h100 = hello["h100"]
    assert (h100["bandwidth_bytes_per_s"], h100["num_sms"], h100["peak_flops_bf16"]) == (3.35e12, 132, 989e12)
    assert session["role"] == "learner" and session["limits"]["max_prompt_tokens"] > 0


def test_tokenize_reply_has_pieces_spans_and_specials(learner):
    text = "The café <|im_start|>user"
    reply = learner.ok("tokenize", text=text)
    assert reply["type"] == "tokens" and reply["text"] == text
    raw = text.encode()
    assert reply["tokens"][0]["start"] == 0 and reply["tokens"][-1]["end"] == len(raw)
    for a, b in zip(reply["tokens"], reply["tokens"][1:]):
        assert a["end"] == b["start"]          # spans tile the UTF-8 bytes
    specials = [t for t in reply["tokens"] if t["special"]]
    assert [t["piece"] for t in specials] == ["<|im_start|>"]
    joined = b"".join(raw[t["start"]:t["end"]] for t in reply["tokens"])
    assert joined == raw
    chat = learner.ok("tokenize", text="hi", chat=True)
    assert chat["text"].startswith("<|im_start|>user") and chat["tokens"][0]["special"]


def test_submit_streams_own_tokens_and_finishes(learner):
    ack = learner.ok("submit", prompt="Once upon a time", params=GREEDY)
    rid = ack["request_id"]
    done = finish_of(learner, rid)
    tokens = learner.events_of("request.token", rid)
    assert [t["index"] for t in tokens] == list(range(6))
    assert done["reason"] == "length" and done["num_output_tokens"] == 6
    assert "".join(t["text"] for t in tokens) == done["text"]
    added = learner.events_of("request.added", rid)[0]
    assert added["owner"] == learner.events_of("session")[0]["client_id"] and added["source"] == "ws"


def test_chat_messages_and_token_id_prompts(learner):
    ack = learner.ok("submit", messages=[{"role": "user", "content": "Tell me a story."}], params=GREEDY)
    assert finish_of(learner, ack["request_id"])["num_output_tokens"] == 6
    ack = learner.ok("submit", prompt_token_ids=[5, 6, 7], params={"max_tokens": 2, "ignore_eos": True})
    assert finish_of(learner, ack["request_id"])["num_prompt_tokens"] == 3


def test_late_joiner_snapshot_plus_deltas_match_the_pool(server, learner):
    server.wait_idle()
    late = Client(server.ws, subscribe="kv,request")
    try:
        snap = late.until(lambda e: e["type"] == "kv")
        assert snap["kind"] == "snapshot" and len(snap["blocks"]) == server.num_blocks
        blocks = {b["id"]: b for b in snap["blocks"]}
        tables = dict(snap["tables"])
        rid = learner.ok("submit", prompt="The little fox ran to the river and " * 3, params=GREEDY)["request_id"]
        finish_of(late, rid)
        server.wait_idle()
        late.drain(0.3)
        for e in late.seen:
            if e["type"] == "kv" and e["kind"] == "delta":
                blocks.update({b["id"]: b for b in e["blocks"]})
                tables.update(e["tables"])
                for gone in e["removed_tables"]:
                    tables.pop(gone, None)
        bm = server.engine.block_manager
        assert tables == {}
        assert [blocks[i]["ref"] for i in range(bm.num_blocks)] == [b.ref_count for b in bm.blocks]
        hashed = [i for i in range(bm.num_blocks) if blocks[i]["hash"] is not None]
        assert hashed == [b.block_id for b in bm.blocks if b.hash is not None]
        assert any(e["type"] == "request.token" for e in late.seen)   # others' requests, subscribed
    finally:
        late.close()


def test_subscribe_filter_by_request_and_unsubscribe(learner):
    other = learner.ok("submit", prompt="Tom went out", params=GREEDY)["request_id"]
    finish_of(learner, other)
    learner.ok("subscribe", families=["step"], filters={"request_id": "nope"})
    rid = learner.ok("submit", prompt="Mia baked", params=GREEDY)["request_id"]
    finish_of(learner, rid)
    learner.drain(0.3)
    assert learner.events_of("step"), "step events are global: a request filter does not hide them"
    reply = learner.ok("unsubscribe", families=["step"])
    assert reply["families"] == []
    learner.ok("subscribe", families=["request"])
    snap = learner.until(lambda e: e["type"] == "request.snapshot")
    assert isinstance(snap["requests"], list)
    assert learner.ok("snapshot", families=["kv"])["kind"] == "snapshot"
    assert learner.ok("ping")["cmd"] == "ping"


def test_watch_at_submit_gives_attention_and_sampling(server, learner):
    ack = learner.ok("submit", prompt="A tiny dragon", params={"temperature": 0.7, "top_k": 20, "max_tokens": 3,
                                                                "seed": 1, "ignore_eos": True},
                     watch={"layers": [0, 2], "heads": [0, 3]})
    rid = ack["request_id"]
    finish_of(learner, rid)
    learner.drain(0.3)
    frames = learner.events_of("attention", rid)
    assert all(a["layers"] == [0, 2] for a in frames) and len({a["step"] for a in frames}) == len(frames)
    att = per_layer(frames)
    n_prompt = ack["num_prompt_tokens"]
    first = [a for a in att if a["query_positions"][0] == 0]
    assert len(first) == 2 and first[0]["query_positions"] == list(range(n_prompt))
    group = server.engine.model_config.num_heads // server.engine.model_config.num_kv_heads
    for a in att:
        assert a["heads"] == [0, 3] and a["kv_heads"] == [0, 3 // group]
        for head in a["weights"]:
            for r, (pos, row) in enumerate(zip(a["query_positions"], head)):
                assert len(row) == a["context_len"]
                assert abs(sum(row) - 1) < 2e-3
                assert all(w == 0 for w in row[pos + 1:])     # causal
        for row in a["mean"]:
            assert abs(sum(row) - 1) < 2e-3
    samples = learner.events_of("sampling", rid)
    tokens = learner.events_of("request.token", rid)
    assert [s["chosen"]["id"] for s in samples] == [t["token_id"] for t in tokens]
    stage = {st["name"]: st for st in samples[0]["stages"]}
    assert stage["top_k"]["applied"] and stage["top_k"]["kept"] == 20 and not stage["top_p"]["applied"]
    assert samples[0]["draw"]["method"] == "sample"


def test_hold_next_release_owner_only(server, learner):
    ack = learner.ok("submit", prompt="The robot woke up", params={"temperature": 0, "max_tokens": 20,
                                                                   "ignore_eos": True}, hold=True)
    rid = ack["request_id"]
    other = Client(server.ws)
    try:
        quick = other.ok("submit", prompt="Every morning", params=GREEDY)["request_id"]
        finish_of(other, quick)                                    # nobody else is held
        assert learner.events_of("request.token", rid) == []
        assert other.call("next", request_id=rid)["code"] == "forbidden"
        learner.drain(0.2)
        assert learner.events_of("request.token", rid) == []
        for n in (1, 2):
            learner.ok("next", request_id=rid)
            token_of(learner, rid, n - 1)
            learner.drain(0.3)
            assert len(learner.events_of("request.token", rid)) == n   # exactly one token per next
        learner.ok("release", request_id=rid)
        assert finish_of(learner, rid)["num_output_tokens"] == 20
        rid2 = learner.ok("submit", prompt="Hold me", params={"max_tokens": 50, "ignore_eos": True})["request_id"]
        token_of(learner, rid2)
        learner.ok("hold", request_id=rid2)
        learner.drain(0.1)
        count = len(learner.events_of("request.token", rid2))
        learner.drain(0.3)
        assert len(learner.events_of("request.token", rid2)) == count
        learner.ok("cancel", request_id=rid2)
        assert finish_of(learner, rid2)["reason"] == "abort"
    finally:
        other.close()


def test_watch_and_unwatch_a_running_request(server, learner):
    rid = learner.ok("submit", prompt="In a small village", params={"temperature": 0, "max_tokens": 30,
                                                                    "ignore_eos": True}, hold=True)["request_id"]
    learner.ok("watch", request_id=rid, layers=[1], sampling=False)
    other = Client(server.ws, token=TOKEN)   # the instructor watching it too, other layers and heads
    try:
        other.ok("watch", request_id=rid, layers=[0, 1], heads=[2], sampling=False)
        learner.ok("next", request_id=rid)
        att = learner.until(lambda e: e["type"] == "attention" and e["request_id"] == rid, since=0)
        theirs = other.until(lambda e: e["type"] == "attention" and e["request_id"] == rid, since=0)
    finally:
        other.close()
    assert att["layers"] == [1] and len(att["heads"]) == 8     # each viewer gets its own cut of one event
    assert theirs["layers"] == [0, 1] and theirs["heads"] == [2] and theirs["step"] == att["step"]
    assert theirs["weights"][1][0] == att["weights"][0][2] and len(theirs["mean"]) == 2
    learner.ok("unwatch", request_id=rid)
    seen = len(learner.events_of("attention", rid))
    learner.ok("next", request_id=rid)
    token_of(learner, rid, 1)
    learner.drain(0.3)
    assert len(learner.events_of("attention", rid)) == seen and not learner.events_of("sampling", rid)
    assert learner.call("watch", request_id="r999999")["code"] == "unknown_request"
    assert learner.call("watch", request_id=rid, layers=[99])["code"] == "invalid_field"
    learner.ok("cancel", request_id=rid)


def test_cancel_frees_every_block(server, learner):
    server.wait_idle()
    start = server.engine.block_manager.num_free_blocks
    rid = learner.ok("submit", prompt="Once upon a time " * 20, params={"max_tokens": 200, "ignore_eos": True})["request_id"]
    token_of(learner, rid)
    assert server.engine.block_manager.num_free_blocks < start
    learner.ok("cancel", request_id=rid)
    assert finish_of(learner, rid)["reason"] == "abort"
    server.wait_idle(5)
    assert server.engine.block_manager.num_free_blocks == start
    assert learner.call("cancel", request_id=rid)["code"] == "unknown_request"


def test_disconnect_mid_generation_frees_every_block(server, learner):
    server.wait_idle()
    start = server.engine.block_manager.num_free_blocks
    learner.ok("subscribe", families=["request"])
    leaver = Client(server.ws)
    rid = leaver.ok("submit", prompt="The old lighthouse keeper " * 10,
                    params={"max_tokens": 200, "ignore_eos": True})["request_id"]
    token_of(leaver, rid)
    leaver.close()
    assert finish_of(learner, rid)["reason"] == "abort"
    server.wait_idle(5)
    assert server.engine.block_manager.num_free_blocks == start


def test_learner_cannot_use_instructor_commands(server, learner):
    for kind, fields in (("pause", {}), ("step", {}), ("reset", {}), ("set_knobs", {"max_num_seqs": 1}),
                         ("inject", {"n": 1}), ("record_start", {}), ("viewers", {})):
        reply = learner.call(kind, **fields)
        assert reply["type"] == "error" and reply["code"] == "forbidden", kind
    assert not server.service.aengine.paused
    assert learner.call("auth", token="wrong")["code"] == "forbidden"


def test_pause_then_step_advances_exactly_one_step(server, instructor, learner):
    server.wait_idle()
    instructor.ok("subscribe", families=["step"])
    instructor.ok("pause")
    assert instructor.until(lambda e: e["type"] == "engine")["paused"]
    rid = learner.ok("submit", prompt="Tom looked out", params=GREEDY)["request_id"]
    time.sleep(0.4)
    before = server.engine.scheduler.num_steps
    assert not learner.events_of("request.token", rid)
    steps_seen, mark = len(instructor.events_of("step")), len(instructor.seen)
    reply = instructor.ok("step")
    assert reply["step"] == before + 1 == server.engine.scheduler.num_steps
    step = instructor.until(lambda e: e["type"] == "step", since=mark)
    assert step["step"] == before + 1 and step["seqs"][0]["request_id"] == rid
    instructor.drain(0.4)
    assert len(instructor.events_of("step")) == steps_seen + 1 and server.engine.scheduler.num_steps == before + 1
    assert token_of(learner, rid)["index"] == 0
    instructor.ok("resume")
    assert finish_of(learner, rid)["num_output_tokens"] == 6


def test_instructor_knobs_inject_viewers_reset(server, instructor, learner):
    reply = instructor.ok("set_knobs", max_num_seqs=3, prefill_chunk_size=8)
    assert reply["knobs"]["max_num_seqs"] == 3 and reply["knobs"]["prefill_chunk_size"] == 8
    assert instructor.until(lambda e: e["type"] == "engine" and e["reason"] == "knobs", since=0)["knobs"]["max_num_seqs"] == 3
    bad = instructor.call("set_knobs", enable_chunked_prefill=False)
    assert bad["code"] == "invalid_field" and "max_num_batched_tokens" in bad["message"]
    instructor.ok("subscribe", families=["step", "request"])
    rids = instructor.ok("inject", n=4, max_tokens=3, prompt_tokens=20)["request_ids"]
    assert len(rids) == 4
    for rid in rids:
        finish_of(instructor, rid)
    steps = [e for e in instructor.events_of("step") if any(s["request_id"] in rids for s in e["seqs"])]
    assert max(len(s["seqs"]) for s in steps) <= 3                       # the knob holds
    assert all(s["num_tokens"] <= 8 for e in steps for s in e["seqs"])   # chunked at 8
    instructor.ok("set_knobs", max_num_seqs=64, prefill_chunk_size=None)
    viewers = instructor.ok("viewers")["viewers"]
    assert {"instructor", "learner"} <= {v["role"] for v in viewers}
    rid = learner.ok("submit", prompt="Long story " * 5, params={"max_tokens": 200, "ignore_eos": True})["request_id"]
    token_of(learner, rid)
    learner.ok("subscribe", families=["kv"])
    assert instructor.ok("reset")["aborted"] >= 1
    assert finish_of(learner, rid)["reason"] == "abort"
    snap = learner.until(lambda e: e["type"] == "kv" and e["kind"] == "snapshot" and e["prefix_hits"] == 0
                         and e["num_free"] == e["num_blocks"] and not e["tables"], since=0)
    assert all(b["ref"] == 0 and b["hash"] is None for b in snap["blocks"])
    server.wait_idle(5)


def test_record_start_stop_writes_a_valid_recording(server, instructor, learner, tmp_path):
    server.service.config.recordings_dir = tmp_path
    assert instructor.ok("record_start", name="unit")["name"] == "unit"
    assert instructor.call("record_start")["code"] == "invalid_field"
    rid = learner.ok("submit", prompt="Mia wanted", params=GREEDY)["request_id"]
    finish_of(learner, rid)
    learner.ok("tokenize", text="recorded")
    stop = instructor.ok("record_stop")
    lines = (tmp_path / "unit.jsonl").read_text().splitlines()
    header, events = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    assert header["format"] == "kvscope-recording" and header["name"] == "unit"
    assert stop["events"] == len(events) - 1 or stop["events"] <= len(events)
    assert events[0]["type"] == "hello"
    for e in events:
        check_event(e)
    types = {e["type"] for e in events}
    assert {"request.added", "request.token", "request.finished", "step", "kv", "tokens"} <= types
    assert instructor.call("record_stop")["code"] == "invalid_field"


def test_sandbox_commands_drive_a_real_block_manager(learner):
    s = learner.ok("sandbox", op="reset", num_blocks=16, block_size=4, max_model_len=32)
    assert s["num_free"] == 16 and s["seqs"] == []
    s = learner.ok("sandbox", op="allocate", seq="A", tokens=10)
    a = s["seqs"][0]
    assert a["block_table"] and len(a["block_table"]) == 3 and s["num_free"] == 13
    full = [b for b in s["blocks"] if b["owners"] == ["A"] and b["filled"] == 4]
    assert len(full) == 2 and all(b["hash"] for b in full)
    frag = s["fragmentation"]
    assert frag["paged"] == {"reserved_slots": 12, "used_slots": 10, "shared_slots_saved": 0,
                             "internal_waste_slots": 2, "waste_fraction": round(2 / 12, 4)}
    assert frag["contiguous"]["reserved_slots"] == 32 and frag["contiguous"]["waste_slots"] == 22
    s = learner.ok("sandbox", op="fork", seq="A", new_seq="B")
    shared = [b for b in s["blocks"] if b["ref"] == 2]   # the partly filled block too, until written
    assert len(shared) == 3 and s["num_free"] == 13 and s["last"]["shared_blocks"] == 3
    assert s["fragmentation"]["paged"]["shared_slots_saved"] == 12
    s = learner.ok("sandbox", op="allocate", seq="C", tokens=9, prefix_of="A", prefix_tokens=8)
    assert s["last"]["hits"] == 2 and s["seqs"][2]["cached_tokens"] == 8
    s = learner.ok("sandbox", op="append", seq="A", tokens=3)
    assert next(q for q in s["seqs"] if q["name"] == "A")["num_tokens"] == 13
    assert s["last"]["copied_blocks"] == 1 and s["last"]["new_blocks"] == 1   # copy-on-write, then a fresh block
    s = learner.ok("sandbox", op="free", seq="B")
    assert [q["name"] for q in s["seqs"]] == ["A", "C"]
    assert learner.call("sandbox", op="append", seq="A", tokens=64)["code"] in ("sandbox", "invalid_field")
    assert learner.call("sandbox", op="free", seq="Z")["code"] == "sandbox"
    assert learner.call("sandbox", op="allocate", seq="A", tokens=2)["code"] == "sandbox"
    for i in range(5):
        learner.call("sandbox", op="allocate", seq=f"X{i}", tokens=12)
    full_reply = learner.call("sandbox", op="allocate", seq="Y", tokens=12)
    assert full_reply["code"] == "sandbox" and "out of blocks" in full_reply["message"]
    assert learner.ok("sandbox", op="state")["num_blocks"] == 16


def test_origin_check(server):
    from websockets.exceptions import ConnectionClosed
    evil = Client(server.ws, origin="https://evil.example.com")
    with pytest.raises(ConnectionClosed) as closed:
        evil.next_event(timeout=5)
    assert closed.value.rcvd.code == 1008 and "origin not allowed" in closed.value.rcvd.reason
    for origin in (f"http://localhost:{server.port}", "http://127.0.0.1:5173", f"http://127.0.0.1:{server.port}"):
        c = Client(server.ws, origin=origin)
        assert c.next_event()["type"] == "hello"
        c.close()


def test_auth_upgrades_to_instructor(server):
    c = Client(server.ws)
    try:
        assert c.ok("auth", token=TOKEN)["role"] == "instructor"
        assert c.until(lambda e: e["type"] == "session" and e["role"] == "instructor")
        assert c.ok("viewers")["viewers"]
    finally:
        c.close()


def test_start_up_stays_out_of_the_collectors_walks_while_serving(server):
    """The service freezes what start-up made (kvscope.heap: a watched step's garbage would
    otherwise make each full collection walk the model and the compiled step again), and
    thaws it when it stops, so an engine dropped in a process that goes on is collected."""
    from server_harness import LiveServer
    assert gc.get_freeze_count() > 10_000
    other = LiveServer()
    other.stop()
    assert gc.get_freeze_count() == 0
