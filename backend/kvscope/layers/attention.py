"""Paged attention: write this step's K/V at `slot_mapping`, then attend through the block tables
by the step's route (chosen once, `pick_routes`), reading the metadata set on the model's own
AttentionContext (`with step_metadata(model, md):`); below the layer, the PyTorch reference."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F
from torch import nn

from kvscope.layers import kernels

try:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
    HAS_FLASH_ATTN = True
except ImportError:
    HAS_FLASH_ATTN = False

# FlashAttention-2 reads a paged cache only in pages of a multiple of this many tokens
FLASH_PAGE_MULTIPLE = 256


class Route(Enum):
    """Which kernel takes a step's spans (prompts, chunks), and which its decode rows."""
    REFERENCE = ("sdpa", "torch, gathered in up to 4 padded groups")
    REFERENCE_COMPILED = ("none: decode only", "torch, gathered in one padded group, compiled")
    CPU_KERNELS = ("cpu_paged tile kernel, short spans with the rows", "cpu_paged row kernel")
    CPU_COMPILED = ("none: decode only", "cpu_paged row kernel, an op in the compiled graph")
    TRITON = ("sdpa", "triton")
    FLASH_PREFILL_TRITON = ("flash_attn varlen", "triton")
    FLASH_ATTN = ("flash_attn varlen", "flash_attn with_kvcache")

    def __init__(self, prefill: str, decode: str):
        self.prefill, self.decode, self.flash_prefill = prefill, decode, prefill == "flash_attn varlen"


@dataclass(frozen=True)
class Routes:
    """An engine's routes: for eager steps, and for the decode steps its graph runs (None: no graph)."""
    eager: Route
    graph: Route | None

    def describe_decode(self) -> str:
        return self.graph.decode if self.graph is not None else self.eager.decode

    def describe(self) -> str:
        return f"prefill: {self.eager.prefill}; decode: {self.describe_decode()}"


def pick_routes(backend: str, graph: str | None, dtype: torch.dtype, block_size: int) -> Routes:
    """The one place a step's route is decided; graph: "compiled", "cuda graphs" or None (eager)."""
    if backend == "cpu_paged":
        return Routes(Route.CPU_KERNELS, Route.CPU_COMPILED if graph == "compiled" else None)
    if backend == "torch":
        return Routes(Route.REFERENCE, Route.REFERENCE_COMPILED if graph == "compiled" else None)
    if backend == "flash_attn":
        route = Route.FLASH_ATTN
    else:   # triton: FlashAttention's varlen kernel takes the spans where it can read the cache
        route = Route.FLASH_PREFILL_TRITON if flash_fits(dtype, block_size) else Route.TRITON
    return Routes(route, route if graph == "cuda graphs" else None)


def flash_fits(dtype: torch.dtype, block_size: int) -> bool:
    return HAS_FLASH_ATTN and dtype in (torch.float16, torch.bfloat16) and block_size % FLASH_PAGE_MULTIPLE == 0


@dataclass
class PrefillSpan:
    """A sequence computing several tokens this step (a prompt or a chunk of one)."""
    q_start: int            # first row of this span in the step's flattened tokens
    q_len: int
    start: int              # position of the first computed token (= tokens already cached)
    context_blocks: torch.Tensor | None = None  # block ids holding positions [0, start + q_len)


@dataclass
class VarlenSpans:
    """Every span for FlashAttention's varlen kernel, read through the block tables."""
    cu_seqlens_q: torch.Tensor                  # [spans + 1] int32: where each span's rows begin
    cu_seqlens_k: torch.Tensor                  # [spans + 1] int32: running total of context lengths
    max_seqlen_q: int
    max_seqlen_k: int
    block_tables: torch.Tensor                  # [spans, width] int32


@dataclass
class TiledSpans:
    """cpu_paged's spans of at least MIN_TILED_SPAN tokens, for the tile kernel (one call per layer)."""
    block_tables: torch.Tensor                  # [spans, width] int32: blocks holding each context
    q_starts: torch.Tensor                      # [spans] int32: first row in the step's tokens
    q_lens: torch.Tensor                        # [spans] int32
    starts: torch.Tensor                        # [spans] int32: position of the first query


