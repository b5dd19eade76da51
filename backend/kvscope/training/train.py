"""Train kvscope-mini (a small Qwen3) on the generated corpus and write a HF checkpoint.

    python -m kvscope.training.train --out train-runs/kvscope-mini --budget-min 40

Steps: generate the corpus from its seeds, train the BPE tokenizer, pack the token stream
into 257-token windows, train `transformers.Qwen3ForCausalLM` with AdamW + warmup + cosine,
then save config/generation config/tokenizer/weights and write the model card.

The cosine schedule ends at --steps or at --budget-min minutes, whichever comes first, so
the run finishes its schedule on a slow or busy machine too; `--budget-min 0` makes the
schedule purely step-based (and the run deterministic for a given thread count).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from .corpus import EOT, IM_END, documents
from .evaluate import mean_loss, windows
from .tokenizer import save_tokenizer, train_tokenizer


def model_config(vocab_size: int, a) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.hidden // a.heads, max_position_embeddings=a.max_positions, rope_theta=10000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        attention_dropout=0.0, use_cache=True)


def add_legacy_config_keys(out_dir: str) -> None:
    """transformers 5 writes `dtype` and `rope_parameters`; transformers 4.x (which the project
    also supports) reads `torch_dtype` and `rope_theta` and would otherwise fall back to
    Qwen3's default rope_theta of 1e6. Writing both keeps the checkpoint portable."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as fh:
        cfg = json.load(fh)
    cfg.setdefault("torch_dtype", cfg.get("dtype", "float32"))
    cfg.setdefault("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    with open(path, "w") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True)
        fh.write("\n")


def cosine(progress: float, peak: float, floor: float) -> float:
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def log(fh, **kv) -> None:
    line = json.dumps(kv)
    print(line, flush=True)
    fh.write(line + "\n")
    fh.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-docs", type=int, default=50_000)
    ap.add_argument("--tokenizer-docs", type=int, default=12_000)
    ap.add_argument("--eval-docs", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=4096, help="BPE target (it stops earlier if merges run out)")
    ap.add_argument("--tokenizer", default=None,
                    help="reuse this checkpoint's tokenizer.json instead of training one (a draft model "
                         "for speculative decoding must share its target's vocabulary)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--max-positions", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=4000, help="step limit (the schedule ends here at the latest)")
    ap.add_argument("--budget-min", type=float, default=40.0,
                    help="wall-clock budget for the training loop (0: none, step-based schedule)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bf16 autocast for matmuls (weights and optimizer stay fp32)")
    ap.add_argument("--no-card", action="store_true", help="skip the model card (dev runs)")
    a = ap.parse_args()

    t0 = time.time()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "train_log.jsonl"), "w")

    # Corpus and tokenizer, all regenerated from seeds.
    train_texts = list(documents("train", a.train_docs))
    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json")) if a.tokenizer \
        else train_tokenizer(train_texts[: a.tokenizer_docs], a.vocab)
    save_tokenizer(tok, a.out, a.max_positions)
    eot = tok.token_to_id(EOT)
    stream = [i for e in tok.encode_batch([t + EOT for t in train_texts]) for i in e.ids]
    train_w = windows(torch.tensor(stream, dtype=torch.long), a.seq_len)
    held = [i for e in tok.encode_batch([t + EOT for t in documents("heldout", a.eval_docs)]) for i in e.ids]
    held_w = windows(torch.tensor(held, dtype=torch.long), a.seq_len)
    corpus_chars = sum(map(len, train_texts))
    del train_texts, stream
    vocab = 64 * math.ceil(tok.get_vocab_size() / 64)  # padded, as Qwen does, for even matmul shapes
    data = dict(event="data", train_chars=corpus_chars, train_tokens=train_w.numel(),
                train_windows=len(train_w), heldout_tokens=held_w.numel(), tokenizer_vocab=tok.get_vocab_size(),
                model_vocab=vocab, seconds=round(time.time() - t0, 1))
    log(logf, **data)

    cfg = model_config(vocab, a)
    model = Qwen3ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(logf, event="model", params=n_params)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=a.weight_decay),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    # Deterministic data order: a seeded permutation of the windows per epoch.
    gen = torch.Generator().manual_seed(a.seed)
    order, cursor, epoch = torch.randperm(len(train_w), generator=gen), 0, 0

    def next_batch():
        nonlocal order, cursor, epoch
        if cursor + a.batch > len(order):
            order, cursor, epoch = torch.randperm(len(train_w), generator=gen), 0, epoch + 1
        idx = order[cursor: cursor + a.batch]
        cursor += a.batch
        return train_w[idx]

    # The cosine schedule ends at whichever comes first, --steps or --budget-min: on a
    # shared, busy CPU the step rate swings by 3x, so a step count fixed in advance would
    # either overrun the budget or stop mid-schedule. After warmup, progress is the larger
    # of the step fraction and the wall-clock fraction; with --budget-min 0 it is step-based
    # and the run is deterministic.
    train_start = time.time()
    budget_s = a.budget_min * 60 or float("inf")
    history, step, ema, progress, warm_t = [], 0, None, 0.0, None
    model.train()
    while progress < 1.0:
        if step == a.warmup:
            warm_t = time.time() - train_start
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            by_time = (time.time() - train_start - warm_t) / max(1.0, budget_s - warm_t)
            progress = min(1.0, max((step - a.warmup) / max(1, a.steps - a.warmup), by_time))
            lr = cosine(progress, a.lr, a.lr * a.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        w = next_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(input_ids=w[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        elapsed = time.time() - train_start
        last = progress >= 1.0 or step >= a.steps
        if step % a.log_every == 0 or last:
            rec = dict(event="train", step=step, loss=round(loss.item(), 4), loss_ema=round(ema, 4),
                       lr=round(lr, 6), progress=round(progress, 4), epoch=epoch, elapsed_s=round(elapsed, 1),
                       tok_per_s=round(step * a.batch * a.seq_len / elapsed))
            history.append(rec)
            log(logf, **rec)
        if step % a.eval_every == 0 or last:
            hl = mean_loss(model, held_w)
            rec = dict(event="eval", step=step, heldout_loss=round(hl, 4), heldout_ppl=round(math.exp(hl), 3),
                       elapsed_s=round(time.time() - train_start, 1))
            history.append(rec)
            log(logf, **rec)
        if last:
            break

    train_seconds = time.time() - train_start
    # Final train loss: mean over a fixed slice of training windows (same method as held-out).
    final_train = mean_loss(model, train_w[:len(held_w)])
    final_held = mean_loss(model, held_w)
    summary = dict(event="done", steps=step, max_steps=a.steps, train_seconds=round(train_seconds, 1),
                   tokens_seen=step * a.batch * a.seq_len, epochs=round(step * a.batch / len(train_w), 2),
                   train_loss=round(final_train, 4), train_ppl=round(math.exp(final_train), 3),
                   heldout_loss=round(final_held, 4), heldout_ppl=round(math.exp(final_held), 3),
                   params=n_params, threads=a.threads, args=vars(a))
    log(logf, **summary)

    model.config.dtype = torch.float32
    model.generation_config = GenerationConfig(
        bos_token_id=eot, eos_token_id=[eot, tok.token_to_id(IM_END)], pad_token_id=eot)
    model.save_pretrained(a.out)
    add_legacy_config_keys(a.out)
    with open(os.path.join(a.out, "training_summary.json"), "w") as fh:
        json.dump(dict(summary, data=data, history=history), fh, indent=1)
    if not a.no_card:
        from .model_card import write_card
        write_card(a.out)


if __name__ == "__main__":
    main()
