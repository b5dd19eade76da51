"""The `tokens` event: a text as the model sees it — ids, the tokenizer's own pieces, those
pieces decoded to readable text, byte spans into the UTF-8 input, special-token flags.

Byte-level BPE (GPT-2, Qwen, Llama 3) stores each byte as a printable character (a space
becomes `Ġ`); undoing that map gives each token's exact bytes, so the spans tile the
input. Tokenizers without that map fall back to the character offsets they report."""
from __future__ import annotations

import functools
import re

BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")   # sentencepiece byte fallback


@functools.lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode map, reversed: printable character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


def piece_bytes(piece: str, token_id: int, special: bool, tokenizer) -> bytes:
    if special:
        return piece.encode("utf-8")
    table = byte_decoder()
    if piece and all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    m = BYTE_PIECE.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    if piece.startswith("▁") or "▁" in piece:   # sentencepiece word marker
        return piece.replace("▁", " ").encode("utf-8")
    return tokenizer.decode([token_id]).encode("utf-8")


def readable(raw: bytes) -> tuple[str, bool]:
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="backslashreplace"), False


def tokens_event(tokenizer, text: str, ids: list[int] | None = None, ts: float = 0.0) -> dict:
    """`ids` defaults to tokenizing `text` as the engine does (no added BOS/EOS)."""
    if ids is None:
        ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    specials = special_ids(tokenizer)
    chunks = [piece_bytes(p, i, i in specials, tokenizer) for p, i in zip(pieces, ids)]
    encoded = text.encode("utf-8")
    if b"".join(chunks) == encoded:
        spans, pos = [], 0
        for c in chunks:
            spans.append((pos, pos + len(c)))
            pos += len(c)
    else:
        spans = offset_spans(tokenizer, text, len(ids))
    tokens = []
    for token_id, piece, raw, (start, end) in zip(ids, pieces, chunks, spans):
        shown, complete = readable(raw)
        tokens.append({"id": token_id, "piece": piece, "text": shown, "start": start, "end": end,
                       "special": token_id in specials, "complete": complete})
    return {"type": "tokens", "ts": ts, "text": text, "num_bytes": len(encoded),
            "num_chars": len(text), "ids": list(ids), "tokens": tokens}


def offset_spans(tokenizer, text: str, n: int) -> list[tuple[int, int]]:
    """Byte spans from the tokenizer's character offsets (normalising tokenizers)."""
    try:
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    except Exception:
        offsets = [(0, 0)] * n
    byte_at = [0]
    for ch in text:
        byte_at.append(byte_at[-1] + len(ch.encode("utf-8")))
    spans = [(byte_at[min(a, len(text))], byte_at[min(b, len(text))]) for a, b in offsets[:n]]
    return spans + [(len(byte_at) - 1, len(byte_at) - 1)] * (n - len(spans))
