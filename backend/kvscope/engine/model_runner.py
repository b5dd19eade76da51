"""Runs one scheduled step: flattens the batch (tokens, positions, slot mapping, block
tables, context lengths), runs the model over it, and samples the next tokens."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from kvscope.config import EngineConfig
from kvscope.engine.cuda_graphs import DecodeGraphs
from kvscope.engine.distributed import StepPlan
from kvscope.engine.sampler import Sampler, SamplingBatch, top_logprobs
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.layers.attention import HAS_FLASH_ATTN, PagedAttention
from kvscope.layers.context import AttentionMetadata, DecodeGroup, PrefillSpan, step_metadata
from kvscope.layers.triton_attention import HAS_TRITON
from kvscope.models.decoder import CausalLM


MAX_DECODE_GROUPS = 4
MIN_DECODE_GROUP = 8


@dataclass
class StepResult:
    tokens: dict[int, list[int]] = field(default_factory=dict)      # seq_id -> tokens drawn
    logprobs: dict[int, list[dict]] = field(default_factory=dict)   # seq_id -> per token {logprob, top}
    spec_logits: dict[int, torch.Tensor] = field(default_factory=dict)  # seq_id -> [k + 1, V] to verify
    spec: dict[int, object] = field(default_factory=dict)           # seq_id -> SpecVerdict
    used_cuda_graph: bool = False


def pick_attention_backend(requested: str, device: torch.device, block_size: int, head_dim: int) -> str:
    triton_fits = HAS_TRITON and _power_of_two(head_dim) and _power_of_two(block_size)
    if requested == "auto":
        if device.type != "cuda":
            return "torch"
        if HAS_FLASH_ATTN and block_size % 256 == 0:
            return "flash_attn"
        return "triton" if triton_fits else "torch"
    if requested == "triton" and not triton_fits:
        raise ValueError("attention_backend='triton' needs the triton package, and a head_dim and "
                         "block_size that are powers of two")
    if requested == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the triton backend runs on CUDA (or on CPU under TRITON_INTERPRET=1)")
    if requested == "flash_attn" and not (HAS_FLASH_ATTN and device.type == "cuda" and block_size % 256 == 0):
        raise ValueError("attention_backend='flash_attn' needs flash-attn, CUDA and a block_size multiple of 256")
    return requested


def _add_samplers(rows: list[int], seqs: list, entry: ScheduledSeq, row: int) -> None:
    """The sequence draws from this row, and so do the choices that fork from it now. With k
    drafts, the k rows before it are scored too: one per draft, this one for the bonus."""
    k = len(entry.spec_token_ids)
    rows += range(row - k, row + 1)
    seqs += [entry.seq] * (k + 1)
    for seq in entry.forks:
        rows.append(row)
        seqs.append(seq)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def batch_order(entries: list[ScheduledSeq]) -> list[ScheduledSeq]:
    """The order of a step's sequences in the flattened batch: prefills, then decodes with
    the shortest context first (so decode rows of similar length sit together). Observers
    use it to find a sequence's rows and its row of logits."""
    prefills = [e for e in entries if e.num_new_tokens > 1]
    decodes = sorted((e for e in entries if e.num_new_tokens == 1), key=lambda e: e.start)
    return prefills + decodes


