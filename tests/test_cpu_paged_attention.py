"""The CPU's gather-free paged attention kernels (layers/cpu_paged_attention.c), the row
kernel and the tile kernel, against the readable reference (random paged caches, ragged
contexts, every supported shape and dtype) and, inside the engine, against transformers
greedy."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

from hf_models import VOCAB, hf_greedy, make_checkpoint
from paged_step import attend_step
from kvscope import LLM, SamplingParams
from kvscope.instrumentation import capture
from kvscope.layers import attention, kernels
from kvscope.layers.attention import DecodeGroup, PrefillSpan, Route, TiledSpans
from kvscope.engine.block_manager import cdiv
from kvscope.instrumentation.weights import cpu_weights, watch_rows


def random_decode_step(block_size: int, context_lens: list[int], seed: int, heads=8, kv_heads=2,
                       head_dim=16, dtype=torch.float32):
    """A shuffled paged cache and one query per sequence, with the reference's rows (one
    padded group) and the kernel's (block tables + lengths) side by side."""
    g = torch.Generator().manual_seed(seed)
    widths = [cdiv(n, block_size) for n in context_lens]
    num_blocks = sum(widths) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    ids = torch.randperm(num_blocks, generator=g).tolist()
    width = max(widths)
    tables = []
    for w in widths:
        tables.append(ids[:w] + [0] * (width - w))
        ids = ids[w:]
    tables = torch.tensor(tables, dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    mask = (torch.arange(width * block_size)[None, :] < lens[:, None]).view(len(lens), 1, 1, -1)
    md = Rows(tables, lens, [DecodeGroup(slice(0, len(lens)), tables, mask)])
    q = torch.randn(len(context_lens), heads, head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, md


@dataclass
class Rows:
    """The same decode rows for the kernel (block tables, lengths) and the reference (groups)."""
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    groups: list[DecodeGroup]


def reference(q, k_cache, v_cache, md, scale):
    return attention.decode_attention(q, k_cache, v_cache, md.groups, scale)


def kernel(q, k_cache, v_cache, md, scale):
    return kernels.cpu_decode(q, k_cache, v_cache, md.block_tables, md.context_lens, scale)


@pytest.fixture(autouse=True, scope="module")
def built():
    assert kernels.cpu_unavailable(torch.float32) is None, "the kernel should build on the test machines"


# lengths ending mid-block, on a block boundary, a single token, and several chunks of 256
def ragged(block_size):
    return [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 2, 97, 250, 600]


@pytest.mark.parametrize("block_size", [1, 4, 16, 48, 256])
def test_equals_reference_on_ragged_contexts(block_size):
    lens = [n for n in ragged(block_size) if n > 0]
    q, k_cache, v_cache, md = random_decode_step(block_size, lens, seed=block_size)
    scale = 16 ** -0.5
    expected = reference(q, k_cache, v_cache, md, scale)
    torch.testing.assert_close(kernel(q, k_cache, v_cache, md, scale), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [
    (4, 4, 32), (8, 4, 64), (16, 4, 128), (16, 2, 64), (8, 1, 32),   # specialised shapes
    (6, 2, 48), (12, 1, 40), (3, 3, 8),                               # the generic loop
])
# few sequences: one task per KV head; many: each sequence's KV heads in one task
@pytest.mark.parametrize("lens", [[3, 40, 300], [3, 40, 300, 1, 17, 64, 129, 8, 33]])
def test_equals_reference_for_every_head_layout(heads, kv_heads, head_dim, lens):
    q, k_cache, v_cache, md = random_decode_step(16, lens, seed=heads * head_dim,
                                                 heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    scale = head_dim ** -0.5
    expected = reference(q, k_cache, v_cache, md, scale)
    torch.testing.assert_close(kernel(q, k_cache, v_cache, md, scale), expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_within_rounding_of_a_float32_reference():
    q, k_cache, v_cache, md = random_decode_step(16, [5, 77, 260], seed=9, head_dim=64, dtype=torch.bfloat16)
    expected = reference(q.float(), k_cache.float(), v_cache.float(), md, 0.125)
    got = kernel(q, k_cache, v_cache, md, 0.125)
    assert got.dtype == torch.bfloat16
    # the kernel accumulates in float32 and rounds once: within one bf16 step of the exact result
    torch.testing.assert_close(got.float(), expected, atol=8e-3, rtol=8e-3)


@contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_give_the_same_result(threads):
    q, k_cache, v_cache, md = random_decode_step(8, [1, 9, 33, 64, 130], seed=4)
    with torch_threads(threads):
        got = kernel(q, k_cache, v_cache, md, 0.25)
    torch.testing.assert_close(got, reference(q, k_cache, v_cache, md, 0.25),
                               atol=1e-5, rtol=1e-5)


def test_ignores_cache_contents_past_each_context():
    q, k_cache, v_cache, md = random_decode_step(8, [5, 13, 40], seed=1)
    before = kernel(q, k_cache, v_cache, md, 0.25)
    # stale K/V of earlier sequences (finite, as the cache only ever holds model outputs)
    for row, n in enumerate(md.context_lens.tolist()):
        last = md.block_tables[row, (n - 1) // 8]
        k_cache[last, (n - 1) % 8 + 1:] = 1e4
        v_cache[last, (n - 1) % 8 + 1:] = -1e4
    torch.testing.assert_close(kernel(q, k_cache, v_cache, md, 0.25), before)


# spans then decodes: a fresh prompt of a few tokens, a short span over cached context (a
# prefix hit, a chunk, a draft verification), a long prompt, a long chunk over cached
# context, three decode rows
MIXED = [(0, 5), (37, 5), (0, 150), (40, 33), (20, 1), (63, 1), (5, 1)]


@pytest.mark.parametrize("block_size", [1, 4, 16, 48])
def test_a_mixed_step_read_in_place_equals_the_gathering_reference(block_size):
    got, md = attend_step(MIXED, block_size, Route.CPU_KERNELS)
    expected, _ = attend_step(MIXED, block_size, Route.REFERENCE)
    assert md.spans.q_lens.tolist() == [150, 33] and md.spans.starts.tolist() == [0, 40]
    assert md.spans.q_starts.tolist() == [10, 160]
    assert isinstance(md.decode.rows, torch.Tensor) and len(md.decode.rows) == 5 + 5 + 3
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_short_spans_and_decodes_take_one_call_over_every_row():
    specs = [(0, 7), (37, 5), (3, 1), (70, 1)]
    got, md = attend_step(specs, 4, Route.CPU_KERNELS)
    expected, _ = attend_step(specs, 4, Route.REFERENCE)
    assert md.spans is None and md.decode.rows == slice(None)
    assert md.decode.context_lens.tolist() == [*range(1, 8), *range(38, 43), 4, 71]
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_which_spans_take_the_tile_kernel():
    assert not kernels.tiles_span(1)
    assert not kernels.tiles_span(kernels.MIN_TILED_SPAN - 1)
    assert kernels.tiles_span(kernels.MIN_TILED_SPAN)


def random_spans(specs, block_size, seed, heads=8, kv_heads=2, head_dim=16, dtype=torch.float32):
    """Spans of (start, q_len) over a shuffled paged cache, their queries packed one after
    another: the tile kernel's inputs and the reference's PrefillSpans."""
    g = torch.Generator().manual_seed(seed)
    widths = [cdiv(start + n, block_size) for start, n in specs]
    num_blocks = sum(widths) + 2
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    free = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.zeros(len(specs), max(widths), dtype=torch.int32)
    spans, row = [], 0
    for i, ((start, n), w) in enumerate(zip(specs, widths)):
        tables[i, :w] = torch.tensor(free[:w])
        free = free[w:]
        spans.append(PrefillSpan(row, n, start, tables[i, :w].long()))
        row += n
    q = torch.randn(row, heads, head_dim, generator=g).to(dtype)
    tiled = TiledSpans(tables, *(torch.tensor(c, dtype=torch.int32) for c in
                                 zip(*((s.q_start, s.q_len, s.start) for s in spans))))
    return q, k_cache, v_cache, spans, tiled


def spans_reference(q, k_cache, v_cache, spans, scale):
    out = torch.empty_like(q)
    for span in spans:
        rows = slice(span.q_start, span.q_start + span.q_len)
        k = attention.gather_context(k_cache, span.context_blocks, span.start + span.q_len)
        v = attention.gather_context(v_cache, span.context_blocks, span.start + span.q_len)
        out[rows] = attention.prefill_attention(q[rows], k[span.start:], v[span.start:], k_cache, v_cache,
                                                      span, scale)
    return out


def tile_kernel(q, k_cache, v_cache, tiled, scale):
    out = torch.full_like(q, float("nan"))   # every row of every span must be written
    kernels.cpu_prefill(q, k_cache, v_cache, tiled, scale, out)
    return out


# tiles cut short (7, 17, 33) or whole (16, 64); fresh prompts and spans over cached context,
# cached lengths ending mid-block and on a block boundary
SPANS = [(0, 7), (0, 16), (5, 17), (32, 33), (0, 150), (200, 64), (3, 1)]


@pytest.mark.parametrize("block_size", [1, 4, 16, 48])
def test_tile_kernel_equals_reference_over_cached_context(block_size):
    q, k_cache, v_cache, spans, tiled = random_spans(SPANS, block_size, seed=block_size)
    expected = spans_reference(q, k_cache, v_cache, spans, 0.25)
    torch.testing.assert_close(tile_kernel(q, k_cache, v_cache, tiled, 0.25), expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [
    (4, 4, 32), (8, 4, 64), (16, 4, 128), (16, 2, 64), (8, 1, 32),   # specialised shapes
    (6, 2, 48), (12, 1, 40), (3, 3, 8), (4, 2, 256),                  # the generic loop, padded dims
])
def test_tile_kernel_for_every_head_layout(heads, kv_heads, head_dim):
    q, k_cache, v_cache, spans, tiled = random_spans([(0, 40), (19, 21), (70, 9)], 16, seed=head_dim,
                                                     heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    scale = head_dim ** -0.5
    expected = spans_reference(q, k_cache, v_cache, spans, scale)
    torch.testing.assert_close(tile_kernel(q, k_cache, v_cache, tiled, scale), expected, atol=2e-6, rtol=1e-5)


def test_tile_kernel_in_bfloat16_within_rounding_of_a_float32_reference():
    q, k_cache, v_cache, spans, tiled = random_spans([(0, 50), (30, 20)], 16, seed=2, head_dim=64,
                                                     dtype=torch.bfloat16)
    expected = spans_reference(q.float(), k_cache.float(), v_cache.float(), spans, 0.125)
    got = tile_kernel(q, k_cache, v_cache, tiled, 0.125)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=8e-3, rtol=8e-3)


@pytest.mark.parametrize("threads", [1, 2])
def test_tile_kernel_threads_give_the_same_result(threads):
    q, k_cache, v_cache, spans, tiled = random_spans(SPANS, 8, seed=6)
    with torch_threads(threads):
        got = tile_kernel(q, k_cache, v_cache, tiled, 0.25)
    torch.testing.assert_close(got, spans_reference(q, k_cache, v_cache, spans, 0.25), atol=2e-6, rtol=1e-5)


def test_tile_kernel_sees_no_key_past_each_query():
    """Large keys and values written past each span's context, and past each query within
    it (causality), change nothing."""
    q, k_cache, v_cache, spans, tiled = random_spans([(0, 20), (9, 30)], 8, seed=8)
    before = tile_kernel(q, k_cache, v_cache, tiled, 0.25)
    for span in spans:
        end = span.start + span.q_len
        last = span.context_blocks[(end - 1) // 8]
        k_cache[last, (end - 1) % 8 + 1:] = 1e4
        v_cache[last, (end - 1) % 8 + 1:] = -1e4
    torch.testing.assert_close(tile_kernel(q, k_cache, v_cache, tiled, 0.25), before)
    # a query's output depends on keys up to its own position only: change the last key of
    # the first span and only its last row moves
    k_cache[spans[0].context_blocks[19 // 8], 19 % 8] += 5.0
    after = tile_kernel(q, k_cache, v_cache, tiled, 0.25)
    torch.testing.assert_close(after[:19], before[:19])
    assert not torch.allclose(after[19], before[19])


# -- capture's weights: the softmax a row's query gives its context ------------------------------
@pytest.mark.parametrize("heads, kv_heads, head_dim, dtype", [(8, 2, 16, torch.float32), (4, 4, 64, torch.float32),
                                                              (8, 1, 64, torch.bfloat16), (6, 2, 12, torch.float32)])
def test_weights_equal_capture_s_pytorch_path(heads, kv_heads, head_dim, dtype):
    """Ragged contexts, block tables in shuffled order, GQA, bfloat16 caches: each row's
    weights equal the PyTorch path's over its gathered keys, and are zero past its length."""
    lens = [1, 7, 16, 33, 50]
    q, k_cache, _, md = random_decode_step(4, lens, seed=11, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                           dtype=dtype)
    out = torch.full((len(lens), heads, 52), float("nan"), dtype=torch.float16)
    mean = torch.full((len(lens), 52), float("nan"), dtype=torch.float16)
    cpu_weights(q, k_cache, md.block_tables, md.context_lens, 0.3, out, mean)
    for r, n in enumerate(lens):
        keys = attention.gather_context(k_cache, md.block_tables[r].long(), n)
        want = capture.attention_weights(q[r:r + 1], keys, [n - 1], 0.3)[:, 0]   # [H, n]
        # float16 as torch rounds it (the same bits but where float32 sums differ in the last place)
        torch.testing.assert_close(out[r, :, :n], want.half(), atol=1e-3 if dtype == torch.float32 else 2e-3,
                                   rtol=0)
        torch.testing.assert_close(mean[r, :n], want.mean(0).half(), atol=1e-3, rtol=0)
        assert (out[r, :, n:] == 0).all() and (mean[r, n:] == 0).all()


def test_weights_of_a_causal_span_see_no_key_past_each_row():
    """A span is rows of one block table with lengths position + 1: the causal mask."""
    q, k_cache, _, md = random_decode_step(4, [20], seed=3)
    rows = torch.randn(6, 8, 16, generator=torch.Generator().manual_seed(5))
    positions = list(range(14, 20))
    out = torch.empty(6, 8, 20, dtype=torch.float16)
    cpu_weights(rows, k_cache, md.block_tables.expand(6, -1).contiguous(),
                        torch.tensor(positions, dtype=torch.int32) + 1, 0.25, out)
    keys = attention.gather_context(k_cache, md.block_tables[0].long(), 20)
    want = capture.attention_weights(rows, keys, positions, 0.25).half()
    torch.testing.assert_close(out.transpose(0, 1), want, atol=1e-3, rtol=0)
    assert (out.transpose(0, 1)[:, torch.arange(6)[:, None] < torch.arange(20) - 14] == 0).all()


def test_weights_in_half_precision_round_as_torch_does():
    """The kernel's own float-to-half conversion: subnormal halves (the tail of a long
    context's weights), exact halves and values between two halves (rounded to even)."""
    q, k_cache, _, md = random_decode_step(4, [40], seed=9)
    q = q * 1.5   # sharp weights: a third of them below float16's smallest normal number
    out = torch.empty(1, 8, 40, dtype=torch.float16)
    cpu_weights(q[:1], k_cache, md.block_tables[:1], md.context_lens[:1], 1.0, out)
    keys = attention.gather_context(k_cache, md.block_tables[0].long(), 40)
    want = capture.attention_weights(q[:1], keys, [39], 1.0)[:, 0]
    assert ((want > 1e-7) & (want < 6.1e-5)).sum() > 20   # the subnormal range is exercised
    # within one float16 step of the float32 weight: its relative step, or a subnormal's 2^-24
    assert ((out[0].float() - want).abs() <= want * 2**-10 + 2**-24).all()


def test_weights_refuse_lengths_past_the_output_or_the_table():
    q, k_cache, _, md = random_decode_step(4, [9, 12], seed=1)
    with pytest.raises(ValueError):
        cpu_weights(q, k_cache, md.block_tables, md.context_lens, 1.0,
                            torch.empty(2, 8, 10, dtype=torch.float16))
    with pytest.raises(ValueError):
        cpu_weights(q, k_cache, md.block_tables, torch.tensor([9, 13], dtype=torch.int32), 1.0,
                            torch.empty(2, 8, 13, dtype=torch.float16))
    with pytest.raises(ValueError):   # float32 out, or a mean that does not fit it
        cpu_weights(q, k_cache, md.block_tables, md.context_lens, 1.0, torch.empty(2, 8, 12))
    with pytest.raises(ValueError):
        cpu_weights(q, k_cache, md.block_tables, md.context_lens, 1.0,
                            torch.empty(2, 8, 12, dtype=torch.float16), torch.empty(2, 13, dtype=torch.float16))


# -- the decode kernel writing watched rows' weights as it reads their keys (watch_rows) ---------
@pytest.mark.parametrize("heads, kv_heads, head_dim, dtype, threads", [
    (8, 2, 16, torch.float32, 1), (8, 2, 16, torch.float32, 2), (4, 4, 64, torch.bfloat16, 2),
    (6, 2, 12, torch.float32, 1)])
def test_the_decode_kernel_writes_watched_rows_weights(heads, kv_heads, head_dim, dtype, threads):
    """Some rows of a decode step watched (contexts past one 256-position chunk too, one task a
    KV head with two threads): their weights and means are the PyTorch path's, zero past each
    context; the attention itself is what the unwatched kernel gives."""
    lens = [1, 7, 300, 33, 600, 50]
    q, k_cache, v_cache, md = random_decode_step(16, lens, seed=4, heads=heads, kv_heads=kv_heads,
                                                 head_dim=head_dim, dtype=dtype)
    layer = attention.PagedAttention(heads, kv_heads, head_dim, 0)
    watched = {2: 0, 0: 1, 4: 2, 5: 3}   # row -> its slot
    slots = torch.tensor([watched.get(r, -1) for r in range(len(lens))], dtype=torch.int32)
    weights = torch.full((4, heads, 610), float("nan"), dtype=torch.float16)
    means = torch.full((4, 610), float("nan"), dtype=torch.float16)
    watch_rows([layer], slots, weights[None], means[None])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = kernels.cpu_decode(q, k_cache, v_cache, md.block_tables, md.context_lens, 0.3, layer.watch)
        assert torch.equal(out, kernel(q, k_cache, v_cache, md, 0.3))
    finally:
        torch.set_num_threads(before)
    for r, w in watched.items():
        n = lens[r]
        keys = attention.gather_context(k_cache, md.block_tables[r].long(), n)
        want = capture.attention_weights(q[r:r + 1], keys, [n - 1], 0.3)[:, 0]
        torch.testing.assert_close(weights[w, :, :n], want.half(), atol=1e-3 if dtype == torch.float32 else 2e-3,
                                   rtol=0)
        torch.testing.assert_close(means[w, :n], want.mean(0).half(), atol=1e-3, rtol=0)
        assert (weights[w, :, n:] == 0).all() and (means[w, n:] == 0).all()
    watch_rows([layer], None)
    assert not layer.watch.any() and layer.watched == ()


def test_a_watch_written_for_another_step_writes_nothing_outside_what_it_names():
    """Rows past the slots it lists, contexts wider than its width and slots past its rows
    are left alone: the attention is unchanged and the weights stay as they were."""
    lens = [5, 40, 9]
    q, k_cache, v_cache, md = random_decode_step(4, lens, seed=8)
    layer = attention.PagedAttention(8, 2, 16, 0)
    weights = torch.full((2, 8, 20), float("nan"), dtype=torch.float16)
    means = torch.full((2, 20), float("nan"), dtype=torch.float16)
    # row 0 in slot 7 (past the 2 watched), row 1's 40 positions wider than 20, row 2 not listed
    watch_rows([layer], torch.tensor([7, 0], dtype=torch.int32), weights[None], means[None])
    out = kernels.cpu_decode(q, k_cache, v_cache, md.block_tables, md.context_lens, 1.0, layer.watch)
    assert torch.equal(out, kernel(q, k_cache, v_cache, md, 1.0))
    assert weights.isnan().all() and means.isnan().all()
    with pytest.raises(ValueError, match="watched rows"):
        watch_rows([layer], torch.tensor([0, 1]), weights[None], means[None])   # int64 slots
    with pytest.raises(ValueError, match="watched rows"):
        watch_rows([layer], torch.tensor([0, 1], dtype=torch.int32), weights[None].float(), means[None])


def test_other_dtypes_are_refused_with_a_reason():
    assert "float16" in kernels.cpu_unavailable(torch.float16)
    with pytest.raises(ValueError, match="cpu_paged"):
        LLM(None, device="cpu", dtype="float16", attention_backend="cpu_paged")


MAX_NEW = 16


def greedy(llm: LLM, prompts):
    return [o.outputs[0].token_ids for o in llm.generate(
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
              attention_backend="cpu_paged", max_num_batched_tokens=32)
    assert llm.engine.plan.attention_backend == "cpu_paged"
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
              attention_backend="cpu_paged", num_kv_blocks=18)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert sum(o.metrics.num_preemptions for o in outs) > 0


def clear_kernels() -> None:
    """Forget the built library and its functions: the next call builds (or fails) again."""
    kernels._library.cache_clear()
    kernels.c_function.cache_clear()
    kernels._kernel.cache_clear()


def test_a_machine_that_cannot_build_it_gets_the_reference(monkeypatch, tmp_path):
    from kvscope import native_build
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native_build.NativeBuildError, match="no-such-compiler"):
        native_build.load(kernels.SOURCE)
    clear_kernels()
    try:
        llm = LLM(None, device="cpu")
        assert llm.engine.plan.attention_backend == "torch"
        with pytest.raises(ValueError, match="cpu_paged.*no-such-compiler"):
            LLM(None, device="cpu", attention_backend="cpu_paged")
    finally:
        clear_kernels()


def test_a_source_missing_from_the_install_is_an_error_not_a_fallback(monkeypatch, tmp_path):
    """A machine without a compiler falls back to the reference; an install without the C
    source is broken, and says so (NativeBuildError, raised when the engine starts)."""
    from kvscope import native_build
    monkeypatch.setattr(kernels, "SOURCE", tmp_path / "cpu_paged_attention.c")
    clear_kernels()
    try:
        with pytest.raises(native_build.NativeBuildError, match="cpu_paged_attention.c is missing"):
            LLM(None, device="cpu")
    finally:
        clear_kernels()
    with pytest.raises(native_build.NativeBuildError, match="is missing"):
        native_build.load(tmp_path / "cpu_paged_attention.c")


def test_the_build_is_cached_per_machine(monkeypatch, tmp_path):
    from kvscope import native_build
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native_build.load(kernels.SOURCE)
    built = list((tmp_path / "kvscope" / "native").glob("cpu_paged_attention-*.so"))
    assert len(built) == 1
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))   # a cached build needs no compiler
    native_build.load(kernels.SOURCE)


def test_layouts_the_kernels_would_misread_are_refused_even_under_python_O():
    """The C kernels trust raw pointers: wrong dtypes, shapes or strides raise ValueError
    (real checks, which python -O keeps; asserts it would drop)."""
    import subprocess
    import sys
    code = """
import torch
from kvscope.layers import kernels
q, cache = torch.randn(2, 4, 16), torch.randn(6, 4, 2, 16)
tables, lens = torch.zeros(2, 3, dtype=torch.int32), torch.tensor([3, 5], dtype=torch.int32)
bad = [(q, cache, cache, tables.long(), lens), (q, cache, cache, tables, lens.long()),
       (q, cache.transpose(1, 2), cache, tables, lens), (q, cache, cache.double(), tables, lens),
       (q, cache, cache, tables[:1], lens), (torch.randn(2, 4, 8), cache, cache, tables, lens)]
for i, args in enumerate(bad):
    try:
        kernels.cpu_decode(*args, 0.25)
    except ValueError:
        continue
    raise SystemExit(f"case {i} was not refused")
kernels.cpu_decode(q, cache, cache, tables, lens, 0.25)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr[-2000:]
