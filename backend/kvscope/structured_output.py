"""Structured outputs, as in vLLM (beside the engine core, not in it): a grammar compiled once per
distinct request (xgrammar), and each sequence's matcher writes a bitmask of the tokens allowed
next; the model runner gives the others -inf before sampling, the scheduler ends a request whose
grammar is complete."""
from __future__ import annotations

import json
from functools import lru_cache

import torch

from kvscope.sampling_params import StructuredOutputsParams


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured outputs need the xgrammar package (pip install xgrammar)") from None
    return xgrammar


class GrammarMatcher:
    """One sequence's position in its grammar."""

    def __init__(self, compiled, vocab_size: int):
        self.matcher = _xgrammar().GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.last_bitmask: torch.Tensor | None = None   # the latest mask, for the sampling view

    def accept(self, token_id: int) -> bool:
        """Advance past `token_id`; True once the grammar is complete."""
        if not self.matcher.accept_token(token_id):
            # cannot happen for a token drawn under the mask; says so loudly if it does
            raise RuntimeError(f"token {token_id} is outside the grammar")
        return self.matcher.is_terminated()


class StructuredOutputManager:
    """Compiles grammars (cached, one compiler per engine) and makes each sequence's matcher."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], disable_any_whitespace: bool = True):
        if tokenizer is None:
            raise ValueError("structured outputs need the checkpoint's tokenizer")
        xgr = _xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_token_ids or None)
        self.compiler, self.vocab_size = xgr.GrammarCompiler(info), vocab_size
        self.disable_any_whitespace = disable_any_whitespace   # the engine's StructuredOutputsConfig
        self.compile = lru_cache(maxsize=64)(self._compile)

    def _compile(self, key: tuple):
        kind, spec = key
        try:
            if kind == "json":
                schema, disable_any_whitespace = spec
                # compact when the engine or the request says so, as vLLM asks xgrammar for it
                compact = self.disable_any_whitespace or disable_any_whitespace
                return self.compiler.compile_json_schema(schema, any_whitespace=not compact,
                                                         separators=(",", ":") if compact else None)
            if kind == "regex":
                return self.compiler.compile_regex(spec)
            return self.compiler.compile_grammar(spec)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"invalid {kind} for structured outputs: {str(exc).splitlines()[0][:300]}") from None

    def matcher_for(self, params: StructuredOutputsParams) -> GrammarMatcher:
        """A fresh matcher; raises ValueError with the reason for a bad schema, regex or grammar."""
        return GrammarMatcher(self.compile(grammar_key(params)), self.vocab_size)


def apply_masks(logits: torch.Tensor, matchers: list[GrammarMatcher | None]) -> None:
    """In place: rows with a matcher keep only what its grammar allows; each matcher keeps its mask."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    xgr = _xgrammar()
    vocab_size = matchers[rows[0]].vocab_size
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    for i in rows:
        matchers[i].matcher.fill_next_token_bitmask(bitmask, i)
        matchers[i].last_bitmask = bitmask[i]
    width = logits.shape[1]
    if width > vocab_size:    # rows of padding in the LM head are never a token
        logits[rows, vocab_size:] = float("-inf")
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=min(width, vocab_size), indices=rows)


def grammar_key(params: StructuredOutputsParams) -> tuple:
    """What identifies a grammar, hashable for the compile cache."""
    if params.json is not None:
        # a schema given as a dict keeps its property order: that is the output's order
        schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
        return "json", (schema, params.disable_any_whitespace)
    if params.json_object:   # any JSON object: the schema that says only that (as vLLM)
        return "json", ('{"type": "object"}', params.disable_any_whitespace)
    if params.regex is not None:
        return "regex", params.regex
    if params.choice is not None:   # an EBNF grammar whose language is exactly the choices
        return "grammar", "root ::= " + " | ".join(json.dumps(c) for c in params.choice)
    return "grammar", params.grammar