@dataclass
class PagedRows:
    """Rows a paged kernel reads in place, one query each with its own table and context length
    (the decode rows, and in an eager cpu_paged step each query of the short spans)."""
    rows: slice | torch.Tensor                  # into the step's flattened tokens
    block_tables: torch.Tensor                  # [rows, width] int32
    context_lens: torch.Tensor                  # [rows] int32


@dataclass
class DecodeGroup:
    """Decode rows of similar context length: the reference pads each group, not the batch, to its longest."""
    rows: slice
    block_tables: torch.Tensor                  # [rows, blocks]
    mask: torch.Tensor                          # [rows, 1, 1, blocks * block_size]


@dataclass
class AttentionMetadata:
    route: Route
    slot_mapping: torch.Tensor                  # [num_tokens]: where each new K/V is written
    num_prefill_tokens: int = 0                 # the spans' rows come first, the decode rows after
    spans: list[PrefillSpan] | VarlenSpans | TiledSpans | None = None   # as route.prefill takes them
    decode: PagedRows | list[DecodeGroup] | None = None                 # as route.decode takes them
    queries: KeptQueries | None = None          # rows whose queries the step keeps (someone watches them)


@dataclass
class KeptQueries:
    """Some rows' queries after RoPE, every layer's, copied into tensors made before the step (a
    copy_ compiled and CUDA graphs make too), for a watched request's weights (capture.py)."""
    rows: slice | torch.Tensor                  # into the step's flattened tokens
    out: list[torch.Tensor]                     # one per layer: [rows, H, D]


def query_room(layers: list[PagedAttention], rows: int, dtype: torch.dtype, device) -> list[torch.Tensor]:
    """Room for `rows` rows of each layer's queries, a tensor per layer (a compiled step writes each
    whole; into part of a shared one it would copy all of it)."""
    return [torch.empty(rows, layer.num_heads, layer.head_dim, dtype=dtype, device=device) for layer in layers]


def span_metadata(slot_mapping: torch.Tensor, span: PrefillSpan) -> AttentionMetadata:
    """One span through SDPA outside the engine's steps (the KV quantization probe, memory profile)."""
    return AttentionMetadata(Route.REFERENCE, slot_mapping, span.q_len, [span])


class AttentionContext:
    """One model's attention metadata for the forward pass being run, shared by its layers."""

    def __init__(self):
        self.metadata: AttentionMetadata | None = None


class step_metadata:
    """The model's layers read `md` inside the block (a class: dynamo traces it in a compiled step)."""

    def __init__(self, model: nn.Module, metadata: AttentionMetadata):
        self.context, self.metadata = model.attention_context, metadata

    def __enter__(self) -> AttentionMetadata:
        self.previous, self.context.metadata = self.context.metadata, self.metadata
        return self.metadata

    def __exit__(self, *exc) -> None:
        self.context.metadata = self.previous


# -- how the cache stores K and V: vLLM's kv_cache_dtype. `auto`: the model's dtype; `fp8`
# (e4m3) and `fp8_e5m2`: per-tensor scales (1.0, as vLLM without calibration); int8 with a
# float32 scale per token and KV head, so an outlier token costs precision only to itself.
_STORAGE = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
            "int8_per_token_head": torch.int8}
KV_CACHE_DTYPES = ("auto", *_STORAGE)
SCALE_DTYPE = torch.float32


@dataclass(frozen=True)
class KVCacheFormat:
    name: str                 # vLLM's kv_cache_dtype
    dtype: torch.dtype        # what one cached element is stored as
    compute_dtype: torch.dtype   # what attention reads it back as

    @property
    def quantized(self) -> bool:
        return self.name != "auto"

    @property
    def per_token_head(self) -> bool:
        return self.name == "int8_per_token_head"

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        """K and V of one token across all layers, scales included."""
        scale_bytes = SCALE_DTYPE.itemsize if self.per_token_head else 0
        return 2 * num_layers * num_kv_heads * (head_dim * self.dtype.itemsize + scale_bytes)


