"""Per-request generation settings, validated up front so bad input fails with a clear message.
Names and defaults are vLLM's (max_tokens 16, top_k 0 or -1 for no filter), so a script
written for vllm.SamplingParams runs unchanged."""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class StructuredOutputsParams:
    """vLLM's constraint on a request's output: exactly one of a JSON schema (a dict or its
    text), any JSON object, a regex the whole output must match, a list of choices, or an
    EBNF grammar (engine/sampler.py applies it)."""
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # JSON without free whitespace even where the engine allows it (its
    # StructuredOutputsConfig.disable_any_whitespace, on by default in kvscope)
    disable_any_whitespace: bool = False

    def __post_init__(self):
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("structured outputs take exactly one of json, regex, choice, grammar, "
                             f"json_object; got {given or 'none'}")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured outputs: choice must be a non-empty list of non-empty strings")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0              # 0 or -1: no top-k filter
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None     # same seed => same output, whatever else is in the batch
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n alternatives per generated token
    n: int = 1                  # parallel samples of one prompt; choice i draws with seed + i
    structured_outputs: StructuredOutputsParams | None = None   # a grammar the output must follow

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or self.top_k < 0:
            self.top_k = 0
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self.validate()

    def validate(self) -> None:
        checks = [
            (self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (isinstance(self.top_k, int) and self.top_k < 2**31,   # it becomes an int tensor in the sampler
             f"top_k must be an integer below 2**31, got {self.top_k!r}"),
            (isinstance(self.max_tokens, int) and self.max_tokens >= 1,
             f"max_tokens must be an integer >= 1, got {self.max_tokens!r}"),
            (self.logprobs is None or 0 <= self.logprobs <= 20,
             f"logprobs must be between 0 and 20, got {self.logprobs}"),
            (self.seed is None or isinstance(self.seed, int) and -(2**63) <= self.seed < 2**63 - 64,
             f"seed must be a 64-bit signed integer, got {self.seed!r}"),   # torch.Generator's range
            (isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings"),
            (all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "stop_token_ids must be non-negative integers"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def for_choice(self, index: int) -> "SamplingParams":
        """The settings of choice `index` of a parallel-sampling request: one sample each,
        seeded seed + index so every choice is reproducible on its own."""
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
