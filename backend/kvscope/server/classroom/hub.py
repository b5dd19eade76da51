"""The fan-out: engine events in (from the engine thread, a batch per step), frames out to
every viewer, the SSE followers of a request, the recording and the metrics; the hub is also
the StreamState late joiners' snapshots come from. Each event is serialised once (JSON, or a
binary frame for a watched request's arrays, encoded on the event loop so the engine thread
never waits for their copy to the host). Viewers with no filters and no request of their own
in the batch share one chunk per set of families: the work per step grows with the kinds of
viewer, not with viewers × events."""
from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from pathlib import Path

from kvscope.instrumentation.encode import cut_attention, dumps, frame, json_text
from kvscope.instrumentation.recording import Recorder
from kvscope.instrumentation.watch import WatchRegistry
from kvscope.server.classroom.stream_state import StreamState
from kvscope.server.classroom.viewer import Chunk, Viewer

HEAVY_FAMILIES = ("internals",)   # large JSON: serialised on the engine thread, not the event loop
RECORDED_REPLIES = ("tokens", "sandbox", "kv_quant")   # replies a replay needs besides the broadcasts


def family(event_type: str) -> str:
    return event_type.split(".", 1)[0]


class Hub(StreamState):
    def __init__(self, clock, metrics, watches: WatchRegistry | None = None):
        super().__init__(clock, metrics)
        self.watches = watches if watches is not None else WatchRegistry()   # the instrumentation's
        self.viewers: dict[str, Viewer] = {}
        self.followers: dict[str, list[asyncio.Queue]] = defaultdict(list)   # request id -> SSE callers' queues
        self.recorder: Recorder | None = None
        self.loop: asyncio.AbstractEventLoop | None = None   # the server's, set as it starts
        self._inbox: list[dict] = []
        self._serialised: dict[int, tuple[float, str]] = {}   # id(event) -> (its ts, its JSON)
        self._lock = threading.Lock()
        self._scheduled = False
        self._last_ts = 0.0

    # -- from the engine thread --------------------------------------------------------
    def publish_threadsafe(self, events: list[dict]) -> None:
        """The observer's sink: hand a batch to the event loop, one wake-up per burst."""
        if self.loop is None:     # before the server runs (start-up snapshot): apply directly
            self.dispatch(events)
            return
        # a watched request's internals can be megabytes of JSON: serialise them here, on the
        # engine thread, so the event loop (and /healthz, and every viewer) never waits on it
        heavy = {id(e): (e.get("ts"), dumps(e)) for e in events if family(e["type"]) in HEAVY_FAMILIES}
        with self._lock:
            self._inbox.extend(events)
            self._serialised.update(heavy)
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batch, self._inbox, self._scheduled = self._inbox, [], False
        self.dispatch(batch)

    # -- fan-out (event loop) ----------------------------------------------------------
    def dispatch(self, events: list[dict]) -> None:
        if not events:
            return
        for e in events:
            self._stamp(e)
        texts = [self._frame_of(e) for e in events]   # str, or bytes for a binary frame
        by_family: dict[str, list[int]] = defaultdict(list)
        personal: dict[str, list[tuple[int, bool]]] = defaultdict(list)
        finished = []
        for i, e in enumerate(events):
            self.observe(e)
            if e["type"] == "request.added" and e["owner"] in self.viewers:
                self.viewers[e["owner"]].active.add(e["request_id"])
            fam = family(e["type"])
            by_family[fam].append(i)
            rid = e.get("request_id")
            if rid is None:
                continue
            if fam == "request":
                owner = self.owners.get(rid)
                if owner is not None:
                    personal[owner].append((i, True))
                for q in self.followers.get(rid, ()):
                    q.put_nowait(e)
                if e["type"] == "request.finished":
                    finished.append(rid)
            elif fam in ("attention", "sampling", "internals"):
                for vid in self.watches.viewers(rid):
                    personal[vid].append((i, False))
        if self.recorder is not None:
            for e, t in zip(events, texts):
                self.recorder.write_text(json_text(e) if isinstance(t, bytes) else t)
        shared: dict[tuple, list[Chunk]] = {}
        for v in list(self.viewers.values()):
            mine = personal.get(v.id)
            if mine or v.filtered:
                self._offer_personal(v, events, texts, by_family, mine or [])
            elif v.signature:
                if v.signature not in shared:
                    shared[v.signature] = self._shared_chunk(v.signature, events, texts, by_family)
                for chunk in shared[v.signature]:
                    self._offer(v, chunk)
        for rid in finished:
            self._forget(rid)

    def _frame_of(self, e: dict) -> str | bytes:
        """Its frame: the engine thread's JSON, unless stamping moved its `ts` since."""
        with self._lock:
            done = self._serialised.pop(id(e), None)
        return done[1] if done is not None and done[0] == e["ts"] else frame(e)

    def _shared_chunk(self, families, events, texts, by_family) -> list[Chunk]:
        """The events in order: consecutive text events in one chunk, each binary frame alone."""
        chunks, run = [], []
        for i in sorted(i for f in families for i in by_family.get(f, ())) + [None]:
            if run and (i is None or isinstance(texts[i], bytes)):
                kinds = [events[j]["type"] for j in run]
                chunks.append(Chunk(",".join(texts[j] for j in run), len(run), False,
                                    kv=kinds.count("kv"), memory=kinds.count("memory")))
                run = []
            if i is not None:
                if isinstance(texts[i], bytes):
                    chunks.append(Chunk(texts[i], 1, False))
                else:
                    run.append(i)
        return chunks

    def _offer_personal(self, v: Viewer, events, texts, by_family, mine) -> None:
        chosen: dict[int, bool] = {}
        for fam, flt in v.families.items():
            for i in by_family.get(fam, ()):
                if flt.admits(events[i]):
                    chosen[i] = False
        for i, essential in mine:
            e = events[i]
            spec = self.watches.spec(e["request_id"], v.id)
            if spec is not None and not essential:   # a watcher: its own layers, and sampling if asked
                if e["type"] == "attention" and spec.layers is not None and spec.layers.isdisjoint(e["layers"]):
                    continue
                if e["type"] == "sampling" and not spec.sampling:
                    continue
                if e["type"].startswith("internals.") and not spec.internals:
                    continue
            chosen[i] = chosen.get(i, False) or essential
        for i in sorted(chosen):
            e, text = events[i], texts[i]
            if e["type"] == "attention":
                text = self._cut_for(v, e, text)
            self._offer(v, Chunk(text, 1, chosen[i], kv=e["type"] == "kv", memory=e["type"] == "memory"))

    def _cut_for(self, v: Viewer, e: dict, text: str | bytes) -> str | bytes:
        """An attention event cut to the layers and heads this viewer asked for."""
        spec, flt = self.watches.spec(e["request_id"], v.id), v.families.get("attention")
        layers = spec.layers if spec is not None else (flt.layers if flt is not None else None)
        heads = spec.heads if spec is not None else (flt.heads if flt is not None else None)
        cut = cut_attention(e, layers, heads)
        return text if cut is e else frame(cut)

    def _offer(self, v: Viewer, chunk: Chunk) -> None:
        dropped = v.offer(chunk)
        if dropped:
            self.metrics.dropped.inc(dropped)

    def _stamp(self, event: dict) -> None:
        """Keep `ts` non-decreasing along the stream (engine events are stamped on the
        engine thread a moment before the loop sends them)."""
        self._last_ts = max(self._last_ts, event.get("ts") or self.clock())
        event["ts"] = self._last_ts

    def send(self, v: Viewer, event: dict) -> None:
        """A reply or notice for one viewer: essential."""
        self._stamp(event)
        text = dumps(event)
        if self.recorder is not None and event["type"] in RECORDED_REPLIES:
            self.recorder.write_text(text)
        self._offer(v, Chunk(text, 1, True))

    def broadcast(self, event: dict) -> None:
        """An essential event for every viewer (engine state changes)."""
        self._stamp(event)
        text = dumps(event)
        if self.recorder is not None:
            self.recorder.write_text(text)
        chunk = Chunk(text, 1, True)
        for v in list(self.viewers.values()):
            self._offer(v, chunk)

    def _forget(self, rid: str) -> None:
        owner = self.forget(rid)
        if owner in self.viewers:
            self.viewers[owner].active.discard(rid)
        self.followers.pop(rid, None)
        self.watches.forget(rid)

    # -- viewers and followers ---------------------------------------------------------
    def add(self, v: Viewer) -> None:
        self.viewers[v.id] = v
        self.metrics.viewers.set(len(self.viewers))

    def remove(self, v: Viewer) -> None:
        self.viewers.pop(v.id, None)
        self.metrics.viewers.set(len(self.viewers))

    def follow(self, rid: str) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.followers[rid].append(q)
        return q

    def unfollow(self, rid: str, q: asyncio.Queue) -> None:
        if q in self.followers.get(rid, ()):
            self.followers[rid].remove(q)

    # -- recording: every event fanned out, and the replies a replay needs ------------------
    def start_recording(self, path: Path, name: str, model: str, preamble: list[dict]) -> Recorder:
        self.recorder = Recorder(path, name, model)
        for e in preamble:
            e = dict(e)
            self._stamp(e)
            self.recorder.write_text(dumps(e))
        return self.recorder

    def stop_recording(self) -> Recorder | None:
        rec, self.recorder = self.recorder, None
        if rec is not None:
            rec.close()
        return rec
