"""Write the model card (README.md) of a trained kvscope-mini checkpoint.

    python -m kvscope.training.model_card backend/kvscope/assets/kvscope-mini

Everything in the card is measured here, on the saved checkpoint, with plain `transformers`
on one CPU thread: held-out loss, decode speed, and the sample continuations.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

import torch

from .evaluate import heldout_loss, qa_accuracy, qa_examples

PROMPTS = [
    "Once upon a time",
    "One rainy afternoon, Mia went to the park with her red kite.",
    "There was once a shy little fox named",
    '"I lost my kite," said Tom.',
    "CHAT:Tell me a story about a brave girl named Zoe.",
]
SAMPLING = dict(do_sample=True, temperature=0.8, top_p=0.95)


def _load(ckpt: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    return model, tok


def _prompt_ids(tok, prompt: str) -> torch.Tensor:
    if prompt.startswith("CHAT:"):
        text = tok.apply_chat_template([{"role": "user", "content": prompt[5:]}],
                                       tokenize=False, add_generation_prompt=True)
    else:
        text = prompt
    return tok(text, return_tensors="pt").input_ids


@torch.no_grad()
def continuation(model, tok, prompt: str, max_new_tokens: int = 120, seed: int | None = None) -> str:
    ids = _prompt_ids(tok, prompt)
    kw = dict(do_sample=False) if seed is None else dict(SAMPLING)
    if seed is not None:
        torch.manual_seed(seed)
    out = model.generate(ids, max_new_tokens=max_new_tokens, **kw)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def continuation_chat(model, tok, user_text: str) -> str:
    return continuation(model, tok, "CHAT:" + user_text, max_new_tokens=32).strip()


@torch.no_grad()
def decode_speed(model, tok, new_tokens: int = 256, repeats: int = 5) -> float:
    """Tokens/s of greedy decoding, batch 1, KV cache on, one thread.

    Best of `repeats`: on a shared machine the slower runs measure the neighbours' load."""
    ids = _prompt_ids(tok, "Once upon a time")
    model.generate(ids, max_new_tokens=8, do_sample=False)  # warm-up
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        rates.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - t))
    return max(rates)


def _curve(history: list[dict]) -> str:
    evals = [h for h in history if h["event"] == "eval"]
    trains = {h["step"]: h for h in history if h["event"] == "train"}
    rows = ["| step | train loss (EMA) | held-out loss | held-out ppl | elapsed |", "|---:|---:|---:|---:|---:|"]
    for e in evals:
        tr = trains.get(e["step"], {})
        rows.append(f"| {e['step']} | {tr['loss_ema'] if tr else float('nan'):.3f} | {e['heldout_loss']:.3f} | "
                    f"{e['heldout_ppl']:.2f} | {e['elapsed_s'] / 60:.1f} min |")
    return "\n".join(rows)


