"""Block arithmetic of the paged KV cache, in one place: how many blocks hold n tokens, and
which cache slot (block id * block_size + offset) a position's K/V live in."""
from __future__ import annotations

import torch


def cdiv(a: int, b: int) -> int:
    """a / b rounded up: the blocks (or ranks' rows) needed to hold a items."""
    return -(-a // b)


def slot_of(block_table: list[int], pos: int, block_size: int) -> int:
    return block_table[pos // block_size] * block_size + pos % block_size


def slot_mapping(block_table: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    """Slots of positions [start, end), as a CPU tensor (slot_of for a range)."""
    pos = torch.arange(start, end)
    return torch.tensor(block_table, dtype=torch.long)[pos // block_size] * block_size + pos % block_size
