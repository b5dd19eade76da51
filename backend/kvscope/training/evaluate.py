"""Held-out loss, shared by the training loop, the model card and the tests.

The held-out documents are regenerated from their seeds (corpus.document("heldout", i)), so
nothing large is committed and every caller measures exactly the same text.
"""
from __future__ import annotations

import math
import random
from typing import Iterator

import torch

from .corpus import EOT, documents, story


def pack(tokenizer, texts, eot_id: int) -> torch.Tensor:
    """Documents as one token stream, each followed by <|endoftext|> (as in training)."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"] if callable(tokenizer) else tokenizer.encode(text).ids)
        ids.append(eot_id)
    return torch.tensor(ids, dtype=torch.long)


def windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping (seq_len + 1)-token windows: inputs and their next-token targets."""
    n = (len(stream) - 1) // seq_len
    return torch.stack([stream[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])


@torch.no_grad()
def mean_loss(model, batches: torch.Tensor, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats/token) over windows from `windows()`."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(batches), batch_size):
        w = batches[i: i + batch_size]
        logits = model(input_ids=w[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="sum")
        total, count = total + loss.item(), count + w[:, 1:].numel()
    model.train(was_training)
    return total / count


def heldout_loss(model, tokenizer, n_docs: int = 200, seq_len: int = 256) -> tuple[float, float]:
    """(loss, perplexity) on the first `n_docs` held-out documents."""
    eot_id = tokenizer.convert_tokens_to_ids(EOT)
    stream = pack(tokenizer, documents("heldout", n_docs), eot_id)
    loss = mean_loss(model, windows(stream, seq_len))
    return loss, math.exp(loss)


def qa_examples(n: int) -> Iterator[tuple[str, str, str]]:
    """(story, question, answer) from a seed stream that training never saw.

    The answers name this story's characters, places and objects, so answering right
    means reading the story in the prompt, not reciting the corpus.
    """
    for i in range(n):
        rng = random.Random(f"kvscope-mini/heldout-qa/{i}")
        text, qa, _ = story(rng)
        q, a = rng.choice(qa)
        yield text, q, a


@torch.no_grad()
def qa_accuracy(model, tokenizer, n: int = 20) -> tuple[float, list[tuple[str, str, str]]]:
    """Exact-match accuracy of greedy answers (chat template) to held-out story questions."""
    right, misses = 0, []
    for text, q, a in qa_examples(n):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text + "\n\n" + q}],
                                               tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                             do_sample=False, pad_token_id=tokenizer.pad_token_id)
        got = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        if got == a:
            right += 1
        else:
            misses.append((q, a, got))
    return right / n, misses
