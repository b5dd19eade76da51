"""Claims in the book that can be checked mechanically: the corrected sentences stay
corrected, chapter 13's live figures are formatted and derived rather than raw, and no
chapter credits kvscope's engine with a feature its code does not have."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("markdown_it")

from kvscope.server.pages import Site  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SITE = Site()
CHAPTERS = {c.number: c.body for c in SITE.chapter_list()}
VALUE = re.compile(r'<kv-value key="([^"]+)"(?: format="([^"]+)")?(?: unit="([^"]+)")?></kv-value>')


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s]


@pytest.mark.parametrize("number, wrong, right", [
    (8, "lower limit on how fast decode can go", "lower\n  limit on the time of a decode step"),
    (15, "The user sees a pause, not a different answer.", "can flip a near-tie"),
    (17, "four tokens instead of one", "71.2 ms for a token, instead of 220.8 ms"),
    (19, "tens of gigabytes", "100 × 1.19 GB ≈ 119 GB"),
    (13, "under a millisecond, yet the step takes several", "about 0.6 ms with kvscope's compiled decode"),
    (1, "hundreds of billions", "reach about a trillion"),
    (11, "leave inter-token latency almost unchanged", "so the gaps do grow measurably"),
    (14, "each contributing one decode token", "not necessarily its whole prompt"),
    (15, "is also used by some engines", "its V1 engine dropped it and only recomputes"),
    (16, "can never cause a wrong reuse", "the token ids in block i, extra keys"),
    (17, "exactly what a single prefill would give", "up to floating-point rounding"),
    (18, "Large batches change the model's output", "EAGLE-3"),
    (19, "however many GPUs there are", "2 × (N − 1) ÷ N times its list in total"),
    (20, "often called goodput", "requests per second served within their targets, not tokens per second"),
    (21, "a build step per model", "maintenance mode"),
    # issue 37 §3
    (12, "The first token never moves", "on vLLM an 8-bit cache can move the first token too"),
    (11, "It cannot take more than one,", "k + 1 positions"),
    (11, "gives exactly the same result", "up to floating-point rounding"),
    (20, "half of the requests were faster", "for the ITL it is a gap between two tokens"),
    (21, "llm = LLM()\n", "llm = LLM(model=default_model_path(), kv_cache_memory_bytes=256 << 20)"),
    (15, "That multiplies the position by the block size.", "(13 × 4 + 1)"),
    (12, "Three things that are common in 2026", "Hybrid models keep a fixed-size state"),
    (21, "a prompt lookup or a small [[draft model]] proposes", "EAGLE-3 or a model's own multi-token prediction"),
    (9, "both from [NVIDIA's datasheet]", "PB-11133-001"),
    (13, "the PCIe card's 756 is half the 1,513 the datasheet gives", "PB-11133-001"),
])
def test_corrected_sentence(number, wrong, right):
    assert wrong not in CHAPTERS[number]
    assert right in CHAPTERS[number]


def test_chapter_17_worst_gaps_follow_from_its_cost_model():
    step = lambda tokens: 20 + 0.1 * tokens  # noqa: E731 - the chapter's own cost model
    assert f"{step(2008):.1f} ms" == "220.8 ms" and f"{step(512):.1f} ms" == "71.2 ms"
    # Same tokens either way: one long step and three short ones last as long as four chunks.
    assert round(step(2008) + 3 * step(8), 1) == round(3 * step(512) + step(8 + 488), 1) == 283.2


def test_chapter_13_live_rates_are_formatted_with_units():
    values = VALUE.findall(CHAPTERS[13])
    rates = {key: (fmt, unit) for key, fmt, unit in values if key in ("device.peak_flops", "device.peak_bandwidth_bytes_per_s")}
    assert rates == {"device.peak_flops": ("si", "FLOP/s"), "device.peak_bandwidth_bytes_per_s": ("si", "B/s")}
    # The memory sizes use the widget's binary units (GiB), never a raw byte count.
    for key, fmt, _ in values:
        if key.endswith("_bytes"):
            assert fmt == "bytes", key


def test_chapter_13_computes_its_two_divisions():
    keys = {key: fmt for key, fmt, _ in VALUE.findall(CHAPTERS[13])}
    assert keys.get("derived.min_decode_step_s") == "seconds"
    assert keys.get("derived.ridge_flops_per_byte") == "float"
    # The H100 worked example the page compares with: 1.19 GB ÷ 3.35 TB/s and 989 ÷ 3.35.
    assert round(1.19e9 / 3.35e12 * 1e3, 2) == 0.36 and round(989 / 3.35) == 295
    assert "0.36 ms and 295" in CHAPTERS[13]


def test_step_summary_pluralises_tokens():
    source = (ROOT / "frontend/js/widgets/kv-memory.js").read_text(encoding="utf-8")
    assert "num_batched_tokens)} tokens" not in source
    assert "num_batched_tokens === 1 ? '' : 's'" in source


# Features a chapter may only credit to kvscope's own engine once the engine has them:
# (what the sentence says, where the engine would implement it).
ENGINE_FEATURES = [
    (re.compile(r"speculative decoding|draft model|drafts? tokens", re.I), re.compile(r"draft|speculat", re.I)),
    (re.compile(r"tensor parallel|pipeline parallel", re.I), re.compile(r"tensor_parallel|all_reduce|world_size", re.I)),
]
OWN_ENGINE = re.compile(r"\bkvscope(?:'s)? (?:engine|scheduler|runs|does|uses|implements)|\bthe live engine\b|\bthis engine\b", re.I)


def engine_source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "backend/kvscope/engine").glob("*.py"))


def test_no_chapter_credits_the_engine_with_a_missing_feature():
    source = engine_source()
    missing = [claim for claim, code in ENGINE_FEATURES if not code.search(source)]
    offending = [(n, s) for n, body in CHAPTERS.items() for s in sentences(body)
                 if OWN_ENGINE.search(s) and any(claim.search(s) for claim in missing)]
    assert not offending, offending


def test_chapter_9_checkpoint_tour_matches_the_embedded_model():
    """Every file and tensor name the chapter shows exists in backend/kvscope/assets/kvscope-mini."""
    import json
    import struct
    folder = ROOT / "backend/kvscope/assets/kvscope-mini"
    body = CHAPTERS[9]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert f"`{name}`" in body and (folder / name).is_file(), name
    with open(folder / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    shown = re.search(r"`(model\.layers\.[\w.]+)`", body).group(1)
    assert shown in header
    config = json.loads((folder / "config.json").read_text())
    assert f"({config['num_hidden_layers']} in kvscope-mini)" in body


@pytest.mark.parametrize("number, term", [(9, "checkpoint"), (9, "exponent and mantissa"), (13, "thread"),
                                          (14, "padding"), (19, "ring all-reduce"), (20, "utilisation"),
                                          (21, "Server-Sent Events"), (21, "data parallelism"),
                                          (21, "quantization"), (21, "KV offloading")])
def test_term_is_defined_where_first_used(number, term):
    """The chapter marks the term (so its definition is one hover away) and the glossary points back to it."""
    entry = SITE.glossary.lookup(term)
    assert entry is not None and entry.chapter == number
    marks = re.findall(r"\[\[(?:[^\]|]+\|)?([^\]]+)\]\]", CHAPTERS[number])
    assert any(SITE.glossary.lookup(mark) is entry for mark in marks)


def test_pairing_convention_is_an_aside():
    body = CHAPTERS[6]
    aside = re.search(r'<aside class="kv-aside".*?</aside>', body, re.S)
    assert aside and "i + head dimension ÷ 2" in aside.group(0)
    assert body.count("i + head dimension ÷ 2") == 1


def test_every_chapter_opens_with_what_it_needs():
    """The first paragraph of every chapter says what the reader needs from earlier ones."""
    for number, body in CHAPTERS.items():
        assert body.lstrip().startswith("**What you need from earlier chapters:**"), number


# (term, chapter of first use, whether the bare word is also ordinary English, so earlier
# chapters may use it in its everyday sense: "a sequence of bytes", "a batch of requests")
@pytest.mark.parametrize("term, number, everyday", [
    ("layer", 1, False), ("FLOP", 7, False), ("KiB", 1, False), ("batch", 6, True), ("tensor", 7, False),
    ("rank", 19, False), ("collective", 19, False), ("NCCL", 19, False), ("PCIe", 9, False),
    ("preemption", 13, False), ("sequence", 6, True), ("transformer", 6, False)])
def test_basic_term_has_a_tooltip_where_it_is_first_used(term, number, everyday):
    """The words a reader with no ML background trips over are glossary terms, marked in the
    chapter that first uses them, and no earlier chapter uses the bare word."""
    entry = SITE.glossary.lookup(term)
    assert entry is not None, term
    marks = re.findall(r"\[\[(?:[^\]|]+\|)?([^\]]+)\]\]", CHAPTERS[number])
    assert any(SITE.glossary.lookup(mark) is entry for mark in marks), (term, number)
    if everyday:
        return
    names = [entry.term, *entry.aliases]
    bare = re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, names)) + r")(?![\w-])")
    for earlier in range(1, number):
        prose = re.sub(r"\[\[[^\]]*\]\]|```.*?```|`[^`]*`", "", CHAPTERS[earlier], flags=re.S)
        assert not bare.search(prose), (term, earlier)


def test_figures_quoted_from_the_benchmarks_are_there():
    """Chapters 13 and 20 quote docs/benchmarks.md; the figures must be in it, and the
    chapter's divisions must follow from them."""
    bench = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    for figure in ("start-up compile 8–9 → 5 s", "memory read 10.6–12.5 GB/s",
                   "memory read 30–31 GB/s", "| embedded (3.5M) | compiled | 1 | 0.62–0.63 ms",
                   "| embedded (3.5M) | eager | 2 | 1.41–1.49 ms", "1.19 ms against 2.39 ms", "0.96 ms against 2.29 ms"):
        assert figure in bench, figure
    # Chapter 20 gives today's start-up compile time, not the 31-35 s of before the per-engine compile.
    assert "today about 5 seconds" in CHAPTERS[20] and "31 to 35 seconds" not in CHAPTERS[20]
    # The divisions by these rates are recomputed in tests/test_book_numbers.py (WORKED, chapter 13).
    assert "1.0 to 1.2 ms" in CHAPTERS[13]


