"""A thread reading vLLM's KV events from ZeroMQ: the publisher's replay first, then the live stream."""
from __future__ import annotations

import logging
import threading
import time

import zmq

from kvscope.server.attach.kv_frames import Batch, decode_frames
from kvscope.server.attach.probe import KVEventSource

log = logging.getLogger("kvscope.attach")
POLL_MS = 200
REPLAY_TIMEOUT_MS = 3000
SILENT_RETRY_S = 5.0


class KVSubscriber:
    def __init__(self, source: KVEventSource, on_batch, context: zmq.Context | None = None, on_state=None):
        self.source, self.on_batch = source, on_batch
        self.on_state = on_state or (lambda state: None)
        self.state = "waiting"
        self.ctx = context or zmq.Context.instance()
        self.last_seq = -1
        self._asked = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvscope-kv-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        (sub.bind if self.source.bind else sub.connect)(self.source.endpoint)
        try:
            self._replay(0)
            while not self._stop.is_set():
                if sub.poll(POLL_MS):
                    self._set_state("live")
                    self._take(sub.recv_multipart())
                elif self.state == "silent" and time.monotonic() - self._asked >= SILENT_RETRY_S:
                    self._replay(self.last_seq + 1)
        except Exception:   # the lecture goes on without live blocks; say why in the log
            log.exception("kvscope: the KV-event subscriber stopped")
        finally:
            sub.close(linger=0)

    def _take(self, frames: list[bytes]) -> None:
        batch = decode_frames(frames)
        if batch is None or batch.seq <= self.last_seq:
            return
        if batch.seq > self.last_seq + 1 and self.source.replay_endpoint:
            self._replay(self.last_seq + 1)   # missed some: fetch them, in order
            if batch.seq <= self.last_seq:
                return
        self._deliver(batch)

    def _set_state(self, state: str) -> None:
        if self.state != state:
            self.state = state
            self.on_state(state)

    def _deliver(self, batch: Batch) -> None:
        self.last_seq = batch.seq
        self.on_batch(batch)

    def _replay(self, start: int) -> None:
        """Every buffered batch from `start` on: vLLM's ROUTER answers our DEALER, then sends an end marker."""
        if not self.source.replay_endpoint:
            return
        self._asked = time.monotonic()
        answered = False
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.source.replay_endpoint)
        try:
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            while not self._stop.is_set() and sock.poll(REPLAY_TIMEOUT_MS):
                answered = True
                self._set_state("live")
                _empty, *frames = sock.recv_multipart()
                batch = decode_frames(frames)
                if batch is None:
                    return
                if batch.seq > self.last_seq:
                    self._deliver(batch)
            if not answered and not self._stop.is_set() and self.state != "live":
                self._set_state("silent")
        finally:
            sock.close(linger=0)
