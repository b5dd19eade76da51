"""The gather-free block-wise decode attention against the readable reference (random
paged caches, ragged contexts) and, inside the engine, against transformers greedy."""
from __future__ import annotations

import pytest
import torch

from hf_models import VOCAB, hf_greedy, make_checkpoint
from kvscope import LLM, SamplingParams
from kvscope.layers import blockwise_attention, torch_attention
from kvscope.layers.context import AttentionMetadata, DecodeGroup
from kvscope.paging import cdiv

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 16


def random_decode_step(block_size: int, context_lens: list[int], seed: int):
    """A shuffled paged cache and one query per sequence, with the reference's metadata
    (one padded group) and the block-wise backend's (block tables + lengths) side by side."""
    g = torch.Generator().manual_seed(seed)
    widths = [cdiv(n, block_size) for n in context_lens]
    num_blocks = sum(widths) + 3
    k_cache = torch.randn(num_blocks, block_size, KV_HEADS, HEAD_DIM, generator=g)
    v_cache = torch.randn(num_blocks, block_size, KV_HEADS, HEAD_DIM, generator=g)
    ids = torch.randperm(num_blocks, generator=g).tolist()
    width = max(widths)
    tables = []
    for w in widths:
        tables.append(ids[:w] + [0] * (width - w))
        ids = ids[w:]
    tables = torch.tensor(tables, dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    mask = (torch.arange(width * block_size)[None, :] < lens[:, None]).view(len(lens), 1, 1, -1)
    md = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), block_tables=tables,
                           context_lens=lens, max_context_len=max(context_lens),
                           decode_groups=[DecodeGroup(slice(0, len(lens)), tables, mask)])
    q = torch.randn(len(context_lens), HEADS, HEAD_DIM, generator=g)
    return q, k_cache, v_cache, md


@pytest.mark.parametrize("ascending", [True, False], ids=["sorted", "unsorted"])
@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_equals_reference_on_ragged_contexts(block_size, ascending):
    # lengths ending mid-block, on a block boundary, a single token, and much longer than the rest;
    # the engine sorts decodes by length (rows that are done get skipped), other callers may not
    context_lens = [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 2, 97, 250]
    context_lens = context_lens if ascending else context_lens[::-1]
    q, k_cache, v_cache, md = random_decode_step(block_size, context_lens, seed=block_size)
    scale = HEAD_DIM ** -0.5
    expected = torch_attention.decode_attention(q, k_cache, v_cache, md, scale)
    got = blockwise_attention.decode_attention(q, k_cache, v_cache, md, scale)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_ignores_cache_contents_past_each_context():
    q, k_cache, v_cache, md = random_decode_step(8, [5, 13, 40], seed=1)
    before = blockwise_attention.decode_attention(q, k_cache, v_cache, md, 0.25)
    # stale K/V of earlier sequences (finite, as the cache only ever holds model outputs)
    for row, n in enumerate(md.context_lens.tolist()):
        last = md.block_tables[row, (n - 1) // 8]
        k_cache[last, (n - 1) % 8 + 1:] = 1e4
        v_cache[last, (n - 1) % 8 + 1:] = -1e4
    after = blockwise_attention.decode_attention(q, k_cache, v_cache, md, 0.25)
    torch.testing.assert_close(after, before)


MAX_NEW = 16


def greedy(llm: LLM, prompts):
    return [o.token_ids for o in llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3"))


def test_engine_matches_transformers_with_prefix_hits_and_chunking(checkpoint):
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, VOCAB - 2, (40,), generator=g).tolist()
    prompts = [shared + torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in (1, 7, 30, 90)]
    reference = hf_greedy(checkpoint, prompts, MAX_NEW)
    llm = LLM(str(checkpoint), device="cpu", dtype="float32", block_size=8,
              attention_backend="blockwise", max_num_batched_tokens=32)
    assert llm.engine.runner.attention_backend == "blockwise"
    outs = greedy(llm, prompts[:1]) + greedy(llm, prompts[1:])   # the first fills the prefix cache
    assert outs == reference
    bm = llm.engine.block_manager
    assert bm.num_prefix_hits >= 3 * (40 // 8), "the shared prefix should have been reused"


def test_engine_matches_transformers_under_preemption(checkpoint):
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in (3, 20, 41, 64, 100)]
    reference = hf_greedy(checkpoint, prompts, MAX_NEW)
    # 18 blocks of 8 tokens cannot hold all five sequences at once (they need 41)
    llm = LLM(str(checkpoint), device="cpu", dtype="float32", block_size=8,
              attention_backend="blockwise", num_kv_blocks=18)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    assert [o.token_ids for o in outs] == reference
    assert sum(o.num_preemptions for o in outs) > 0