def test_worked_figures_of_the_2026_corrections_recompute():
    ch = CHAPTERS
    # 2: Qwen3's 151,936 rows = 151,643 pieces + 26 markers + 267 unused, and a multiple of 128
    assert 151_643 + 26 + 267 == 151_936 == 1_187 * 128 and 151_643 + 208 <= 151_936
    assert all(f in ch[2] for f in ("151,643", "26 special", "267 rows", "1,187"))
    # 9: bfloat16 has 8 significant bits, about 2.4 decimal digits
    import math
    assert round(8 * math.log10(2), 1) == 2.4 and "8 × log₁₀ 2 ≈ 2.4" in ch[9]
    # 12: DeepSeek-V3's MLA cache per token, and Gemma 3's sliding-window share
    assert 61 * (512 + 64) * 2 == 70_272 and "70,272 bytes" in ch[12]
    assert round(100 * (32_768 + 5 * 1_024) / (6 * 32_768)) == 19 and "19 percent" in ch[12]
    # 13: resident threads on an H100 SXM
    assert 132 * 2_048 == 270_336 and "270,336" in ch[13]
    # 19: ring all-reduce sends 2(N - 1)/N of the list
    assert [2 * (n - 1) / n for n in (2, 4, 8)] == [1.0, 1.5, 1.75]
    assert "1.5 times with 4, 1.75 times with 8" in ch[19]
    # 20: moving a prompt's cache against recomputing it (50 GB/s link, H100 peak)
    assert round(2 * 80 * 8 * 128 * 2 / 1024) == 320 and round(2 * 80 * 8 * 128 * 2 / 50e9 * 1e3, 3) == 0.007
    assert round(114_688 / 50e9 * 1e3, 4) == 0.0023 and round(1.19e9 / 989e12 * 1e3, 4) == 0.0012
    # 21: a 2-byte scale per 128 weights is 1.6 % in int8 and 3.1 % in int4
    assert round(100 * 2 / 128, 1) == 1.6 and round(100 * 2 / 64, 1) == 3.1
    assert "+ 1.6 %" in ch[21] and "+ 3.1 %" in ch[21]
    assert round(2_000 * 114_688 / 64e9 * 1e3, 1) == 3.6 and round(2_000 * 1.19e9 / 989e12 * 1e3, 1) == 2.4