def kv_cache_format(name: str, model_dtype: torch.dtype) -> KVCacheFormat:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {name!r}")
    return KVCacheFormat(name, _STORAGE.get(name, model_dtype), model_dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors have few CPU kernels; their bytes copy and gather like any uint8 tensor."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


def store(cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor, x: torch.Tensor,
          fmt: KVCacheFormat, tensor_scale: float = 1.0) -> None:
    """Write K or V rows [N, KVH, D] into their slots, quantized as the format says."""
    kvh, d = x.shape[1], x.shape[2]
    if not fmt.quantized:
        cache.view(-1, kvh, d).index_copy_(0, slots, x)
        return
    if fmt.per_token_head:   # each row's largest magnitude / 127
        scale = x.abs().amax(dim=-1).float().clamp_min(1e-8) / 127.0
        scales.view(-1, kvh).index_copy_(0, slots, scale)
        x = (x.float() / scale.unsqueeze(-1)).round().clamp(-127, 127).to(torch.int8)
    else:   # saturated instead of overflowing to NaN
        limit = torch.finfo(fmt.dtype).max
        x = (x.float() / tensor_scale).clamp(-limit, limit).to(fmt.dtype)
    as_bytes(cache).view(-1, kvh, d).index_copy_(0, slots, as_bytes(x))


class QuantizedCache:
    """A quantized cache whose index_select (the reference's gather) dequantizes what it gathers."""

    def __init__(self, data: torch.Tensor, scales: torch.Tensor | None, fmt: KVCacheFormat, tensor_scale: float):
        self.data, self.scales, self.fmt, self.tensor_scale = data, scales, fmt, tensor_scale

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        q = as_bytes(self.data).index_select(dim, index).view(self.fmt.dtype).float()
        scale = self.scales.index_select(dim, index).unsqueeze(-1) if self.fmt.per_token_head else self.tensor_scale
        return (q * scale).to(self.fmt.compute_dtype)


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, layer_idx: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.layer_idx = layer_idx
        self.attention_context = AttentionContext()   # its model's, which shares one with all its layers
        # [num_blocks + 1, block_size, KVH, D], bound by the model runner (+1: a scratch block)
        self.k_cache = self.v_cache = torch.empty(0)
        # a quantized cache (kv_cache_dtype): its format, per-token-head scales, per-tensor scales
        self.kv_format = kv_cache_format("auto", torch.float32)
        self.k_scales = self.v_scales = None
        self.k_scale = self.v_scale = 1.0
        # the CPU decode kernel's watch descriptor: rows whose weights it also writes this step,
        # and the tensors it writes them into (instrumentation/weights.py watch_rows fills both)
        self.watch = torch.zeros(kernels.WATCH_FIELDS, dtype=torch.int64, device="cpu")
        self.watched: tuple[torch.Tensor, ...] = ()

    def readable_caches(self):
        if not self.kv_format.quantized:
            return self.k_cache, self.v_cache
        return (QuantizedCache(self.k_cache, self.k_scales, self.kv_format, self.k_scale),
                QuantizedCache(self.v_cache, self.v_scales, self.kv_format, self.v_scale))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [tokens, H, D]; k, v: [tokens, KVH, D] → [tokens, H * D]."""
        md = self.attention_context.metadata
        if md is None:
            raise RuntimeError("attention called outside a step: wrap the forward in step_metadata(model, md)")
        store(self.k_cache, self.k_scales, md.slot_mapping, k, self.kv_format, self.k_scale)
        store(self.v_cache, self.v_scales, md.slot_mapping, v, self.kv_format, self.v_scale)
        if md.queries is not None:
            md.queries.out[self.layer_idx].copy_(q[md.queries.rows])
        if md.route is Route.CPU_KERNELS:   # short spans' rows join the decode rows: not a prefix
            out = self._cpu_kernels(q, md)
        else:
            p = md.num_prefill_tokens
            if p == q.shape[0]:
                out = self._spans(q, k, v, md)
            elif p == 0:
                out = self._decode(q, md)
            else:
                out = torch.cat((self._spans(q[:p], k[:p], v[:p], md), self._decode(q[p:], md)))
        return out.view(q.shape[0], -1)

    def _spans(self, q, k, v, md: AttentionMetadata) -> torch.Tensor:
        if md.route.flash_prefill:
            s = md.spans   # the new K/V are already in the cache, where the block tables find them
            return flash_attn_varlen_func(q, self.k_cache, self.v_cache, s.cu_seqlens_q, s.cu_seqlens_k,
                                          s.max_seqlen_q, s.max_seqlen_k, softmax_scale=self.scale, causal=True,
                                          block_table=s.block_tables)
        k_cache, v_cache = self.readable_caches()
        return torch.cat([prefill_attention(q[span.q_start:span.q_start + span.q_len],
                                            k[span.q_start:span.q_start + span.q_len],
                                            v[span.q_start:span.q_start + span.q_len],
                                            k_cache, v_cache, span, self.scale) for span in md.spans])

    def _decode(self, q, md: AttentionMetadata) -> torch.Tensor:
        r = md.decode
        match md.route:
            case Route.TRITON | Route.FLASH_PREFILL_TRITON:
                return kernels.triton_decode_attention(q, self.k_cache, self.v_cache, r.block_tables, r.context_lens,
                                                       self.scale)
            case Route.FLASH_ATTN:
                return flash_attn_with_kvcache(q.unsqueeze(1), self.k_cache, self.v_cache, cache_seqlens=r.context_lens,
                                               block_table=r.block_tables, softmax_scale=self.scale,
                                               causal=True).squeeze(1)
            case Route.CPU_COMPILED:   # opaque to inductor, which fuses everything around it
                return torch.ops.kvscope.paged_decode_attention(q, self.k_cache, self.v_cache, r.block_tables,
                                                                r.context_lens, self.scale, self.watch)
        return decode_attention(q, *self.readable_caches(), md.decode, self.scale)

    def _cpu_kernels(self, q, md: AttentionMetadata) -> torch.Tensor:
        """Eager cpu_paged: one row-kernel call (decode rows, short spans), one tile-kernel call."""
        q = q.contiguous()
        out = torch.empty_like(q)
        if (r := md.decode) is not None:
            out[r.rows] = kernels.cpu_decode(q[r.rows], self.k_cache, self.v_cache, r.block_tables, r.context_lens,
                                             self.scale, self.watch)
        if md.spans is not None:
            kernels.cpu_prefill(q, self.k_cache, self.v_cache, md.spans, self.scale, out)
        return out


# -- the reference backend ------------------------------------------------------------
def gather_context(cache: torch.Tensor, blocks: torch.Tensor, length: int | None = None) -> torch.Tensor:
    """blocks: [..., n] ids → [..., n * block_size, KVH, D], cut to `length` tokens when given."""
    out = cache.index_select(0, blocks.reshape(-1)).view(*blocks.shape[:-1], -1, *cache.shape[2:])
    return out if length is None else out[..., :length, :, :]


def prefill_attention(q, k, v, k_cache, v_cache, span: PrefillSpan, scale: float):
    mask = None           # nothing cached: the new keys are the whole context, plainly causal
    if span.start:        # else the context, this span's keys included, is read from the cache
        ctx = span.start + span.q_len
        k, v = gather_context(k_cache, span.context_blocks, ctx), gather_context(v_cache, span.context_blocks, ctx)
        mask = torch.arange(ctx, device=q.device)[None, :] <= torch.arange(span.start, ctx, device=q.device)[:, None]
    qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))      # [1, heads, tokens, D]
    out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=scale,
                                         enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)                        # [q_len, H, D]


def decode_attention(q, k_cache, v_cache, groups: list[DecodeGroup], scale: float):
    """q: [B, H, D], one query per sequence, each attending to its own cached context."""
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    for group in groups:
        ks = gather_context(k_cache, group.block_tables).transpose(1, 2)   # [n, KVH, blocks * bs, D]
        vs = gather_context(v_cache, group.block_tables).transpose(1, 2)
        # the query heads that share a KV head act as that head's query rows, so K and V
        # are read once per KV head instead of being expanded to every query head
        qs = q[group.rows].view(-1, num_kv_heads, num_heads // num_kv_heads, head_dim)
        out[group.rows] = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=group.mask, scale=scale).reshape(-1, num_heads, head_dim)
    return out
