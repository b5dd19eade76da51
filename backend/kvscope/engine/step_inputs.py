"""One step's model inputs: the scheduled sequences flattened into one batch (tokens,
positions, slot mapping, and for decodes block tables and context lengths), plus which
rows of logits are sampled and for whom. Prefills and decodes are prepared separately;
the decode part is built as whole-batch lists, one tensor each."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.layers.context import AttentionMetadata, DecodeGroup, PrefillSpan
from kvscope.paging import cdiv, slot_mapping, slot_of

MAX_DECODE_GROUPS = 4
MIN_DECODE_GROUP = 8


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    sample_rows: list[int] = field(default_factory=list)      # rows of hidden states to score
    sample_seqs: list[Sequence] = field(default_factory=list)  # who draws from each of those rows


@dataclass
class _Part:
    """The prefill or the decode half of a step, before the two are joined."""
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[torch.Tensor] = field(default_factory=list)


def batch_order(entries: list[ScheduledSeq]) -> list[ScheduledSeq]:
    """The order of a step's sequences in the flattened batch: prefills, then decodes with
    the shortest context first (so decode rows of similar length sit together). Observers
    use it to find a sequence's rows and its row of logits."""
    prefills = [e for e in entries if e.num_new_tokens > 1]
    decodes = sorted((e for e in entries if e.num_new_tokens == 1), key=lambda e: e.start)
    return prefills + decodes


def prepare_inputs(out: SchedulerOutput, block_size: int, device: torch.device,
                   decode_groups: bool) -> StepInputs:
    """Flatten a scheduled step. `decode_groups`: also split decodes into padded groups
    (what the torch attention backend reads)."""
    ordered = batch_order(out.entries)
    prefills = [e for e in ordered if e.num_new_tokens > 1]
    decodes = ordered[len(prefills):]
    md = AttentionMetadata(slot_mapping=None, num_prefill_tokens=sum(e.num_new_tokens for e in prefills))
    inputs = StepInputs(None, None, md)
    pre = _prepare_prefill(prefills, block_size, device, inputs)
    dec = _prepare_decode(decodes, block_size, device, inputs, len(pre.ids), decode_groups) if decodes else _Part()
    slots = pre.slots + dec.slots
    md.slot_mapping = (slots[0] if len(slots) == 1 else torch.cat(slots)).to(device)
    inputs.input_ids = torch.tensor(pre.ids + dec.ids, dtype=torch.long, device=device)
    inputs.positions = torch.tensor(pre.positions + dec.positions, dtype=torch.long, device=device)
    return inputs


def _prepare_prefill(prefills: list[ScheduledSeq], block_size: int, device: torch.device,
                     inputs: StepInputs) -> _Part:
    part, row = _Part(), 0
    for e in prefills:
        seq, n = e.seq, e.num_new_tokens
        end = e.start + n
        part.ids += seq.token_ids[e.start:end - len(e.spec_token_ids)] + e.spec_token_ids
        part.positions += range(e.start, end)
        part.slots.append(slot_mapping(seq.block_table, e.start, end, block_size))
        blocks = torch.tensor(seq.block_table[:cdiv(end, block_size)], dtype=torch.long).to(device) \
            if e.start else None
        inputs.metadata.prefills.append(PrefillSpan(row, n, e.start, blocks))
        row += n
        if e.samples:
            _add_samplers(inputs, e, row - 1)
    return part


def _prepare_decode(decodes: list[ScheduledSeq], block_size: int, device: torch.device, inputs: StepInputs,
                    first_row: int, decode_groups: bool) -> _Part:
    """One token per sequence: a row of the padded block table, and its position's slot.
    Built as whole-batch lists turned into one tensor each (no tensor per sequence)."""
    width = max(len(e.seq.block_table) for e in decodes)
    tables = [e.seq.block_table + [0] * (width - len(e.seq.block_table)) for e in decodes]
    positions = [e.start for e in decodes]
    slots = [slot_of(e.seq.block_table, e.start, block_size) for e in decodes]
    for row, e in enumerate(decodes, first_row):
        _add_samplers(inputs, e, row)
    md = inputs.metadata
    tables_t = torch.tensor(tables, dtype=torch.int32)
    lens = torch.tensor(positions, dtype=torch.int32) + 1
    md.block_tables, md.context_lens = tables_t.to(device), lens.to(device)
    md.max_context_len = positions[-1] + 1      # decodes are sorted by context length
    if decode_groups:
        md.decode_groups = _decode_groups(tables_t, lens, block_size, device)
    return _Part([e.seq.token_ids[e.start] for e in decodes], positions,
                 [torch.tensor(slots, dtype=torch.long)])


def _decode_groups(tables: torch.Tensor, lens: torch.Tensor, block_size: int,
                   device: torch.device) -> list[DecodeGroup]:
    """Up to four groups of equal size over rows sorted by context length: padding each
    group to its own longest context wastes far less than padding the whole batch."""
    n = len(lens)
    size = cdiv(n, min(MAX_DECODE_GROUPS, cdiv(n, MIN_DECODE_GROUP)))
    groups = []
    for start in range(0, n, size):
        rows = slice(start, min(n, start + size))
        width = cdiv(int(lens[rows].max()), block_size)
        pos = torch.arange(width * block_size)
        mask = (pos[None, :] < lens[rows, None]).view(rows.stop - start, 1, 1, -1)
        groups.append(DecodeGroup(rows, tables[rows, :width].to(device), mask.to(device)))
    return groups


def _add_samplers(inputs: StepInputs, entry: ScheduledSeq, row: int) -> None:
    """The sequence draws from this row, and so do the choices that fork from it now. With k
    drafts, the k rows before it are scored too: one per draft, this one for the bonus."""
    k = len(entry.spec_token_ids)
    inputs.sample_rows += range(row - k, row + 1)
    inputs.sample_seqs += [entry.seq] * (k + 1)
    for seq in entry.forks:
        inputs.sample_rows.append(row)
        inputs.sample_seqs.append(seq)