def test_generation_config_fields_named_in_chapter_9_exist():
    import json
    config = json.loads((ROOT / "backend/kvscope/assets/kvscope-mini/generation_config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert key in config and f"`{key}`" in CHAPTERS[9], key


def test_glossary_keeps_itl_and_tpot_apart():
    itl, tpot, goodput = (SITE.glossary.lookup(t) for t in ("ITL", "TPOT", "goodput"))
    assert itl is not None and tpot is not None and itl is not tpot
    assert "(end-to-end time − TTFT) ÷ (output tokens − 1)" in tpot.short
    assert "rate of requests" in goodput.short and "tokens per second" not in goodput.short
    assert "2(N − 1)/N" in SITE.glossary.lookup("ring all-reduce").short
    assert "270,000" in SITE.glossary.lookup("thread").short
    assert not SITE.glossary.lookup("prefill").short.startswith("The first forward pass")


def test_chapter_21_code_map_names_files_that_exist():
    """The map from chapters to kvscope's files stays true as files move."""
    section = CHAPTERS[21].split("## Where each chapter lives in code", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if re.match(r"\| \d+ ", line)]
    assert [int(row[1].split()[0]) for row in rows] == list(range(1, 22))
    for row in rows:
        for path in re.findall(r"`([\w/]+(?:\.\w+|/))`", row[2]):
            assert (ROOT / "backend" / "kvscope" / path).exists(), (row[1].strip(), path)
