"""Block arithmetic of the paged KV cache, in one place: how many blocks hold n tokens, and
which cache slot (block id * block_size + offset) a position's K/V live in."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """a / b rounded up: the blocks (or ranks' rows) needed to hold a items."""
    return -(-a // b)


def slots(blocks, positions, block_size: int):
    """Cache slots of `positions`, given the block holding each (its block table's entry
    at position // block_size); numpy arrays or plain ints alike."""
    return blocks * block_size + positions % block_size
