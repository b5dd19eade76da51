"""The book's figures, one ledger (issue 28): every number typed into a chapter, its quiz or
a glossary entry is live, computed or cited. tests/test_book_numbers.py checks it;
`python tests/book_ledger.py -v` prints it, chapter by chapter.

- live: drawn from the engine by a `<kv-value>` or a widget, so no digits are typed for it
  (LIVE lists the few typed figures a chapter reads off its widget);
- computed: a worked figure; WORKED recomputes it from its inputs (the embedded model's config
  read from the shipped checkpoint, Qwen3-0.6B's published config, the cited hardware specs
  held here once as named constants) and the test parses the number as written in the chapter,
  so changing either the sentence or its inputs fails;
- cited: a spec or measurement from elsewhere, with a link in the same paragraph or list item
  (a vendor's datasheet, a paper, a model's config), or kvscope's own measurements named as
  `docs/benchmarks.md`; MEASURED also checks those against that file.

figures() finds each number with a unit (sizes, rates, times, percentages, ×-ratios and
-fold, millions and billions), each count of a real model's or chip's parts (layers, heads,
SMs), each number with thousands separators, each year and each version in the chapters'
prose, tables and quizzes; code blocks and inline code are inputs, not claims. NOT_CLAIMS
lists what is genuinely not a claim, each with its reason. A figure covered once in a chapter
(the same spec quoted again three paragraphs later) counts as covered throughout it.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from kvscope.server.pages import Site

ROOT = Path(__file__).resolve().parents[1]
SITE = Site()
CHAPTERS = {c.number: c.body for c in SITE.chapter_list()}
MINI = json.loads((ROOT / "backend/kvscope/assets/kvscope-mini/config.json").read_text())
DRAFT = json.loads((ROOT / "backend/kvscope/assets/kvscope-mini-draft/config.json").read_text())

# ---------------------------------------------------------------------------------------------
# Inputs, each held once.

# Qwen3-0.6B's published config (https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json).
QWEN3_06B = dict(vocab_size=151_936, hidden_size=1_024, num_hidden_layers=28, intermediate_size=3_072,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)


@dataclass(frozen=True)
class Gpu:
    """A datasheet's figures (dense, without sparsity)."""
    hbm_bytes_per_s: float
    bf16_flops: float
    hbm_bytes: float


# NVIDIA H100 datasheet (https://www.nvidia.com/en-us/data-center/h100/): SXM 3.35 TB/s,
# 1,979 BF16 TFLOP/s with sparsity = 989 dense. The H100 PCIe product brief
# (https://www.nvidia.com/content/dam/en-zz/Solutions/gtcs22/data-center/h100/PB-11133-001_v01.pdf): 2.0 TB/s, 1,513 with sparsity = 756 dense.
H100_SXM = Gpu(hbm_bytes_per_s=3.35e12, bf16_flops=989e12, hbm_bytes=80e9)
H100_PCIE = Gpu(hbm_bytes_per_s=2.0e12, bf16_flops=756e12, hbm_bytes=80e9)
# NVIDIA H200 datasheet (https://www.nvidia.com/en-us/data-center/h200/): 141 GB at 4.8 TB/s.
H200 = Gpu(hbm_bytes_per_s=4.8e12, bf16_flops=989e12, hbm_bytes=141e9)
H100_SMS, THREADS_PER_SM, REGISTERS_PER_SM = 132, 2_048, 65_536   # H100 whitepaper, CUDA guide
H100_L1_KB, H100_SHARED_MAX_KB, H100_L2_BYTES = 256, 228, 50e6     # per SM, per SM, whole chip (whitepaper)
PCIE5_X16_BYTES_PER_S = 64e9        # each way
NVLINK4_BYTES_PER_S = 900e9         # both directions together


def params(c: dict) -> int:
    """A Qwen3 model's parameter count from its config (q/k norms, tied or untied head)."""
    h, heads, kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    attention = h * heads * d + 2 * h * kv * d + heads * d * h + 2 * d
    mlp = 3 * h * c["intermediate_size"]
    layer = attention + mlp + 2 * h
    embed = c["vocab_size"] * h
    return embed * (1 if c["tie_word_embeddings"] else 2) + c["num_hidden_layers"] * layer + h


def kv_bytes_per_token(c: dict, dtype_bytes: int) -> int:
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * dtype_bytes


Q06_PARAMS = params(QWEN3_06B)
Q06_WEIGHT_BYTES = 2 * Q06_PARAMS                       # bfloat16
Q06_KV = kv_bytes_per_token(QWEN3_06B, 2)               # bytes per token, bfloat16
MINI_PARAMS = params(MINI)
MINI_WEIGHT_BYTES = 4 * MINI_PARAMS                     # float32

# The slow-motion paces of the chapter 11 and 14 widgets, as their sources set them.
PACE_S = float(re.search(r"PACE_S = ([\d.]+)", (ROOT / "frontend/js/widgets/kv-request-timeline.js").read_text()).group(1))
BURST_PACE_S = float(re.search(r"BURST_PACE_S = ([\d.]+)", (ROOT / "frontend/js/widgets/kv-batch-timeline.js").read_text()).group(1))

RECORDINGS = (ROOT / "scripts/make_recordings.py").read_text()
CHUNK, CHUNK_BUDGET = map(int, re.search(r"prefill_chunk_size=(\d+), max_num_batched_tokens=(\d+)", RECORDINGS).groups())
PLAN_BUDGET = int(re.search(r"def step_plan\(.*?max_num_batched_tokens=(\d+)", RECORDINGS, re.S).group(1))


def step_ms(tokens: int) -> float:
    """Chapter 17's made-up cost model: a fixed 20 ms per step plus 0.1 ms per token in it."""
    return 20 + 0.1 * tokens


def decode_step_s(batch: int, context: int) -> float:
    """A Qwen3-0.6B decode step on an H100 SXM at the bandwidth limit: weights once, each sequence's cache."""
    return (Q06_WEIGHT_BYTES + batch * context * Q06_KV) / H100_SXM.hbm_bytes_per_s


# ---------------------------------------------------------------------------------------------
# Reading figures as written.

NUMBER = r"[−-]?\d[\d,]*(?:\.\d+)?"


