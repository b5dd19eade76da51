"""One step's model inputs: the scheduled sequences flattened into one batch, with the attention
metadata its route reads and the rows sampled, from host arrays refilled in place every step."""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import torch

from kvscope.engine.block_manager import cdiv, slots
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.hardware import to_device
from kvscope.layers.attention import (AttentionMetadata, DecodeGroup, PagedRows, PrefillSpan, Route, TiledSpans,
                                      VarlenSpans)
from kvscope.layers.kernels import tiles_span

MAX_DECODE_GROUPS = 4
MIN_DECODE_GROUP = 8


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    sample_rows: list[int] = field(default_factory=list)      # rows of hidden states to score
    sample_seqs: list[Sequence] = field(default_factory=list)  # who draws from each of those rows
    block_copies: list[tuple[int, int]] = field(default_factory=list)   # copy-on-write (src, dst), before the step


class StepBuffers:
    """Host arrays that grow to the largest step seen and are reused by every later step."""

    def __init__(self, device: torch.device):
        self.device = device
        # token ids, positions and slots (3 rows); decode block tables (flattened) and context lengths
        self.arrays = {"tokens": np.arange(0), "tables": np.arange(0, dtype=np.int32),
                       "lens": np.arange(0, dtype=np.int32), "offsets": np.arange(0)}

    def room(self, name: str, n: int) -> np.ndarray:
        """The first n of a named array, regrown (at least doubled) when short, as 0, 1, 2, ..."""
        if len(array := self.arrays[name]) < n:
            array = self.arrays[name] = np.arange(max(n, 2 * len(array)), dtype=array.dtype)
        return array[:n]

    def arange(self, n: int) -> np.ndarray:   # 0, 1, 2, ..., n - 1, never written
        return self.room("offsets", n)

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        return to_device(torch.from_numpy(array), self.device)


