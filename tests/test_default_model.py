"""The embedded default model (kvscope-mini): a real, standard Qwen3 checkpoint that writes English.

Loads the shipped checkpoint with plain transformers and with kvscope, checks they agree, and
checks quality in ways a random or broken checkpoint cannot pass: held-out perplexity on text
regenerated from the corpus seeds, and greedy continuations made of corpus words without loops.
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from kvscope.default_model import default_model_path

PROMPTS = [
    "Once upon a time",
    "One sunny morning, Lily went to the beach with her red kite.",
    "There was once a shy little fox named",
    "Tom and Mia were best friends.",
]
# Held-out perplexity must stay below this. The training curve in the model card: uniform
# guessing is ~2000, held-out ppl is 1.92 at step 250 (story grammar learned), 1.60 at step
# 1000, then drops to 1.40 by step 1250 as the model learns to copy names and objects from
# earlier in the story, and ends at 1.34. 1.5 sits in that drop: a checkpoint above it has not
# learned who-is-who (or is broken), while the shipped one passes with margin.
MAX_HELDOUT_PPL = 1.5
HELDOUT_DOCS = 60  # ~10k tokens: a fixed slice, regenerated from the held-out seed
QA_QUESTIONS = 20
MIN_QA_ACCURACY = 0.5  # the shipped model: 68% on 50 (model card); chance: a few percent


@pytest.fixture(scope="module")
def ckpt() -> str:
    return default_model_path()


@pytest.fixture(scope="module")
def hf(ckpt):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    return model, tok


def hf_greedy(model, tok, prompt: str, n: int, stop_at_eos: bool = True) -> list[int]:
    ids = tok(prompt, return_tensors="pt").input_ids
    kw = {} if stop_at_eos else dict(eos_token_id=None, min_new_tokens=n)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False, pad_token_id=tok.pad_token_id, **kw)
    return out[0, ids.shape[1]:].tolist()


def test_found_through_the_package_not_the_cwd(tmp_path, monkeypatch):
    import kvscope
    monkeypatch.chdir(tmp_path)
    path = Path(default_model_path())
    assert path.is_dir() and path.is_absolute()
    assert Path(kvscope.__file__).parent in path.parents


def test_standard_small_qwen3_checkpoint(ckpt):
    from safetensors import safe_open
    files = set(os.listdir(ckpt))
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors", "README.md"} <= files
    size = os.path.getsize(os.path.join(ckpt, "model.safetensors"))
    assert size <= 25 * 2**20, f"checkpoint is {size / 2**20:.1f} MiB"
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert cfg["num_hidden_layers"] >= 4
    assert cfg["num_attention_heads"] >= 2 * cfg["num_key_value_heads"]  # GQA
    # The dtype the config declares is the dtype stored.
    with safe_open(os.path.join(ckpt, "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {{"float32": "F32", "bfloat16": "BF16"}[cfg["dtype"]]}
    gen = json.load(open(os.path.join(ckpt, "generation_config.json")))
    assert gen["eos_token_id"] and gen["pad_token_id"] is not None


def test_tokenizer_round_trips_and_has_chat_template(hf):
    _, tok = hf
    assert tok.is_fast
    assert tok.eos_token == "<|endoftext|>" and tok.bos_token == "<|endoftext|>"
    for text in ["Once upon a time, Mia found a shell.", "Crème brûlée 🦊🌈 naïve 日本語\n\ttabs",
                 "<|im_start|>user\nhi<|im_end|>\n"]:
        ids = tok(text).input_ids
        assert tok.decode(ids) == text
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == tok("<|im_start|><|im_end|>").input_ids
    chat = tok.apply_chat_template([{"role": "user", "content": "Who are you?"}],
                                   tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"
    # Corpus words are whole tokens; an unseen word falls back to smaller pieces.
    assert len(tok(" rainbow").input_ids) == 1
    assert len(tok(" xylophone").input_ids) > 1


def test_kvscope_matches_transformers_greedy(ckpt, hf):
    from kvscope import LLM, SamplingParams
    model, tok = hf
    llm = LLM(ckpt, device="cpu", dtype="float32")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=40))
    eos = {tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")}

    def strip_eos(ids):
        return ids[:-1] if ids and ids[-1] in eos else ids

    for prompt, out in zip(PROMPTS, outs):
        expected = hf_greedy(model, tok, prompt, 40)
        assert strip_eos(list(out.outputs[0].token_ids)) == strip_eos(expected), prompt
        assert out.outputs[0].text.strip() == tok.decode(strip_eos(expected), skip_special_tokens=True).strip()
        assert len(expected) >= 10  # a real continuation, not an immediate stop


def test_heldout_perplexity(hf):
    from kvscope.training.evaluate import heldout_loss
    model, tok = hf
    loss, ppl = heldout_loss(model, tok, n_docs=HELDOUT_DOCS)
    assert ppl < MAX_HELDOUT_PPL, f"held-out loss {loss:.3f}, perplexity {ppl:.2f}"


@pytest.fixture(scope="module")
def corpus_words() -> set[str]:
    from kvscope.training.corpus import documents
    words: set[str] = set()
    for doc in documents("train", 3000):
        words.update(re.findall(r"[A-Za-z]+", doc))
    return words


def test_greedy_continuations_are_corpus_words_without_loops(hf, corpus_words):
    model, tok = hf
    for prompt in PROMPTS:
        ids = hf_greedy(model, tok, prompt, 60, stop_at_eos=False)
        text = tok.decode(ids, skip_special_tokens=True)
        words = re.findall(r"[A-Za-z]+", text)
        assert len(words) >= 30, (prompt, text)
        unknown = [w for w in words if w not in corpus_words]
        assert not unknown, (prompt, text, unknown)
        grams = Counter(tuple(ids[i:i + 4]) for i in range(len(ids) - 3))
        gram, count = grams.most_common(1)[0]
        assert count < 3, (prompt, text, tok.decode(list(gram)))


def test_answers_questions_about_unseen_stories(hf):
    """Who helped whom, where a thing was hidden: facts of a story the model has never seen,
    given in the prompt. Guessing a name from the ~70 in the corpus would score a few percent."""
    from kvscope.training.evaluate import qa_accuracy
    model, tok = hf
    acc, misses = qa_accuracy(model, tok, n=QA_QUESTIONS)
    assert acc >= MIN_QA_ACCURACY, misses