def value(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def written_as(expected: float, text: str) -> bool:
    """`text` is `expected` rounded the way it is written: to its decimals, or for a whole
    number to its last non-zero digit ("270,000" for 270,336; "1.19" for 1.1921)."""
    written = value(text)
    exact = Decimal(repr(float(expected)))
    if "." in text:
        return float(exact.quantize(Decimal(1).scaleb(-len(text.split(".")[1])), ROUND_HALF_UP)) == written
    digits = text.replace(",", "").lstrip("−-")
    zeros = len(digits) - len(digits.rstrip("0")) if written else 0
    return float(exact.quantize(Decimal(1).scaleb(zeros), ROUND_HALF_UP)) == written


def pattern(template: str) -> re.Pattern:
    """A sentence as written, `{}` for each number it computes; spaces match line breaks."""
    parts = [re.escape(p) for p in template.split("{}")]
    parts = [re.sub(r"(?:\\ )+", r"\\s+", p) for p in parts]
    return re.compile(f"({NUMBER})".join(parts))


@dataclass
class Worked:
    chapter: int
    template: str          # the words as written in the chapter, `{}` where a computed number stands
    expected: tuple        # what each `{}` must be, recomputed here

    def matches(self) -> list[re.Match]:
        return list(pattern(self.template).finditer(CHAPTERS[self.chapter]))


def W(chapter: int, template: str, *expected: float) -> Worked:
    return Worked(chapter, template, expected)


Q = QWEN3_06B
Q_LAYER_ATTENTION = 2 * Q["hidden_size"] * Q["num_attention_heads"] * Q["head_dim"] \
    + 2 * Q["hidden_size"] * Q["num_key_value_heads"] * Q["head_dim"]
Q_LAYER_MLP = 3 * Q["hidden_size"] * Q["intermediate_size"]
Q_LAYER_NORMS = 2 * Q["hidden_size"] + 2 * Q["head_dim"]
KV_PER_TOKEN_MHA = kv_bytes_per_token({**Q, "num_key_value_heads": Q["num_attention_heads"]}, 2)


def slowest_rope_turn(theta: float, head_dim: int) -> float:
    """Positions for one full turn of the slowest of a head's head_dim / 2 rotating pairs."""
    return 2 * math.pi * theta ** ((head_dim - 2) / head_dim)


WORKED: list[Worked] = [
    W(1, "has about {} million parameters", Q06_PARAMS / 1e6),
    W(1, "probability of 0.81, the loss is −ln 0.81 ≈ {}", -math.log(0.81)),
    W(1, "−ln 0.01 ≈ {}", -math.log(0.01)),
    W(2, "The other {} rows are never used", Q["vocab_size"] - (151_643 + 26)),
    W(2, "({} = {} × 128)", Q["vocab_size"], Q["vocab_size"] / 128),
    W(3, "Qwen3-0.6B's table is {} × {}, which is {}", Q["vocab_size"], Q["hidden_size"], Q["vocab_size"] * Q["hidden_size"]),
    W(3, "about {} MB when each number is stored in 2 bytes", Q["vocab_size"] * Q["hidden_size"] * 2 / 1e6),
    W(5, "Qwen3-0.6B has {} query heads and {} key/value heads, so groups of {}", Q["num_attention_heads"],
      Q["num_key_value_heads"], Q["num_attention_heads"] / Q["num_key_value_heads"]),
    W(9, "Here is Qwen3-0.6B, with {} [[query heads|attention head]] and {} [[key/value heads|grouped-query attention]] of {} numbers",
      Q["num_attention_heads"], Q["num_key_value_heads"], Q["head_dim"]),
    W(12, "One KV head's key is {} numbers; with {} KV heads", Q["head_dim"], Q["num_key_value_heads"]),
    W(12, "Over {} layers: 28 × 2,048", Q["num_hidden_layers"]),
    W(12, "Qwen3-0.6B has {} query heads that share {} KV heads in pairs", Q["num_attention_heads"], Q["num_key_value_heads"]),
    W(19, "With two per layer over {} layers", Q["num_hidden_layers"]),
    W(19, "each token still passes through all {} layers", Q["num_hidden_layers"]),
    W(21, "Qwen3-0.6B: {} layers, [[hidden size]] {}, {} [[query]] heads, {} KV heads, head_dim {}",
      Q["num_hidden_layers"], Q["hidden_size"], Q["num_attention_heads"], Q["num_key_value_heads"], Q["head_dim"]),
    W(5, "16 × 128 = {}", Q["num_attention_heads"] * Q["head_dim"]),
    W(5, "2 × 28 × 16 × 128 × 2 bytes = {} bytes, or {} [[KiB]]", KV_PER_TOKEN_MHA, KV_PER_TOKEN_MHA / 1024),
    W(5, "A single conversation of {} tokens would take {} [[GiB|KiB]]", 32_768, KV_PER_TOKEN_MHA * 32_768 / 2**30),
    W(5, "halves the cache: {} KiB per token instead of {}, and {} GiB for that {}-token conversation instead of {}",
      Q06_KV / 1024, KV_PER_TOKEN_MHA / 1024, Q06_KV * 32_768 / 2**30, 32_768, KV_PER_TOKEN_MHA * 32_768 / 2**30),
    W(6, "the slowest pair needs about {} positions for one full turn", slowest_rope_turn(10_000, Q["head_dim"])),
    W(6, "the slowest pair needs about {} million", slowest_rope_turn(1e6, Q["head_dim"]) / 1e6),
    W(6, "position {} has no vector", 1_024 + 1),
    W(7, "Qwen3-0.6B goes from {} to {} and back", Q["hidden_size"], Q["intermediate_size"]),
    W(7, "3 × {} × {} = {} parameters per layer, against {} for the layer's four attention matrices",
      Q["hidden_size"], Q["intermediate_size"], Q_LAYER_MLP, Q_LAYER_ATTENTION),
    W(7, "The MLP is about {}% of each layer; over 28 layers, MLPs hold about {} million of the model's {} million",
      100 * Q_LAYER_MLP / (Q_LAYER_MLP + Q_LAYER_ATTENTION), Q["num_hidden_layers"] * Q_LAYER_MLP / 1e6, Q06_PARAMS / 1e6),
    W(7, "silu(−6) is about {}, so the neuron adds {} × u", -6 / (1 + math.exp(6)), -6 / (1 + math.exp(6))),
    W(7, "with about {} million against about {} million for attention", Q_LAYER_MLP / 1e6, Q_LAYER_ATTENTION / 1e6),
    W(7, "Three matrices of {} × {} outweigh", Q["hidden_size"], Q["intermediate_size"]),
    W(8, "two per layer of {} gains each, plus two of {} for the query and key norms: {} parameters per layer, out of about {} million",
      Q["hidden_size"], Q["head_dim"], Q_LAYER_NORMS, (Q_LAYER_ATTENTION + Q_LAYER_MLP + Q_LAYER_NORMS) / 1e6),
    W(9, "every position that gets scored produces {} logits, and computing them takes a multiplication by a matrix of {} × {}",
      Q["vocab_size"], Q["vocab_size"], Q["hidden_size"]),
    W(9, "For a prompt of {} tokens that skips {}", 1_000, 1_000 - 1),
    W(9, "Qwen3-0.6B ties, which saves {} [[parameters|parameter]]; untied, it would have about {} million instead of {} million",
      Q["vocab_size"] * Q["hidden_size"], (Q06_PARAMS + Q["vocab_size"] * Q["hidden_size"]) / 1e6, Q06_PARAMS / 1e6),
    W(9, "The embedding table alone is {}% of this model", 100 * Q["vocab_size"] * Q["hidden_size"] / Q06_PARAMS),
    W(9, "**float32** uses {} bytes per number, with about {} significant decimal digits", 32 / 8, 24 * math.log10(2)),
    W(9, "**[[bfloat16]]** uses {} bytes. It keeps float32's {} exponent bits", 16 / 8, 8),
    W(9, "that makes {} significant bits, about {} significant decimal digits ({} × log₁₀ 2 ≈ {})",
      7 + 1, 8 * math.log10(2), 8, 8 * math.log10(2)),
    W(9, "**float16** also uses {} bytes, with more precision but a much smaller range: nothing above {}",
      16 / 8, (2 - 2**-10) * 2**15),
    W(9, "For Qwen3-0.6B in bfloat16: {} × 2 = {} bytes, about {} GB", Q06_PARAMS, Q06_WEIGHT_BYTES, Q06_WEIGHT_BYTES / 1e9),
    W(9, "roughly {} billion for Qwen3-0.6B", 2 * Q06_PARAMS / 1e9),
    W(9, "so reading {} GB takes at least {} ms", Q06_WEIGHT_BYTES / 1e9, Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s * 1e3),
    W(9, "Qwen3-0.6B saves about {} million parameters this way", Q["vocab_size"] * Q["hidden_size"] / 1e6),
    W(9, "About {} GB. correct: true", 1.5 * 2),
    W(9, "uses 2 bytes per number, and {} billion × 2 bytes = {} billion bytes", 1.5, 1.5 * 2),
    W(9, "About {} GB. why: That would be 1 byte per parameter", 1.5 * 1),
    W(9, "About {} GB. why: That would be 4 bytes per parameter", 1.5 * 4),
    W(10, "about {} of them for Qwen3", Q["vocab_size"]),
    W(11, "With a TTFT of {} ms, an inter-token latency of {} ms and a {}-token answer, the total is {} s + {} × {} s ≈ {} s",
      150, 25, 200, 0.150, 199, 0.025, 0.150 + 199 * 0.025),
    W(11, "your request takes one step every {} s", PACE_S),
    W(11, "A decode step must read {} GB. At {} TB/s that takes {} ÷ {} s ≈ {} ms",
      Q06_WEIGHT_BYTES / 1e9, H100_SXM.hbm_bytes_per_s / 1e12, Q06_WEIGHT_BYTES / 1e9, H100_SXM.hbm_bytes_per_s / 1e9,
      Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s * 1e3),
    W(11, "Prefilling a {}-token prompt does about {} times the arithmetic of one decode step, roughly {} trillion operations",
      1_000, 1_000, 1_000 * 2 * Q06_PARAMS / 1e12),
    W(11, "The arithmetic alone takes about {} ms at full speed", 1_000 * 2 * Q06_PARAMS / H100_SXM.bf16_flops * 1e3),
    W(11, "generating {} tokens costs {} decode steps: at least {} s",
      1_000, 1_000, 1_000 * Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s),
    W(11, "A request has a TTFT of {} ms and an average inter-token latency of {} ms. About how long until all {} tokens",
      200, 40, 101),
    W(11, "{} seconds correct: true", 0.2 + 100 * 0.04),
    W(11, "arrives after {} s, and each of the remaining {} tokens adds {} s, so 0.2 + 100 × 0.04 = {} s", 0.2, 100, 0.04, 0.2 + 100 * 0.04),
    W(11, "{} seconds why: That counts 101 gaps", 0.2 + 101 * 0.04),
    W(11, "{} seconds why: That leaves out the TTFT", 100 * 0.04),
    W(11, "{} seconds why: That adds one TTFT and one gap", 0.2 + 0.04),
    W(11, "take at least about {} ms", Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s * 1e3),
    W(11, "{} GB ÷ {} TB/s ≈ {} ms", Q06_WEIGHT_BYTES / 1e9, 3.35, Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s * 1e3),
    W(12, "20 + 21 + … + 119 = {} positions", sum(range(20, 120))),
    W(14, "read {} GB of weights plus {} × {} KiB ≈ {} MB of [[KV cache]]: about {} ms per step, a [[throughput]] of about {} tokens",
      Q06_WEIGHT_BYTES / 1e9, 500, Q06_KV / 1024, 500 * Q06_KV / 1e6, decode_step_s(1, 500) * 1e3, 1 / decode_step_s(1, 500)),
    W(14, "read the same {} GB plus {} × {} MB ≈ {} GB of cache: about {} ms per step, producing {} tokens, so about {} tokens",
      Q06_WEIGHT_BYTES / 1e9, 64, 500 * Q06_KV / 1e6, 64 * 500 * Q06_KV / 1e9, decode_step_s(64, 500) * 1e3, 64,
      64 / decode_step_s(64, 500)),
    W(14, "rises about fourfold, from {} ms to {} ms", decode_step_s(1, 500) * 1e3, decode_step_s(64, 500) * 1e3),
    W(14, "the group used only 3 + 8 + 2 + 5 = {} of its {} places, {} percent", 3 + 8 + 2 + 5, 4 * 8, 100 * 18 / 32),
    W(14, "Your requests take one step every {} s", BURST_PACE_S),
    W(14, "Four prompts of 20, 50, 90 and 200 tokens make a 4 × {} rectangle: {} places, of which {} hold real tokens",
      200, 4 * 200, 20 + 50 + 90 + 200),
    W(14, "end to end, {} tokens in one long row", 20 + 50 + 90 + 200),
    W(14, "The recording was made with a budget of only {} tokens: three requests decode, so they are planned first and "
          "take 3 tokens, and a prompt of about a hundred tokens that arrives gets the {} left over",
      PLAN_BUDGET, PLAN_BUDGET - 3),
    W(17, "the prompt is cut into chunks of {} under a budget of {} tokens a step", CHUNK, CHUNK_BUDGET),
    W(16, "Request 2 reuses {} tokens and prefills {}", 2 * 4, 10 + 5 - 2 * 4),
    W(16, "a {}-token prompt sent twice with blocks of {} reuses {} tokens", 32, 16, 16),
    W(16, "counts the {} reused tokens, not {}", 16, 32 - 1),
    W(14, "The same {} tokens take 8 steps instead of 12", 3 + 8 + 2 + 5 + 4 + 3),
    W(14, "longer than the {} ms of real work in a Qwen3-0.6B step", Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s * 1e3),
    W(15, "allowing {} tokens, that is {} × {} KiB = {} MiB per request", 4_096, 4_096, Q06_KV / 1024, 4_096 * Q06_KV / 2**20),
    W(15, "fills only {} of those slots, about {} MiB. The other {} MiB, {} percent", 300 + 200, 500 * Q06_KV / 2**20,
      3_596 * Q06_KV / 2**20, 100 * 3_596 / 4_096),
    W(15, "a 16-token block is 16 × {} KiB = {} MiB; a 256-token block is {} MiB", Q06_KV / 1024, 16 * Q06_KV / 2**20,
      256 * Q06_KV / 2**20),
    W(16, "Take a {}-token system prompt and a {}-token question. Without prefix caching, every request prefills {} tokens",
      2_000, 50, 2_050),
    W(16, "roughly {} times less prefill work", 2_050 / 50),
    W(16, "the shared part is {} × {} KiB ≈ {} MiB. A hundred concurrent users without sharing would hold a hundred copies, about {} GiB",
      2_000, Q06_KV / 1024, 2_000 * Q06_KV / 2**20, 100 * 2_000 * Q06_KV / 2**30),
    W(17, "A step with only their 8 tokens takes 20 + {} = **{} ms**, so each of them gets a new token every {} ms",
      0.1 * 8, step_ms(8), step_ms(8)),
    W(17, "holds 2,000 + 8 = {} tokens and takes 20 + {} = **{} ms**. Each of the eight users waits {} ms for their next token instead of {}",
      2_008, 0.1 * 2_008, step_ms(2_008), step_ms(2_008), step_ms(8)),
    W(17, "ready after that one step: {} ms of prefill", step_ms(2_008)),
    W(17, "| 1 | 8 | 504 | 512 | {} ms |", step_ms(512)),
    W(17, "| 2 | 8 | 504 | 512 | {} ms |", step_ms(512)),
    W(17, "| 3 | 8 | 504 | 512 | {} ms |", step_ms(512)),
    W(17, "| 4 | 8 | {} | {} | {} ms |", 2_000 - 3 * 504, 8 + 2_000 - 3 * 504, step_ms(8 + 2_000 - 3 * 504)),
    W(17, "| total | | | | {} ms |", 3 * step_ms(512) + step_ms(496)),
    W(17, "never wait more than {} ms for a token, instead of {} ms. They do not get more tokens: in the same {} ms",
      step_ms(512), step_ms(2_008), 3 * step_ms(512) + step_ms(496)),
    W(17, "(one after the {} ms step, then three more {} ms apart)", step_ms(2_008), step_ms(8)),
    W(17, "is {} ms instead of {}, about {} percent later", 3 * step_ms(512) + step_ms(496), step_ms(2_008),
      100 * ((3 * step_ms(512) + step_ms(496)) / step_ms(2_008) - 1)),
    W(17, "Each step takes 8 decode and {} prompt tokens, {} ms", 256 - 8, step_ms(256)),
    W(17, "a final one of {}, which takes 20 + {} = {} ms. The worst gap for the decoders falls to {} ms",
      2_000 - 8 * 248, 0.1 * 24, step_ms(24), step_ms(256)),
    W(17, "TTFT rises to 8 × {} + {} = {} ms", step_ms(256), step_ms(24), 8 * step_ms(256) + step_ms(24)),
    W(17, "Chunk 2 covers positions 504 to {}", 2 * 504 - 1),
    W(17, "{} ms correct: true why: The step holds 1,000 + 8 = {} tokens, so it takes 20 + {} = {} ms",
      step_ms(1_008), 1_008, 0.1 * 1_008, step_ms(1_008)),
    W(17, "{} ms why: That is a decode-only step", step_ms(8)),
    W(17, "they wait for all {} tokens", 1_008),
    W(17, "{} ms why: That counts only the prompt's arithmetic", 0.1 * 1_000),
    W(17, "{} ms, but only for the newcomer", 20 + 0.1 * 1_000),
    W(17, "the TTFT rose from {} ms to {} ms with a budget of 512", step_ms(2_008), 3 * step_ms(512) + step_ms(496)),
    W(18, "kvscope-mini-draft, {} MB, two layers", 4 * params(DRAFT) / 1e6),
    W(18, "a = 0.8, k = 4: 0.8 + 0.64 + 0.512 + {} = {} accepted (r = {} percent), so {} tokens per step",
      0.8**4, sum(0.8**i for i in range(1, 5)), 100 * sum(0.8**i for i in range(1, 5)) / 4, 1 + sum(0.8**i for i in range(1, 5))),
    W(18, "a = 0.5, k = 4: 0.5 + 0.25 + 0.125 + 0.0625 = {} accepted (r = {} percent), so {} tokens per step",
      sum(0.5**i for i in range(1, 5)), 100 * sum(0.5**i for i in range(1, 5)) / 4, 1 + sum(0.5**i for i in range(1, 5))),
    W(18, "a = 0.5, k = 8: about {} accepted (r = {} percent), so {} tokens per step",
      sum(0.5**i for i in range(1, 9)), 100 * sum(0.5**i for i in range(1, 9)) / 8, 1 + sum(0.5**i for i in range(1, 9))),
    W(18, "3.36 ÷ 1.1 ≈ **{} times** faster", 3.36 / 1.1),
    W(18, "3.36 ÷ (1.1 + 4 × 0.1) = 3.36 ÷ {} ≈ **{} times**", 1.1 + 4 * 0.1, 3.36 / 1.5),
    W(18, "1.94 ÷ 1.5 ≈ **{} times**", 1.94 / 1.5),
    W(18, "With 64 [[requests|request]] each verifying {} positions, a step processes {} tokens, close to the point (about {}",
      4 + 1, 64 * (4 + 1), H100_SXM.bf16_flops / H100_SXM.hbm_bytes_per_s),
    W(18, "works out at r = {} percent, not 50", 100 * sum(0.5**i for i in range(1, 5)) / 4),
    W(19, "a 70-billion-[[parameter]] model needs {} GB", 70 * 2),
    W(19, "exactly its list once with {} GPUs, {} times with {}, {} times with {}", 2, 2 * 3 / 4, 4, 2 * 7 / 8, 8),
    W(19, "a [[forward pass]] does {} all-reduces ({} counting the embedding)", 2 * Q["num_hidden_layers"], 2 * Q["num_hidden_layers"] + 1),
    W(19, "with 32 GPUs, each holds {} of the 256 experts", 256 / 32),
    W(19, "each of the {} collectives in a step", 2 * MINI["num_hidden_layers"] + 2),
    W(19, "each GPU holds {} of the {} query heads, {} of the {} KV heads, and {} of the {} intermediate features",
      Q["num_attention_heads"] / 2, Q["num_attention_heads"], Q["num_key_value_heads"] / 2, Q["num_key_value_heads"],
      Q["intermediate_size"] / 2, Q["intermediate_size"]),
    W(19, "about half of the {} GB of weights", Q06_WEIGHT_BYTES / 1e9),
    W(19, "that is {} numbers × 2 bytes = {} KiB per token", Q["hidden_size"], Q["hidden_size"] * 2 / 1024),
    W(19, "per token: {} × {} KiB = {} KiB", 2 * Q["num_hidden_layers"], 2, 2 * Q["num_hidden_layers"] * Q["hidden_size"] * 2 / 1024),
    W(19, "8 KV heads × 128 = {}, the hidden size", 8 * 128),
    W(19, "{} × {} KiB = {} MiB", 64, 112, 64 * 2 * Q["num_hidden_layers"] * Q["hidden_size"] * 2 / 2**20),
    W(19, "So each GPU sends about {} MiB per step. Over [[NVLink]], about {} GB/s in each direction on an H100, that is about {} µs. "
          "Over [[PCIe]] Gen5 at about {} GB/s it would be about {} µs",
      7, NVLINK4_BYTES_PER_S / 2 / 1e9, 7 * 2**20 / (NVLINK4_BYTES_PER_S / 2) * 1e6, PCIE5_X16_BYTES_PER_S / 1e9,
      7 * 2**20 / PCIE5_X16_BYTES_PER_S * 1e6),
    W(19, "reads about {} GB of weights per step instead of {} GB, about {} ms instead of {} ms",
      Q06_WEIGHT_BYTES / 2 / 1e9, Q06_WEIGHT_BYTES / 1e9, Q06_WEIGHT_BYTES / 2 / H100_SXM.hbm_bytes_per_s * 1e3,
      Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s * 1e3),
    W(19, "100 × {} GB ≈ {} GB", Q06_WEIGHT_BYTES / 1e9, 100 * Q06_WEIGHT_BYTES / 1e9),
    W(19, "Each decode step sent {} KiB: exactly 8 tokens × ({} all-reduces of {} numbers + half of the {} logits) × 4 bytes",
      8 * ((2 * MINI["num_hidden_layers"] + 1) * MINI["hidden_size"] + MINI["vocab_size"] / 2) * 4 / 1024,
      2 * MINI["num_hidden_layers"] + 1, MINI["hidden_size"], MINI["vocab_size"]),
    W(19, "each token's hidden vector, {} KiB for Qwen3-0.6B", Q["hidden_size"] * 2 / 1024),
    W(19, "For a batch of {} that is {} KiB per step, about {} times less", 64, 64 * 2, 7 * 1024 / (64 * 2)),
    W(19, "{} KiB correct: true why: Each all-reduce carries {} × 2 bytes = {} KiB per token, and there are 2 per layer, so 2 × {} × {} KiB = {} KiB",
      2 * 24 * 4, 2_048, 2_048 * 2 / 1024, 24, 4, 2 * 24 * 4),
    W(19, "{} KiB why: That counts one all-reduce", 24 * 4),
    W(19, "{} KiB why: That is a single all-reduce", 2_048 * 2 / 1024),
    W(19, "{} KiB why: That assumes 4 bytes per number", 2 * 24 * 2_048 * 4 / 1024),
    W(19, "The vocabulary of about {} entries", Q["vocab_size"]),
    W(20, "streams at {} ms a token but stalls once for {} ms adds one {} ms sample", 20, 400, 400),
    W(20, "over {} tokens the same stall raises that request's TPOT by only {} ms", 200, 400 / 199),
    W(20, "reads the weights once, {} GB or about {} ms, plus each sequence's [[KV cache]], {} × {} KiB ≈ {} MB or about {} ms",
      Q06_WEIGHT_BYTES / 1e9, decode_step_s(0, 0) * 1e3, 1_000, Q06_KV / 1024, 1_000 * Q06_KV / 1e6,
      1_000 * Q06_KV / H100_SXM.hbm_bytes_per_s * 1e3),
    W(20, "**1**: {} ms per step. Throughput about {} tokens/s; each user gets a token every {} ms",
      decode_step_s(1, 1_000) * 1e3, 1 / decode_step_s(1, 1_000), decode_step_s(1, 1_000) * 1e3),
    *[W(20, f"**{b}**: {{}} ms. About {{}} tokens/s", decode_step_s(b, 1_000) * 1e3, b / decode_step_s(b, 1_000))
      for b in (8, 64, 256)],
    W(20, "Going from 64 to 256 adds only {} percent more throughput",
      100 * (256 / decode_step_s(256, 1_000)) / (64 / decode_step_s(64, 1_000)) - 100),
    W(20, "Going from 1 to 64 multiplies throughput by almost 10, while each user's gap grows {}-fold",
      decode_step_s(64, 1_000) / decode_step_s(1, 1_000)),
    W(20, "and every user's gap grows {}-fold", decode_step_s(256, 1_000) / decode_step_s(64, 1_000)),
    W(20, "a ceiling of one token per {} ms, about {} tokens/s", 1_000 * Q06_KV / H100_SXM.hbm_bytes_per_s * 1e3,
      H100_SXM.hbm_bytes_per_s / (1_000 * Q06_KV)),
    W(20, "- {} percent busy: a wait of {} service time. - {} percent busy: {}. - {} percent busy: {}. - {} percent busy: {}.",
      50, 0.5 / 0.5, 80, 0.8 / 0.2, 90, 0.9 / 0.1, 99, 99),
    W(20, "Llama 3 70B ([its config](https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json): 80 layers, 8 KV heads of 128) "
          "does about {} billion FLOPs of prefill, about {} ms of an H100's peak, and its cache is 2 × 80 layers × 8 KV heads × 128 × 2 bytes = {} KiB, "
          "which a {} GB/s link ({} Gbit/s) carries in about {} ms",
      2 * 70, 2 * 70e9 / H100_SXM.bf16_flops * 1e3, 2 * 80 * 8 * 128 * 2 / 1024, 50, 50 * 8, 2 * 80 * 8 * 128 * 2 / 50e9 * 1e3),
    W(20, "Qwen3-0.6B's {} KiB per token takes about {} ms on the same link, while its prefill arithmetic is only about {} ms per token",
      Q06_KV / 1024, Q06_KV / 50e9 * 1e3, 2 * Q06_PARAMS / H100_SXM.bf16_flops * 1e3),
    W(20, "At 256 the cache reads are about {} ms of a {} ms step", 256 * 1_000 * Q06_KV / H100_SXM.hbm_bytes_per_s * 1e3,
      decode_step_s(256, 1_000) * 1e3),
    W(20, "the wait grows from about {} service times at 70 percent busy to {} at 99 percent busy", 0.7 / 0.3, 0.99 / 0.01),
    W(21, "| bfloat16 | 2 | {} GB | no scale needed | {} ms |", Q06_WEIGHT_BYTES / 1e9, decode_step_s(0, 0) * 1e3),
    W(21, "| int8 or FP8 | 1 | {} GB | + {} % (2 ÷ 128): {} GB | {} ms |", Q06_PARAMS / 1e9, 100 * 2 / 128,
      Q06_PARAMS * (1 + 2 / 128) / 1e9, Q06_PARAMS / H100_SXM.hbm_bytes_per_s * 1e3),
    W(21, "| int4 | 0.5 | {} GB | + {} % (2 ÷ 64): {} GB | {} ms |", Q06_PARAMS / 2 / 1e9, 100 * 2 / 64,
      Q06_PARAMS / 2 * (1 + 2 / 64) / 1e9, Q06_PARAMS / 2 / H100_SXM.hbm_bytes_per_s * 1e3),
    W(21, "A group of 128 weights takes {} bytes in int8 but only {} in int4", 128, 128 / 2),
    W(21, "Qwen3-0.6B's {} KiB per token becomes {} KiB", Q06_KV / 1024, Q06_KV / 2 / 1024),
    W(21, "a weight matrix of {} × {} numbers, it adds the product of two thin matrices, say {} × 16 and 16 × {}, which is {} numbers",
      Q["hidden_size"], Q["hidden_size"], Q["hidden_size"], Q["hidden_size"], 2 * 16 * Q["hidden_size"]),
    W(21, "a {}-token prefix is about {} MB of cache, about {} ms over PCIe, against about {} ms of prefill arithmetic",
      2_000, 2_000 * Q06_KV / 1e6, 2_000 * Q06_KV / PCIE5_X16_BYTES_PER_S * 1e3, 2_000 * 2 * Q06_PARAMS / H100_SXM.bf16_flops * 1e3),
    W(21, "for a {}-token prompt that is {} million scores per head", 4_000, 4_000**2 / 1e6),
    W(21, "It falls to about {} ms, a quarter of {} ms", Q06_PARAMS / 2 / H100_SXM.hbm_bytes_per_s * 1e3, decode_step_s(0, 0) * 1e3),
    W(21, "gives {} GB ÷ {} TB/s ≈ {} ms", Q06_PARAMS / 2 / 1e9, 3.35, Q06_PARAMS / 2 / H100_SXM.hbm_bytes_per_s * 1e3),
    W(21, "It stays at {} ms", decode_step_s(0, 0) * 1e3),
    W(21, "It halves to {} ms", Q06_PARAMS / H100_SXM.hbm_bytes_per_s * 1e3),
    W(13, "each SM has {} KB of fast on-chip memory, of which up to {} KB can be used as shared memory",
      H100_L1_KB, H100_SHARED_MAX_KB),
    W(13, "**[[L2 cache]]**: {} MB, shared by all {} SMs", H100_L2_BYTES / 1e6, H100_SMS),
    W(13, "**[[HBM]]**: {} GB of HBM3 stacked beside the chip, read at about {} TB/s", H100_SXM.hbm_bytes / 1e9,
      H100_SXM.hbm_bytes_per_s / 1e12),
    W(13, "reads its {} GB at about {} TB/s and does about {} trillion arithmetic operations per second on dense bfloat16 "
          "matrices, against the SXM's {}", H100_PCIE.hbm_bytes / 1e9, H100_PCIE.hbm_bytes_per_s / 1e12,
      H100_PCIE.bf16_flops / 1e12, H100_SXM.bf16_flops / 1e12),
    W(13, "reached over [[NVLink]], about {} GB/s counting both directions", NVLINK4_BYTES_PER_S / 1e9),
    W(13, "they dwarf the {} MB L2 cache", H100_L2_BYTES / 1e6),
    W(20, "with {} GB given to the cache, that is about {} tokens, or about {} sequences of {} tokens",
      60, 60e9 / Q06_KV, 60e9 / Q06_KV / 1_000, 1_000),
    W(21, "about {} million [[parameters|parameter]], {} GB in [[bfloat16]], {} KiB of cache per token",
      Q06_PARAMS / 1e6, Q06_WEIGHT_BYTES / 1e9, Q06_KV / 1024),
    W(21, "Qwen3-0.6B's {} million parameters", Q06_PARAMS / 1e6),
    W(13, "({} × {} = {})", H100_SMS, THREADS_PER_SM, H100_SMS * THREADS_PER_SM),
    W(13, "That makes about {} threads", H100_SMS * THREADS_PER_SM),
    W(13, "{} registers of {} bytes, {} KiB per SM and about {} MiB across the chip",
      REGISTERS_PER_SM, 4, REGISTERS_PER_SM * 4 / 1024, H100_SMS * REGISTERS_PER_SM * 4 / 2**20),
    W(13, "about {} GB/s each way, some fifty times slower than HBM", PCIE5_X16_BYTES_PER_S / 1e9),
    W(13, "Qwen3-0.6B's {} GB of weights is about {} times the size of the L2 cache",
      Q06_WEIGHT_BYTES / 1e9, Q06_WEIGHT_BYTES / 50e6),
    W(13, "is {} FLOPs. An H100 can do about {} trillion FLOPs per second", 2, H100_SXM.bf16_flops / 1e12),
    W(13, "From HBM it is about {} trillion bytes per second", H100_SXM.hbm_bytes_per_s / 1e12),
    W(13, "{} ÷ {} ≈ {}. To keep its arithmetic units busy, an H100 kernel must do about {} FLOPs",
      H100_SXM.bf16_flops / 1e12, H100_SXM.hbm_bytes_per_s / 1e12, H100_SXM.bf16_flops / H100_SXM.hbm_bytes_per_s,
      H100_SXM.bf16_flops / H100_SXM.hbm_bytes_per_s),
    W(13, "Take Qwen3-0.6B, about {} million", Q06_PARAMS / 1e6),
    W(13, "so about 2 × {} million ≈ {} billion FLOPs", Q06_PARAMS / 1e6, 2 * Q06_PARAMS / 1e9),
    W(13, "each parameter is {} bytes and must be read once, so about {} GB", 2, Q06_WEIGHT_BYTES / 1e9),
    W(13, "{} billion ÷ {} billion = {}. That is nearly {} times short of the {}", 2 * Q06_PARAMS / 1e9,
      Q06_WEIGHT_BYTES / 1e9, 1, 300, H100_SXM.bf16_flops / H100_SXM.hbm_bytes_per_s),
    W(13, "{} billion ÷ {} trillion ≈ {} µs. The reading takes {} GB ÷ {} TB/s ≈ {} µs. The step is about {} ms",
      2 * Q06_PARAMS / 1e9, 989, 2 * Q06_PARAMS / H100_SXM.bf16_flops * 1e6, Q06_WEIGHT_BYTES / 1e9, 3.35,
      Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s * 1e6, Q06_WEIGHT_BYTES / H100_SXM.hbm_bytes_per_s * 1e3),
    W(13, "at a context of {} tokens the step also reads {} × {} KiB ≈ {} MB, another {} µs",
      1_000, 1_000, Q06_KV / 1024, 1_000 * Q06_KV / 1e6, 1_000 * Q06_KV / H100_SXM.hbm_bytes_per_s * 1e6),
    W(13, "used {} times, so the FLOPs rise 64-fold to about {} billion ({} µs of arithmetic)",
      64, 64 * 2 * Q06_PARAMS / 1e9, 64 * 2 * Q06_PARAMS / H100_SXM.bf16_flops * 1e6),
    W(13, "The weight part of the step now does {} FLOPs per byte", 64 * 2 * Q06_PARAMS / Q06_WEIGHT_BYTES),
    W(13, "of a {}-token prompt: {} trillion FLOPs against the same {} GB of weights, about {} FLOPs per byte",
      1_000, 1_000 * 2 * Q06_PARAMS / 1e12, Q06_WEIGHT_BYTES / 1e9, 1_000 * 2 * Q06_PARAMS / Q06_WEIGHT_BYTES),
    W(13, "roughly {} ms of arithmetic", 1_000 * 2 * Q06_PARAMS / H100_SXM.bf16_flops * 1e3),
    W(13, "the flat roof of {} TFLOP/s at {} FLOPs per byte", 989, H100_SXM.bf16_flops / H100_SXM.hbm_bytes_per_s),
    W(13, "at {} FLOP per byte: at best {} TFLOP/s", 1, H100_SXM.hbm_bytes_per_s / 1e12),
    W(13, "at about {} FLOPs per byte for the weights: at best about {} TFLOP/s", 64, 64 * H100_SXM.hbm_bytes_per_s / 1e12),
    W(13, "Prefill of {} tokens, at about {} FLOPs per byte", 1_000, 1_000),
    W(13, "({} numbers, {} bytes)", Q["head_dim"], 2 * Q["head_dim"]),
    W(13, "{} × {} multiply-adds, or {} FLOPs: about {} FLOPs per byte", 2, Q["head_dim"],
      2 * 2 * Q["head_dim"], 2 * 2 * Q["head_dim"] / (2 * Q["head_dim"])),
    W(13, "({} ms for the same read)", Q06_WEIGHT_BYTES / H200.hbm_bytes_per_s * 1e3),
    W(13, "kvscope-mini's weights are about {} MB ({} million parameters in float32)", MINI_WEIGHT_BYTES / 1e6, MINI_PARAMS / 1e6),
    W(13, "so streaming {} MB takes about {} ms", MINI_WEIGHT_BYTES / 1e6, MINI_WEIGHT_BYTES / 30.5e9 * 1e3),
    W(13, "so the same {} MB takes {} to {} ms", MINI_WEIGHT_BYTES / 1e6, MINI_WEIGHT_BYTES / 12.5e9 * 1e3, MINI_WEIGHT_BYTES / 10.6e9 * 1e3),
    W(13, "if {} GB goes to the cache, that is about {} tokens, roughly {} conversations of {} tokens",
      70, 70e9 / Q06_KV, 70e9 / Q06_KV / 1_000, 1_000),
    W(13, "Sending {} GB over PCIe at about {} GB/s for every token would take around {} ms",
      Q06_WEIGHT_BYTES / 1e9, 64, Q06_WEIGHT_BYTES / PCIE5_X16_BYTES_PER_S * 1e3),
    W(13, "At {} FLOPs per byte the best it can do is {} × {} ≈ {} TFLOP/s", 40, 40, 3.35, 40 * H100_SXM.hbm_bytes_per_s / 1e12),
    W(13, "each cached key serves {} query heads, about {} FLOPs per byte",
      Q["num_attention_heads"] / Q["num_key_value_heads"], Q["num_attention_heads"] / Q["num_key_value_heads"]),
    W(12, "{} positions. That is {} times less work", 20 + 99, sum(range(20, 120)) / 119),
    W(12, "8 × 128 = {} numbers for the keys and {} more for the values, so {} numbers per layer",
      8 * 128, 8 * 128, 2 * 8 * 128),
    W(12, "28 × {} = {} numbers", 2 * 8 * 128, 28 * 2 * 8 * 128),
    W(12, "At 2 bytes each: {} bytes, which is exactly {} [[KiB]] (1 KiB is 1,024 bytes)", Q06_KV, Q06_KV / 1024),
    W(12, "the figure would double to {} KiB per token", KV_PER_TOKEN_MHA / 1024),
    W(12, "A {}-token conversation: about {} MiB", 1_000, 1_000 * Q06_KV / 2**20),
    W(12, "A {}-token conversation: {} MiB", 4_096, 4_096 * Q06_KV / 2**20),
    W(12, "One {}-token document: {} GiB, about three times the size of the model's {} GB",
      32_768, 32_768 * Q06_KV / 2**30, Q06_WEIGHT_BYTES / 1e9),
    W(12, "64 users, each {} tokens in: {} GiB", 4_096, 64 * 4_096 * Q06_KV / 2**30),
    W(12, "conversation {} tokens long, that is {} MiB of cache", 4_096, 4_096 * Q06_KV / 2**20),
    W(12, "about (32,768 + 5 × 1,024) ÷ (6 × 32,768) ≈ {} percent", 100 * (32_768 + 5 * 1_024) / (6 * 32_768)),
    W(12, "61 × 576 × 2 = {} bytes, about {} KiB per token", 61 * (512 + 64) * 2, 61 * (512 + 64) * 2 / 1024),
    W(12, "Qwen3-0.6B's {} KiB per token becomes about {} KiB", Q06_KV / 1024, Q06_KV / 2 / 1024),
    W(12, "`int8_per_token_head` about {} times", 4 * MINI["head_dim"] / (MINI["head_dim"] + 4)),
    W(12, "{} KiB correct: true why: 2 × 32 × 8 × 128 × 2 bytes = {} bytes = {} KiB",
      2 * 32 * 8 * 128 * 2 / 1024, 2 * 32 * 8 * 128 * 2, 2 * 32 * 8 * 128 * 2 / 1024),
    W(12, "{} KiB why: That leaves out the factor of 2", 32 * 8 * 128 * 2 / 1024),
    W(12, "{} KiB why: That uses the 32 query heads", 2 * 32 * 32 * 128 * 2 / 1024),
    W(12, "{} KiB why: That assumes 4 bytes per number", 2 * 32 * 8 * 128 * 4 / 1024),
    W(12, "About {} GiB correct: true why: 10 × {} × {} KiB = {} KiB, which is {} MiB or about {} GiB",
      10 * 2_048 * 112 / 2**20, 2_048, 112, 10 * 2_048 * 112, 10 * 2_048 * 112 / 1024, 10 * 2_048 * 112 / 2**20),
    W(12, "About {} MiB why: That is the cache for a single {}-token conversation", 2_048 * 112 / 1024, 2_048),
    W(12, "About {} GB why: That is the size of the model", Q06_WEIGHT_BYTES / 1e9),
    W(12, "About {} GiB why: That is ten times the right", 100 * 2_048 * 112 / 2**20),
    W(12, "({} tokens, then × 10 again); {} × 112 KiB is about {} GiB", 10 * 2_048, 10 * 2_048, 10 * 2_048 * 112 / 2**20),
    W(10, "\" mat\" comes up about {} times in 100, and \" moon\" about {} times",
      100 * math.exp(2) / sum(map(math.exp, (2, 1, 0.5, -1))), 100 * math.exp(-1) / sum(map(math.exp, (2, 1, 0.5, -1)))),
]


BENCHMARKS = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")


@dataclass
class Measured:
    """A figure quoted from kvscope's own measurements: the chapter's words with `{}` where the
    figure stands, and where docs/benchmarks.md holds it (a pattern, one group per figure)."""
    chapter: int
    template: str
    source: str
    order: tuple = ()      # the source's groups in the sentence's order, when they differ

    def matches(self) -> list[re.Match]:
        return list(pattern(self.template).finditer(CHAPTERS[self.chapter]))


EMBEDDED_DECODE_MS = (r"\| embedded \(3.5M\) \| compiled \| 2 \| ([\d.]+)–[\d.]+ ms[\s\S]*?"
                      r"\| embedded \(3.5M\) \| eager \| 2 \| ([\d.]+)–[\d.]+ ms")
MEASURED = [
    Measured(15, "64 decoding sequences {} times faster on one thread and {} times on two",
             r"\| 64 \| 1 \| [\d,]+ µs \| [\d,]+ µs \| ([\d.]+)×[\s\S]*?\| 64 \| 2 \| [\d,]+ µs \| [\d,]+ µs \| ([\d.]+)×"),
    Measured(15, "({} % of a step's time against {} % in one profile",
             r"the gather \(`index_select`\) (\d+) %, SDPA (\d+) %"),
    Measured(18, "prompt lookup accepted {} percent of its drafts, {} tokens per target pass, {} times faster; "
                 "the draft model accepted {} percent, {} tokens per pass",
             r"\| n-gram \(prompt_lookup_max 3\) \| story told twice \| ([\d.]+) % \| ([\d.]+) \| ([\d.]+)x \|\n"
             r"[^\n]*\n\| kvscope-mini-draft \(2.6 MB\) \| story told twice \| ([\d.]+) % \| ([\d.]+) \|"),
    Measured(18, "({} percent accepted, {} tokens per pass)", r"\| n-gram \| free-form \| ([\d.]+) % \| ([\d.]+) \|"),
    Measured(19, "a prefill step of 8 × 64 tokens took {} ms with two processes against {} ms with one, "
                 "but a decode step took {} ms against {} ms",
             r"\| 1 \| ([\d.]+) ms \| ([\d.]+) ms \| 0 \|\n\| 2 \| ([\d.]+) ms \| ([\d.]+) ms \|", (2, 0, 3, 1)),
    Measured(13, "On the first, main memory delivered {} to {} GB/s", r"memory read (\d+)–(\d+) GB/s"),
    Measured(13, "On the second, memory delivered {} to {} GB/s", r"memory read ([\d.]+)–([\d.]+) GB/s, matmul"),
    Measured(13, "a decode step on two threads took about {} ms with kvscope's compiled decode and about {} ms without it",
             EMBEDDED_DECODE_MS),
    Measured(13, "and the compiled step took {} to {} ms",
             r"compiled\): ([\d.]+) ms against [\d.]+ ms\s+\(2.02×\) on 1 thread and ([\d.]+) ms", (1, 0)),
    Measured(20, "from about {} ms to about {} ms per token for one request on two threads", EMBEDDED_DECODE_MS, (1, 0)),
    Measured(20, "today about {} seconds on that machine once",
             r"start-up compile [\d–]+ → (\d+) s"),
]
# ---------------------------------------------------------------------------------------------
# Finding every figure.

UNIT = (r"(?:\s?%|\s(?:percent|per\s+cent)\b|\s?(?:KiB|MiB|GiB|TiB|KB|MB|GB|TB|kB|B)(?:/s)?(?![\w/])|\s(?:bytes?)\b"
        r"|\s?[GTPM]?FLOP(?:/s|s)?(?!\w)|\s?tok/s|\s?(?:ms|µs|ns|s)(?![\w/])"
        r"|\s(?:seconds?|milliseconds?|microseconds?|minutes?|hours?|days?|weeks?|years?)\b"
        r"|\s?×(?!\s?\d)|x(?!\w)|\s(?:times|thousand|million|billion|trillion)\b|[MBkK](?![\w/-])|-fold\b|\s(?:bits?|digits?|GHz)\b)")
RANGE = rf"{NUMBER}(?:\s?(?:–|-|to|or|and|/)\s?{NUMBER})*"
# Counts of the parts of real models and chips: "28 layers", "8 KV heads", "132 SMs".
COUNT = r"\d+(?= (?:\[\[)?(?:layers?|(?:query |KV |key/value |attention )?heads|SMs?|experts?|GPUs|threads|registers)\b)"
FIGURE = re.compile(rf"(?<![\w.,/#-])(?:{RANGE}{UNIT}|\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|(?:19|20)\d\d(?!\d)|\d+\.\d+\.\d+|{COUNT})(?![\w])")
# A link, or kvscope's own measurements named by their file (the site serves no docs/ pages).
LINK = re.compile(r"\]\((?:https?://[^)\s]+|[^)\s]*docs/benchmarks\.md[^)\s]*)\)|`docs/benchmarks\.md`")


def masked(body: str) -> str:
    """The chapter with code, inline code, live values, figures and HTML tags blanked (offsets kept)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    body = re.sub(r"^```(?!quiz)\w*\n.*?^```", blank, body, flags=re.S | re.M)
    body = re.sub(r"`[^`\n]+`", blank, body)
    body = re.sub(r"<[^>\n]+>", blank, body)
    return re.sub(r"!\[[^\]]*\]\([^)]*\)", blank, body)


def blocks(body: str) -> list[tuple[int, int]]:
    """Paragraphs, list items (a table joins the paragraph above it) and quiz questions, as spans."""
    spans, start = [], 0
    for m in re.finditer(r"\n\s*\n|\n(?=- q:)|\n(?=(?:- |\d+\. )(?!q:))", body):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(body)))
    joined = []
    for s, e in spans:
        if joined and body[s:e].lstrip().startswith("|"):
            joined[-1] = (joined[-1][0], e)
        else:
            joined.append((s, e))
    return joined


@dataclass(frozen=True)
class Figure:
    chapter: int
    start: int
    text: str
    block: str

    def __str__(self):
        line = CHAPTERS[self.chapter].count("\n", 0, self.start) + 1
        return f"ch{self.chapter}:{line}: {self.text!r}"


def figures(number: int) -> list[Figure]:
    body = CHAPTERS[number]
    text = masked(body)
    found = []
    for s, e in blocks(body):
        for m in FIGURE.finditer(text, s, e):
            found.append(Figure(number, m.start(), m.group(0), body[s:e]))
    return found


def normal(figure: str) -> str:
    return " ".join(figure.split())


NOT_CLAIMS: list[tuple[int, str, str]] = [
    (1, "a [[KiB]] is 1,024 bytes, a MiB is 1,024 KiB, a GiB is 1,024 MiB", "the definition of the units"),
    (5, "a KiB is 1,024 bytes, a MiB 1,024 KiB, a GiB 1,024 MiB", "the definition of the units"),
    (2, "so \"2025\" becomes", "an example input for the tokenizer"),
    (5, "It makes it 8 times larger", "a wrong quiz choice, its why says so"),
    (5, "It makes it 8 times smaller", "a wrong quiz choice, its why says so"),
    (6, "at position 57 or at position 5,057", "an example position"),
    (5, "a vector of 4 numbers and 2 heads of 2", "the toy example's inputs"),
    (5, "A model has 32 query heads and 8 key/value heads per layer", "the quiz's given inputs"),
    (5, "with 8 heads of width 128 changes", "the quiz's given inputs"),
    (12, "A model has 32 layers, 32 query heads, 8 KV heads", "the quiz's given inputs"),
    (7, "Exactly −6 times its signal", "a wrong quiz choice, its why says so"),
    (12, "storing the cache in 8 bits instead of 16", "names the formats' widths, 8-bit against 16-bit"),
    (12, "common in 2026", "the year the book describes"),
    (14, "A needs 3, B needs 8", "the inputs of the chapter's made-up example"),
    (9, "formats use 8 or 4 bits per weight", "names the two common widths, int8 and int4"),
    (17, "The fixed 20 ms stands for reading the [[weights]], which every step pays once; the 0.1 ms per token",
     "the chapter's made-up cost model, said to be one"),
    (17, "Using the cost model step time = 20 ms + 0.1 ms × tokens", "the chapter's made-up cost model, said to be one"),
    (18, "mostly use in 2026", "the year the book describes"),
    (19, "The largest open models of 2025 and 2026", "the years the book describes"),
    (19, "more than an 80 GB H100 holds", "the H100's memory, cited in chapter 13"),
    (19, "A model has hidden size 2,048, 24 layers", "the quiz's given inputs"),
    (19, "For a model 100 times larger", "the example's input"),
    (20, "p99 TTFT under 1 second, p99 TPOT under 50 ms, and, because stalls annoy readers even when the average is fine, "
         "p99 inter-token latency under 150 ms", "example targets, said to be examples"),
    (20, "say 90 or 99 percent", "example goals, said to be examples"),
    (20, "If 4 requests arrive per second and each spends 10 seconds", "the example's inputs"),
    (20, "at 10 seconds each", "the example's inputs"),
    (20, "(0.8 means busy 80 percent of the time)", "the definition of utilisation"),
    (20, "Running a server at 99 percent of its measured peak", "the case the paragraph warns about"),
    (20, "each spends 5 seconds in the engine", "the quiz's given inputs"),
    (20, "p50 inter-token latency is 20 ms and its p99 is 400 ms", "the quiz's given inputs"),
    (20, "The average gap is 210 ms", "a wrong quiz choice, its why says so"),
    (20, "99 percent of the gaps take about 400 ms, and only the rest are as fast as 20 ms", "a wrong quiz choice, its why says so"),
    (20, "already meets its latency targets at 70 percent of its peak throughput. Why not run it at 99 percent", "the quiz's given inputs"),
    (18, "measures r, the share of drafted tokens accepted, at 50 percent", "the quiz's given input"),
    (17, "Now let a 2,000-token prompt arrive", "the input of the chapter's example"),
    (16, "is the SHA-256 cryptographic hash: 256 bits", "the hash's width is in its name"),
    (16, "the hit rate is 0 %, however many requests send it", "follows from hashing whole blocks, as the sentence says"),
    (16, "gives a hit rate of 0 percent", "follows from hashing whole blocks, as the sentence says"),
]

GLOSSARY_NOT_CLAIMS = {
    ("KiB", "1 KiB"): "the definition of the units", ("KiB", "1 MiB"): "the definition of the units",
    ("KiB", "1 GiB"): "the definition of the units", ("goodput", "90 %"): "an example goal, said to be one",
}
# Glossary figures recomputed here: (term, figure as written) -> value.
GLOSSARY_WORKED = {
    ("KiB", "7 %"): 100 * (2**30 / 1e9 - 1),
    ("NVLink", "900 GB/s"): NVLINK4_BYTES_PER_S / 1e9,
    ("register", "256 KiB"): REGISTERS_PER_SM * 4 / 1024,
}

# Figures a chapter reads off its live widget for a particular prompt: (chapter, words, the
# widget on the page that draws them).
LIVE: list[tuple[int, str, str]] = [
    (7, "each layer's MLP has 3 ×", "kv-value"),
    (10, "its favourite next token gets under 10 %", "kv-sampling"),
    (10, "one token near 100 %", "kv-sampling"),
    (12, "Multiply 2 × layers", "kv-value"),
    (16, "Both say 0: the 0 % hit", "kv-pages"),
    (19, "a forward pass does 2 ×", "kv-value"),
    (21, "Per token it costs 2 × layers", "kv-value"),
]


def ledger(number: int) -> list[tuple[Figure, str | None]]:
    """Every figure of a chapter with how it is covered: computed, measured (checked against
    docs/benchmarks.md), cited, live (read off a widget), not a claim, repeated (the same figure
    covered elsewhere in the chapter), or None."""
    body = CHAPTERS[number]

    def spans(phrases):
        return [m.span() for m in phrases]

    kinds = [("computed", spans(m for w in WORKED if w.chapter == number for m in w.matches())),
             ("measured", spans(m for w in MEASURED if w.chapter == number for m in w.matches())),
             ("live", spans(m for ch, phrase, _ in LIVE if ch == number for m in pattern(phrase).finditer(body))),
             ("not a claim", spans(m for ch, phrase, _ in NOT_CLAIMS if ch == number for m in pattern(phrase).finditer(body)))]

    def kind(f: Figure) -> str | None:
        end = f.start + len(f.text)
        for name, found in kinds:
            if any(s <= f.start and end <= e for s, e in found):
                return name
        return "cited" if LINK.search(f.block) else None

    every = [(f, kind(f)) for f in figures(number)]
    covered = {normal(f.text) for f, k in every if k}
    return [(f, k or ("repeated" if normal(f.text) in covered else None)) for f, k in every]


def uncovered(number: int) -> list[Figure]:
    return [f for f, k in ledger(number) if k is None]


def covered_in(number: int) -> set[str]:
    return {normal(f.text) for f, k in ledger(number) if k}


if __name__ == "__main__":
    # python tests/book_ledger.py: the ledger, chapter by chapter (add -v for every figure).
    import sys
    from collections import Counter
    for number in sorted(CHAPTERS):
        rows = ledger(number)
        live = len(re.findall(r"<kv-value ", CHAPTERS[number]))
        counts = Counter(k or "UNCOVERED" for _, k in rows)
        print(f"chapter {number:2}: {len(rows):3} typed figures, {live:2} live values;",
              ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
        if "-v" in sys.argv:
            for f, k in rows:
                print(f"    {k or 'UNCOVERED':11} {f}")
