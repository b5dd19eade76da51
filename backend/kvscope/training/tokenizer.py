"""Byte-level BPE tokenizer for kvscope-mini, trained with Hugging Face `tokenizers`.

Byte-level means every UTF-8 byte is in the base alphabet, so any text (emoji, accents,
code) round-trips; words the corpus never saw fall apart into byte pieces, which the
tokenizer widget shows. The special tokens and chat template follow Qwen's conventions.
"""
from __future__ import annotations

import json
import os
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from .corpus import EOT, IM_END, IM_START

SPECIAL_TOKENS = [EOT, IM_START, IM_END]  # ids 0, 1, 2
# Qwen-style ChatML; corpus._turn writes the same layout.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    # The markers are special tokens, not text to learn merges from.
    def strip(stream):
        for t in stream:
            for s in SPECIAL_TOKENS:
                t = t.replace(s, "\n")
            yield t

    tok.train_from_iterator(strip(texts), trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: str, model_max_length: int) -> None:
    """Write tokenizer.json + tokenizer_config.json that AutoTokenizer loads as a fast tokenizer."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    added = {str(tok.token_to_id(s)): dict(content=s, lstrip=False, normalized=False, rstrip=False,
                                           single_word=False, special=True) for s in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": EOT,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