def write_card(ckpt: str) -> str:
    torch.set_num_threads(1)
    model, tok = _load(ckpt)
    with open(os.path.join(ckpt, "training_summary.json")) as fh:
        summ = json.load(fh)
    args, data = summ["args"], summ["data"]
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    size_mb = os.path.getsize(os.path.join(ckpt, "model.safetensors")) / 1e6
    h_loss, h_ppl = heldout_loss(model, tok, n_docs=args["eval_docs"], seq_len=args["seq_len"])
    speed = decode_speed(model, tok)
    qa_n = 50
    qa_acc, _ = qa_accuracy(model, tok, qa_n)
    qa_story, qa_q, qa_a = next(qa_examples(1))
    samples = []
    for i, p in enumerate(PROMPTS):
        shown = p[5:] + "  (as a chat turn)" if p.startswith("CHAT:") else p
        samples.append(f"### {i + 1}. `{shown}`\n\n**Greedy:**\n\n> "
                       + continuation(model, tok, p).strip().replace("\n", "\n> ")
                       + f"\n\n**Sampled** (temperature 0.8, top-p 0.95, torch seed {i}):\n\n> "
                       + continuation(model, tok, p, seed=i).strip().replace("\n", "\n> "))
    repro = (f"python -m kvscope.training.train --out DIR --threads {args['threads']} "
             f"--budget-min {args['budget_min']:g} --steps {args['steps']}")
    repro_steps = f"python -m kvscope.training.train --out DIR --threads {args['threads']} --budget-min 0 --steps {summ['steps']}"
    card = f"""---
license: apache-2.0
library_name: transformers
pipeline_tag: text-generation
language: en
tags: [qwen3, tiny, stories, kvscope]
---

# kvscope-mini

The default model of kvscope: a {n_params / 1e6:.2f} M-parameter model with the
Qwen3 architecture, trained from scratch on a CPU by `kvscope.training.train` on a corpus of
generated children's stories. It exists so that kvscope works on a fresh machine with no GPU
and no model hub: it loads through the same code path as any Hugging Face Qwen3 checkpoint and
writes readable (simple) English, so the tokens, attention maps and samples in kvscope's
widgets are worth looking at.

## Architecture

| | |
|---|---|
| class | `Qwen3ForCausalLM` (standard Hugging Face checkpoint) |
| parameters | {n_params:,} (embeddings tied with the LM head) |
| layers | {cfg.num_hidden_layers} |
| hidden size / MLP size | {cfg.hidden_size} / {cfg.intermediate_size} (SwiGLU) |
| attention | {cfg.num_attention_heads} query heads, {cfg.num_key_value_heads} KV heads (GQA, {cfg.num_attention_heads // cfg.num_key_value_heads} query heads per KV head), head_dim {cfg.head_dim}, QK-RMSNorm |
| positions | RoPE, theta {cfg.rope_parameters['rope_theta']:g}, max {cfg.max_position_embeddings} positions (trained on {args['seq_len']}-token windows) |
| vocabulary | {cfg.vocab_size} rows ({len(tok)} tokens used, padded to a multiple of 64) |
| stored as | `model.safetensors`, float32, {size_mb:.1f} MB |

## Corpus

Generated by `kvscope/training/corpus.py` (with `lexicon.py` and `plots.py`), entirely in the
project's own words, Apache-2.0. Ten plots (a lost object, sharing, a fear, a storm, not giving
up, honesty, a new friend, a hand-made gift, rescuing a bird, a race), each a chain of cause and
effect with several phrasings per sentence, filled with two named characters (girls, boys or
animals, with consistent pronouns), a grown-up, a place, an object, food, a hobby and a time of
day; every story ends with a moral. 30% of the documents are ChatML exchanges: a request for a
story, questions about a story whose answers are facts of that story (who helped whom, where the
object was found), or a little small talk.

Every document is generated from its own seed (`kvscope-mini/<split>/<index>`), so the corpus is
reproduced exactly, offline, and never stored. Training used the first {args['train_docs']:,} `train`
documents ({data['train_chars'] / 1e6:.1f} MB of text, {data['train_tokens'] / 1e6:.2f} M tokens); the held-out split is
`heldout`, a different seed stream (new combinations of the same templates); its first
{args['eval_docs']} documents ({data['heldout_tokens']:,} tokens in {args['seq_len']}-token windows) give the held-out numbers below.
Look at a few: `python -m kvscope.training.corpus --split heldout --docs 5 --out /dev/stdout`.

## Tokenizer

Byte-level BPE trained with Hugging Face `tokenizers` on the first {args['tokenizer_docs']:,} training
documents: {len(tok)} tokens (the trainer stops when no pair occurs twice; the corpus has a small
vocabulary, so most words are one token). All 256 bytes are in the base alphabet, so any UTF-8
text round-trips; unseen words fall apart into byte pieces. Special tokens: `<|endoftext|>`
(id 0: bos, eos and pad; ends every training document), `<|im_start|>` and `<|im_end|>`
(ids 1, 2) for the Qwen-style chat template in `tokenizer_config.json`. No token is added
automatically. Generation stops at `<|endoftext|>` or `<|im_end|>`.

## Training

AdamW (betas 0.9/0.95, weight decay {args['weight_decay']}, grad clip 1.0), peak learning rate
{args['lr']:g}, {args['warmup']} warmup steps then cosine decay to {args['min_lr_frac']:g}x, batch {args['batch']} x {args['seq_len']}
tokens, bf16 autocast for the matmuls (weights and optimizer state in float32), seed {args['seed']},
a seeded permutation of the packed windows each epoch.
{summ['steps']} steps, {summ['tokens_seen'] / 1e6:.1f} M tokens ({summ['epochs']} epochs) in
**{summ['train_seconds'] / 60:.1f} minutes on {args['threads']} CPU thread{'s' if args['threads'] > 1 else ''}** ({platform.processor() or platform.machine()}).

| | loss (nats/token) | perplexity |
|---|---:|---:|
| train (first {args['eval_docs']}-document-sized slice of training windows) | {summ['train_loss']:.4f} | {summ['train_ppl']:.3f} |
| held-out (first {args['eval_docs']} `heldout` documents, measured again for this card) | {h_loss:.4f} | {h_ppl:.3f} |

Training curve (full log in `training_summary.json`):

{_curve(summ['history'])}

The cosine schedule ends at `--steps` or after `--budget-min` minutes of training, whichever
comes first (after warmup, progress is the larger of the step fraction and the wall-clock
fraction), so a run on a slow or busy CPU still anneals fully; this run ended
{"on its step limit" if summ['steps'] >= args['steps'] else f"on its {args['budget_min']:g}-minute budget"} (the 2 cores were shared with other work).

Reproduce this run (the step count, hence the exact numbers, depends on the machine's speed):

```
{repro}
python -m kvscope.training.model_card DIR
```

or the same number of steps on a purely step-based schedule, deterministic for a given
thread count: `{repro_steps}`.

## Reading comprehension

Chat-formatted questions about {qa_n} stories from a seed stream that training never saw
(`kvscope.training.evaluate.qa_examples`), answered greedily: **{qa_acc:.0%} exact match**. The
answers name this story's characters, places and objects, so they cannot be recited from the
corpus. Example: after the first such story, "{qa_q}" should be answered "{qa_a}"; the model
says "{continuation_chat(model, tok, qa_story + chr(10) * 2 + qa_q)}".

## Speed

**{speed:.0f} tokens/s** decoding on one CPU thread: plain `transformers`
`model.generate`, float32, batch 1, KV cache, greedy, 256 new tokens after the prompt
"Once upon a time", best of 5 runs after a warm-up (`torch.set_num_threads(1)`,
torch {torch.__version__}, Python {sys.version.split()[0]}).

## Samples

Produced for this card by plain `transformers` (`AutoModelForCausalLM.generate`, 120 new tokens).

{(chr(10) * 2).join(samples)}

## Limitations

- It only knows the world of its corpus: a few hundred distinct words, ten plots, simple
  sentences. Anything else (facts, code, other languages) comes out as story-shaped nonsense,
  and a prompt far from the templates is often steered back into one of them.
- Held-out documents are new combinations of the same templates, so held-out perplexity measures
  how well it learned the story grammar and who-is-who, not general English.
- Greedy decoding settles on the corpus's most likely choices (the same few names, plots and
  foods recur); sample for variety. Sampled stories sometimes lose track of who is who, e.g.
  giving two characters the same name, and about a third of held-out questions are answered
  wrongly.
- Not for any use beyond demonstrating and testing an inference engine.

## Licence

Apache-2.0, like kvscope: the weights, the tokenizer and the generated corpus (the project's own
text; no third-party data was used).
"""
    with open(os.path.join(ckpt, "README.md"), "w", encoding="utf-8") as fh:
        fh.write(card)
    return card


if __name__ == "__main__":
    print(write_card(sys.argv[1]))
