"""Drafting with a small model that shares the target's vocabulary.

The draft model has its own paged KV cache, its own block manager and its own model runner
(the same classes the target uses). Each target sequence has a mirror sequence on the draft
side. Before drafting, the mirror forgets the K/V of any earlier drafts the target rejected
(its computed count falls back to the prefix it shares with the target and the surplus
blocks are given back), catches up on the tokens it has not seen, then decodes k tokens.
The draft proposes its most likely token at each position, so its distribution q is
one-hot and the rejection sampler accepts a draft with probability p(draft)."""
from __future__ import annotations

from kvscope.engine.block_manager import BlockManager
from kvscope.engine.model_runner import ModelRunner
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.engine.spec_decode import Draft, SpeculativeConfig
from kvscope.models.loader import build_model, read_model_config, resolve_model_path
from kvscope.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


class DraftModelProposer:
    def __init__(self, config: SpeculativeConfig, engine):
        path = resolve_model_path(config.model)
        self.model_config = read_model_config(path)
        if self.model_config.vocab_size != engine.model_config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({self.model_config.vocab_size}) differs "
                             f"from the target's ({engine.model_config.vocab_size})")
        self.model = build_model(path, self.model_config, "auto", engine.dtype, engine.device,
                                 engine.max_model_len, engine.config.seed)
        num_blocks = engine.block_manager.num_blocks
        self.block_manager = BlockManager(num_blocks, engine.config.block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(engine.config, self.model, engine.device, engine.dtype, num_blocks,
                                  engine.max_model_len)
        self.mirrors: dict[int, Sequence] = {}
        self.num_steps = 0

    @property
    def kv_cache_bytes(self) -> int:
        return self.runner.kv_cache_bytes

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        mirrors = [self._sync(seq) for seq in seqs]
        drafts: dict[int, list[int]] = {m.seq_id: [] for m in mirrors}
        active = list(zip(mirrors, ks))
        while active:
            out = SchedulerOutput(step=self.num_steps)
            self.num_steps += 1
            for mirror, _ in active:
                n = mirror.num_tokens - mirror.num_computed_tokens
                if not self.block_manager.try_append(mirror, n):
                    continue      # the draft cache is full: this sequence drafts no further
                out.entries.append(ScheduledSeq.row(mirror, n))
            if out.is_empty:
                break
            result = self.runner.run(out, {})
            for entry in out.entries:
                mirror = entry.seq
                mirror.num_computed_tokens += entry.num_new_tokens
                token = result.tokens[mirror.seq_id][0]
                mirror.token_ids.append(token)
                drafts[mirror.seq_id].append(token)
            scheduled = {e.seq.seq_id for e in out.entries}
            active = [(m, k) for m, k in active if m.seq_id in scheduled and len(drafts[m.seq_id]) < k]
        return [Draft(drafts[m.seq_id]) for m in mirrors]

    def _sync(self, seq: Sequence) -> Sequence:
        """The mirror with the target's tokens, keeping K/V only for the shared prefix."""
        mirror = self.mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = self.mirrors[seq.seq_id] = Sequence(list(seq.prompt_token_ids), GREEDY)
        shared = 0
        for a, b in zip(mirror.token_ids, seq.token_ids):
            if a != b:
                break
            shared += 1
        mirror.num_computed_tokens = min(mirror.num_computed_tokens, shared, seq.num_tokens - 1)
        self.block_manager.trim(mirror)
        mirror.token_ids = list(seq.token_ids)
        return mirror

    def release(self, seq: Sequence) -> None:
        mirror = self.mirrors.pop(seq.seq_id, None)
        if mirror is not None:
            self.block_manager.free(mirror)
