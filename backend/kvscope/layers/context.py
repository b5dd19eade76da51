"""What the attention layers need to know about the current step, set once per forward
pass by the model runner (the layers read it instead of taking extra arguments)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillSpan:
    """A sequence computing several tokens this step (a whole prompt or a chunk of one)."""
    q_start: int            # first row of this span in the step's flattened tokens
    q_len: int
    start: int              # position of the first computed token (= tokens already cached)
    context_blocks: torch.Tensor | None = None  # block ids holding positions [0, start + q_len)


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, padded only to the longest of them (the
    reference path pads each group, not the whole batch, to the longest context)."""
    rows: slice
    block_tables: torch.Tensor                  # [rows, blocks]
    mask: torch.Tensor                          # [rows, 1, 1, blocks * block_size]


@dataclass
class InPlaceRows:
    """Rows the CPU kernel attends in one call per layer (an eager step with the cpu_paged
    backend): every decode row, and every span short enough to read its context in place,
    one row per query, each with its own block table and context length."""
    rows: slice | torch.Tensor                  # into the step's flattened tokens
    block_tables: torch.Tensor                  # [rows, width] int32
    context_lens: torch.Tensor                  # [rows] int32


@dataclass
class TiledSpans:
    """Spans the CPU tile kernel attends in one call per layer (an eager step with the
    cpu_paged backend): every span of at least MIN_TILED_SPAN tokens."""
    block_tables: torch.Tensor                  # [spans, width] int32: blocks holding each context
    q_starts: torch.Tensor                      # [spans] int32: first row in the step's tokens
    q_lens: torch.Tensor                        # [spans] int32
    starts: torch.Tensor                        # [spans] int32: position of the first query


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor                  # [num_tokens]: where each new K/V is written
    # spans for scaled_dot_product_attention (none where the CPU kernels take them all)
    prefills: list[PrefillSpan] = field(default_factory=list)
    num_prefill_tokens: int = 0
    # decode rows (one new token each) follow the prefill rows
    block_tables: torch.Tensor | None = None    # [num_decodes, max_blocks]
    context_lens: torch.Tensor | None = None    # [num_decodes]
    max_context_len: int = 0
    decode_groups: list[DecodeGroup] = field(default_factory=list)   # reference path only
    in_place: InPlaceRows | None = None         # cpu_paged, eager steps: decodes and short spans
    tiled: TiledSpans | None = None             # cpu_paged, eager steps: the other spans

    @property
    def num_decodes(self) -> int:
        return 0 if self.context_lens is None else self.context_lens.shape[0]


_current: AttentionMetadata | None = None


def get_metadata() -> AttentionMetadata:
    assert _current is not None, "attention called outside a model-runner step"
    return _current


class step_metadata:
    """`with step_metadata(md):` the attention layers read `md` (a class, not a generator
    function: entered twice per step, it is cheaper this way)."""

    def __init__(self, metadata: AttentionMetadata):
        self.metadata = metadata

    def __enter__(self) -> AttentionMetadata:
        global _current
        self.previous, _current = _current, self.metadata
        return self.metadata

    def __exit__(self, *exc) -> None:
        global _current
        _current = self.previous