def sampled_rows(hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The hidden states scored: every row as it is (a plain decode step), else an index of them."""
    if len(rows) == hidden.shape[0] and rows == list(range(len(rows))):
        return hidden
    return hidden[to_device(torch.tensor(rows), hidden.device)]


def batch_order(entries: list[ScheduledSeq]) -> list[ScheduledSeq]:
    """Prefills, then decodes shortest context first (observers find a sequence's rows by it)."""
    prefills = [e for e in entries if e.kind != "decode"]
    decodes = sorted((e for e in entries if e.kind == "decode"), key=attrgetter("start"))
    return prefills + decodes


COMPILED = (Route.REFERENCE_COMPILED, Route.CPU_COMPILED)


def prepare_inputs(out: SchedulerOutput, block_size: int, buffers: StepBuffers, route: Route) -> StepInputs:
    """Flatten a scheduled step with the attention metadata `route` reads. A compiled step's block
    table is at least two wide: dynamo specialises a width of 1 and would recompile mid-serving."""
    ordered = batch_order(out.entries)
    decodes = [e for e in ordered if e.kind == "decode"]
    prefills = ordered[:len(ordered) - len(decodes)]
    num_prefill_tokens = sum(e.num_new_tokens for e in prefills)
    num_tokens = num_prefill_tokens + len(decodes)
    tokens = buffers.room("tokens", 3 * num_tokens).reshape(3, num_tokens)
    md = AttentionMetadata(route, slot_mapping=None, num_prefill_tokens=num_prefill_tokens)
    inputs = StepInputs(None, None, md, block_copies=out.block_copies)
    spans, span_tables = _prepare_prefill(prefills, block_size, buffers, tokens, inputs)
    tables = lens = None
    if decodes:
        tables, lens = _prepare_decode(decodes, block_size, buffers, tokens[:, num_prefill_tokens:], inputs,
                                       num_prefill_tokens, 2 if route in COMPILED else 1)
    if decodes and route in (Route.REFERENCE, Route.REFERENCE_COMPILED):
        groups = 1 if route in COMPILED else MAX_DECODE_GROUPS   # a compiled graph keeps one shape
        md.decode = _decode_groups(tables, lens, block_size, buffers, groups)
    elif decodes:
        md.decode = PagedRows(slice(num_prefill_tokens, None), buffers.to_device(tables), buffers.to_device(lens))
    if route is Route.CPU_KERNELS:
        _plan_cpu_kernels(md, spans, span_tables, tables, lens, buffers)
    elif spans and route.flash_prefill:
        md.spans = _varlen_spans(spans, span_tables, buffers)
    elif spans:   # SDPA: a span over cached context reads it back through its blocks, a fresh one needs none
        for span, table in zip(spans, span_tables):
            if span.start:
                span.context_blocks = buffers.to_device(table)
        md.spans = spans
    inputs.input_ids, inputs.positions, md.slot_mapping = map(buffers.to_device, tokens)
    return inputs


def _prepare_prefill(prefills: list[ScheduledSeq], block_size: int, buffers: StepBuffers,
                     tokens: np.ndarray, inputs: StepInputs) -> tuple[list[PrefillSpan], list[np.ndarray]]:
    """Fills the spans' rows; returns the spans and the blocks holding each one's context."""
    ids, positions, slot_mapping = tokens
    row, spans, span_tables = 0, [], []
    for e in prefills:
        seq, n = e.seq, e.num_new_tokens
        end = e.start + n
        rows = slice(row, row + n)
        ids[rows] = seq.token_ids[e.start:end - len(e.spec_token_ids)] + e.spec_token_ids
        positions[rows] = buffers.arange(end)[e.start:]
        table = np.asarray(seq.block_table, dtype=np.int64)
        slot_mapping[rows] = slots(table[positions[rows] // block_size], positions[rows], block_size)
        span_tables.append(table[:cdiv(end, block_size)])
        spans.append(PrefillSpan(row, n, e.start))
        row += n
        if e.samples:
            _add_samplers(inputs, e, row - 1)
    return spans, span_tables


def _varlen_spans(spans: list[PrefillSpan], span_tables: list[np.ndarray], buffers: StepBuffers) -> VarlenSpans:
    q_lens = [s.q_len for s in spans]
    k_lens = [s.start + s.q_len for s in spans]
    return VarlenSpans(buffers.to_device(np.cumsum([0, *q_lens], dtype=np.int32)),
                       buffers.to_device(np.cumsum([0, *k_lens], dtype=np.int32)),
                       max(q_lens), max(k_lens), buffers.to_device(_padded_tables(span_tables)))


def _padded_tables(tables: list[np.ndarray]) -> np.ndarray:
    out = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int32)
    for row, table in enumerate(tables):
        out[row, :len(table)] = table
    return out


def _plan_cpu_kernels(md: AttentionMetadata, spans: list[PrefillSpan], span_tables: list[np.ndarray],
                      tables: np.ndarray | None, lens: np.ndarray | None, buffers: StepBuffers) -> None:
    """Long spans to the tile kernel (kernels.tiles_span); the short ones' queries join the decode
    rows (`md.decode`) in the row kernel, each a row whose context ends at its own position."""
    tiled = [tiles_span(s.q_len) for s in spans]
    if any(tiled):
        long = [(s, t) for s, t, ok in zip(spans, span_tables, tiled) if ok]
        q_starts, q_lens, starts = (torch.tensor(column, dtype=torch.int32)
                                    for column in zip(*((s.q_start, s.q_len, s.start) for s, _ in long)))
        md.spans = TiledSpans(torch.from_numpy(_padded_tables([t for _, t in long])), q_starts, q_lens, starts)
    short = [(s, t) for s, t, ok in zip(spans, span_tables, tiled) if not ok]
    if not short:
        return
    num_decodes = 0 if lens is None else len(lens)
    decode_tables, decode_lens = ([], []) if lens is None else (list(tables), [lens])
    row_tables = _padded_tables([t for s, t in short for _ in range(s.q_len)] + decode_tables)
    row_lens = np.concatenate([buffers.arange(s.start + s.q_len + 1)[s.start + 1:] for s, _ in short] + decode_lens)
    rows = slice(None) if md.spans is None else torch.from_numpy(np.concatenate(
        [buffers.arange(s.q_start + s.q_len)[s.q_start:] for s, _ in short]
        + [buffers.arange(md.num_prefill_tokens + num_decodes)[md.num_prefill_tokens:]]))
    md.decode = PagedRows(rows, torch.from_numpy(row_tables), torch.from_numpy(row_lens.astype(np.int32)))


def _prepare_decode(decodes: list[ScheduledSeq], block_size: int, buffers: StepBuffers, tokens: np.ndarray,
                    inputs: StepInputs, first_row: int, min_width: int) -> tuple[np.ndarray, np.ndarray]:
    """One row per sequence; returns the padded block tables and context lengths. Python lists,
    one numpy assignment per array: right after a graph each numpy call costs several µs."""
    ids, positions, slot_mapping = tokens
    block_tables = [e.seq.block_table for e in decodes]
    starts = [e.start for e in decodes]
    width = max(max(map(len, block_tables)), min_width)
    tables, lens = buffers.room("tables", len(decodes) * width).reshape(-1, width), buffers.room("lens", len(decodes))
    padding = [0] * width
    tables[:] = [table + padding[len(table):] for table in block_tables]
    ids[:] = [e.seq.token_ids[start] for e, start in zip(decodes, starts)]
    positions[:] = starts
    lens[:] = [start + 1 for start in starts]
    slot_mapping[:] = [slots(table[start // block_size], start, block_size)
                       for table, start in zip(block_tables, starts)]
    if any([e.forks for e in decodes]):
        for row, e in enumerate(decodes):
            _add_samplers(inputs, e, first_row + row)
    else:   # one row each, no drafts (a decode row has none), no forks: in two extends
        inputs.sample_rows += range(first_row, first_row + len(decodes))
        inputs.sample_seqs += [e.seq for e in decodes]
    return tables, lens


def _decode_groups(tables: np.ndarray, lens: np.ndarray, block_size: int, buffers: StepBuffers,
                   max_groups: int) -> list[DecodeGroup]:
    """Equal groups of rows sorted by context: each padded to its own longest, not the batch's."""
    n = len(lens)
    if max_groups == 1:   # every row, the table's full width: shapes a compiled graph keeps across steps
        return [_group(slice(None), tables.shape[1], tables, lens, block_size, buffers)]
    size = cdiv(n, min(max_groups, cdiv(n, MIN_DECODE_GROUP)))
    return [_group(rows, cdiv(int(lens[rows].max()), block_size), tables, lens, block_size, buffers)
            for rows in (slice(start, min(n, start + size)) for start in range(0, n, size))]


def _group(rows: slice, width: int, tables: np.ndarray, lens: np.ndarray, block_size: int,
           buffers: StepBuffers) -> DecodeGroup:
    mask = buffers.arange(width * block_size)[None, :] < lens[rows, None]
    return DecodeGroup(rows, buffers.to_device(np.ascontiguousarray(tables[rows, :width])),
                       buffers.to_device(mask.reshape(len(mask), 1, 1, -1)))


def _add_samplers(inputs: StepInputs, entry: ScheduledSeq, row: int) -> None:
    """The sequence and its forking choices draw from this row; k drafts add the k rows before it."""
    k = len(entry.spec_token_ids)
    inputs.sample_rows += [*range(row - k, row + 1)] + [row] * len(entry.forks)
    inputs.sample_seqs += [entry.seq] * (k + 1) + entry.forks
