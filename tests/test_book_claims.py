"""Claims in the book that can be checked mechanically: the corrected sentences stay
corrected, chapter 13's live figures are formatted and derived rather than raw, and no
chapter credits kvscope's engine with a feature its code does not have."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("markdown_it")

from kvscope.server.rendering import Site  # noqa: E402

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
    (13, "close to the peak", "less than a fifth"),
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