class ModelRunner:
    def __init__(self, config: EngineConfig, model: CausalLM, device: torch.device,
                 dtype: torch.dtype, num_blocks: int, max_model_len: int):
        self.config, self.model, self.device, self.dtype = config, model, device, dtype
        self.block_size = config.block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.attention_backend = pick_attention_backend(config.attention_backend, device, self.block_size,
                                                        model.config.head_dim)
        self.attn_layers = [m for m in model.modules() if isinstance(m, PagedAttention)]
        self._allocate_kv_cache()
        self.sampler = Sampler(device, config.seed)
        self.graphs = None
        self.force_eager = False   # set by instrumentation while its forward hooks must see every layer
        self.workers = None        # the other tensor-parallel ranks, which replay every forward pass
        if device.type == "cuda" and not config.enforce_eager and self.attention_backend != "torch" \
                and config.tensor_parallel_size == 1:
            self.graphs = DecodeGraphs(self, max_batch=min(config.max_num_seqs, 512))

    # -- KV cache ----------------------------------------------------------------------
    def _allocate_kv_cache(self) -> None:
        layer = self.attn_layers[0]    # under tensor parallelism, this rank's KV heads only
        shape = (self.num_blocks + 1, self.block_size, layer.num_kv_heads, layer.head_dim)
        self.k_caches, self.v_caches = [], []
        for layer in self.attn_layers:
            layer.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.backend = self.attention_backend
            self.k_caches.append(layer.k_cache)
            self.v_caches.append(layer.v_cache)

    @property
    def scratch_slot(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k_caches, *self.v_caches))

    # -- inputs ------------------------------------------------------------------------
    def _blocks_for(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        """Block ids holding positions [0, num_tokens), as a device tensor."""
        n = -(-num_tokens // self.block_size)
        return torch.tensor(block_table[:n], dtype=torch.long).to(self.device)

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        bs = self.block_size
        pos = torch.arange(start, end)
        return torch.tensor(block_table, dtype=torch.long)[pos // bs] * bs + pos % bs

    def prepare(self, out: SchedulerOutput):
        ordered = batch_order(out.entries)
        prefills = [e for e in ordered if e.num_new_tokens > 1]
        decodes = ordered[len(prefills):]
        ids, positions, slots, spans, sample_rows, sample_seqs = [], [], [], [], [], []
        row = 0
        for e in prefills:
            seq, n = e.seq, e.num_new_tokens
            end = e.start + n
            ids += seq.token_ids[e.start:end - len(e.spec_token_ids)] + e.spec_token_ids
            positions += range(e.start, end)
            slots.append(self._slots(seq.block_table, e.start, end))
            blocks = self._blocks_for(seq.block_table, end) if e.start else None
            spans.append(PrefillSpan(row, n, e.start, blocks))
            row += n
            if e.samples:
                _add_samplers(sample_rows, sample_seqs, e, row - 1)
        bs = self.block_size
        decode_slots = []
        for e in decodes:
            seq, pos = e.seq, e.start
            ids.append(seq.token_ids[pos])
            positions.append(pos)
            decode_slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            _add_samplers(sample_rows, sample_seqs, e, row)
            row += 1
        slots.append(torch.tensor(decode_slots, dtype=torch.long))
        md = AttentionMetadata(slot_mapping=torch.cat(slots).to(self.device), prefills=spans,
                               num_prefill_tokens=sum(e.num_new_tokens for e in prefills))
        if decodes:
            self._decode_metadata(md, decodes)
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        return ids_t, pos_t, md, sample_rows, sample_seqs

    def _decode_metadata(self, md: AttentionMetadata, decodes: list[ScheduledSeq]) -> None:
        width = max(len(e.seq.block_table) for e in decodes)
        tables = torch.tensor([e.seq.block_table + [0] * (width - len(e.seq.block_table)) for e in decodes],
                              dtype=torch.int32)
        lens = torch.tensor([e.start + 1 for e in decodes], dtype=torch.int32)
        md.block_tables, md.context_lens = tables.to(self.device), lens.to(self.device)
        md.max_context_len = int(lens.max())
        if self.attention_backend == "torch":
            md.decode_groups = self._decode_groups(tables, lens)

    def _decode_groups(self, tables: torch.Tensor, lens: torch.Tensor) -> list[DecodeGroup]:
        """Up to four groups of equal size over rows sorted by context length: padding each
        group to its own longest context wastes far less than padding the whole batch."""
        n = len(lens)
        size = -(-n // min(MAX_DECODE_GROUPS, -(-n // MIN_DECODE_GROUP)))
        groups = []
        for start in range(0, n, size):
            rows = slice(start, min(n, start + size))
            width = -(-int(lens[rows].max()) // self.block_size)
            pos = torch.arange(width * self.block_size)
            mask = (pos[None, :] < lens[rows, None]).view(rows.stop - start, 1, 1, -1)
            groups.append(DecodeGroup(rows, tables[rows, :width].to(self.device), mask.to(self.device)))
        return groups

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: give each (src, dst) pair's dst block the K/V of src, every layer."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for cache in (*self.k_caches, *self.v_caches):
            cache[dst] = cache[src]

    # -- one step ----------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, out: SchedulerOutput, generators: dict[int, torch.Generator]) -> StepResult:
        self.copy_blocks(out.block_copies)
        ids, pos, md, sample_rows, seqs = self.prepare(out)
        if self.workers is not None:
            self.workers.send(StepPlan(ids, pos, md, sample_rows, out.block_copies))
        result = StepResult()
        if self.graphs is not None and not md.prefills and not self.force_eager and self.graphs.fits(len(ids)):
            hidden = self.graphs.run(ids, pos, md)
            result.used_cuda_graph = True
        else:
            with step_metadata(md):
                hidden = self.model(ids, pos)
        if not seqs:
            return result
        logits = self.model.compute_logits(hidden[sample_rows]).float()
        drafts = {e.seq.seq_id: len(e.spec_token_ids) for e in out.entries if e.spec_token_ids}
        plain, plain_rows, row = [], [], 0
        while row < len(seqs):     # rows of a sequence with drafts go to the verifier
            seq, k = seqs[row], drafts.get(seqs[row].seq_id, 0)
            if k:
                result.spec_logits[seq.seq_id] = logits[row:row + k + 1]
            else:
                plain.append(seq)
                plain_rows.append(row)
            row += k + 1
        if plain:
            logits = logits[plain_rows]
            batch = SamplingBatch([s.params for s in plain], [generators.get(s.seq_id) for s in plain])
            self._collect(result, plain, logits, self.sampler(logits, batch))
        return result

    def _collect(self, result, seqs, logits, tokens) -> None:
        token_list = tokens.tolist()
        result.tokens = {s.seq_id: [t] for s, t in zip(seqs, token_list)}
        n_max = max((s.params.logprobs or 0 for s in seqs), default=0)
        wants = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if wants:
            chosen, top = top_logprobs(logits[wants], tokens[wants], n_max)
            for j, i in enumerate(wants):
                n = seqs[i].params.logprobs
                result.logprobs[seqs[i].seq_id] = [{
                    "logprob": float(chosen[j]),
                    "top": list(zip(top.indices[j, :n].tolist(), top.values[j, :n].tolist())) if n else [],
                }]
