"""vLLM's KV-event wire format (vllm/distributed/kv_events.py): three frames a message (topic,
8-byte big-endian seq, MessagePack `[ts, events, data_parallel_rank]`), events tagged by `type`."""
from __future__ import annotations

from dataclasses import dataclass

import msgpack

END_OF_REPLAY = -1   # the replay socket's last message carries this sequence number


@dataclass(frozen=True)
class Stored:
    """Full blocks that entered the prefix cache: their hashes, the first's parent, their tokens concatenated."""
    block_hashes: tuple
    parent_block_hash: object
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None


@dataclass(frozen=True)
class Removed:
    """Blocks whose hashes left the cache (evicted so the block could hold something else)."""
    block_hashes: tuple
    medium: str | None = None


@dataclass(frozen=True)
class Cleared:
    """The whole prefix cache was reset."""


@dataclass(frozen=True)
class Batch:
    seq: int
    ts: float
    events: tuple
    data_parallel_rank: int | None


def hash_key(h) -> object:
    """A hashable key for a block hash (bytes, or an int when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."""
    return bytes(h) if isinstance(h, (bytes, bytearray, memoryview)) else h


def short_hash(h) -> str:
    """Six hex digits, as kvscope's own blocks show theirs."""
    if isinstance(h, bytes):
        return h[:3].hex()
    return f"{int(h) & 0xFFFFFF:06x}"


def decode_event(raw: dict):
    kind = raw.get("type")
    if kind == "BlockStored":
        return Stored(tuple(hash_key(h) for h in raw["block_hashes"]),
                      None if raw.get("parent_block_hash") is None else hash_key(raw["parent_block_hash"]),
                      tuple(raw["token_ids"]), int(raw["block_size"]), raw.get("medium"))
    if kind == "BlockRemoved":
        return Removed(tuple(hash_key(h) for h in raw["block_hashes"]), raw.get("medium"))
    if kind == "AllBlocksCleared":
        return Cleared()
    return None   # a kind this version does not know: skipped, as docs/events.md asks of clients


def decode_frames(frames: list[bytes]) -> Batch | None:
    """One published (or replayed) message; None for the replay's end marker."""
    if len(frames) != 3:
        raise ValueError(f"a KV-event message has 3 frames (topic, seq, payload), got {len(frames)}")
    _topic, seq_bytes, payload = frames
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    if seq == END_OF_REPLAY:
        return None
    ts, events, *rest = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    decoded = tuple(e for e in (decode_event(r) for r in events) if e is not None)
    return Batch(seq, float(ts), decoded, rest[0] if rest else None)
