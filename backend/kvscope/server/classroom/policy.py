"""The one policy for every way in: who instructs, what prompts and numbers may be, how often; refusals name flags."""
from __future__ import annotations

import ipaddress
import math
import re
import secrets

from kvscope.server.config import ServerConfig
from kvscope.server.classroom.ratelimit import TokenBucket, per_minute
from kvscope.server.errors import CommandError

PROMPT_FORMS = ("prompt", "messages", "prompt_token_ids")
MAX_TOP_K = 1 << 20                  # far above any vocabulary, far below what a tensor can hold
MAX_N = 16                           # parallel samples per prompt: each choice is a sequence in the batch
MAX_SEED = 2**63 - 1 - MAX_N         # choice i seeds with seed + i; torch takes a signed 64-bit integer
MAX_TEMPERATURE = 100.0
MAX_CALLERS = 10_000                 # remembered buckets; the oldest are forgotten first
LEARNER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def is_token(given: str | None, config: ServerConfig) -> bool:
    return bool(given) and secrets.compare_digest(given.encode("utf-8", "surrogatepass"),
                                                  config.instructor_token.encode())


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def message_texts(messages: list[dict]) -> list[str]:
    texts = []
    for m in messages:
        content = m.get("content")
        texts.extend([content] if isinstance(content, str) else [p.get("text", "") for p in content or []])
    return texts


def one_prompt_form(body: dict) -> str:
    forms = [k for k in PROMPT_FORMS if k in body]
    if len(forms) != 1:
        raise CommandError("invalid_field", "give exactly one of prompt, messages or prompt_token_ids")
    return forms[0]


def check_sampling_numbers(raw: dict, prefix: str = "") -> None:
    """Bounds on the numbers that reach tensors and generators, whatever the route's schema says."""
    for name, low, high in (("top_k", -1, MAX_TOP_K), ("seed", 0, MAX_SEED), ("n", 1, MAX_N),
                            ("temperature", 0, MAX_TEMPERATURE), ("top_p", 0, 1), ("min_p", 0, 1),
                            ("max_tokens", 1, 1 << 31), ("max_completion_tokens", 1, 1 << 31),
                            ("logprobs", 0, 20), ("top_logprobs", 0, 20)):
        value = raw.get(name)
        if value is None or (name == "logprobs" and isinstance(value, bool)):   # chat's logprobs is a switch
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
            raise CommandError("invalid_field", f"{prefix}{name}: {value!r} is out of range; "
                                                f"it must be between {low:g} and {high:g}")


def learner_id(raw: str | None) -> str | None:
    """The browser's learner id (client.js keeps a random one in localStorage), if well-formed."""
    return raw if raw is not None and LEARNER_ID.match(raw) else None


def bucket_for(buckets: dict[str, TokenBucket], key: str, make) -> TokenBucket:
    bucket = buckets.get(key)
    if bucket is None:
        if len(buckets) >= MAX_CALLERS:
            buckets.pop(next(iter(buckets)))
        bucket = buckets[key] = make()
    return bucket


class Policy:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.rest_buckets: dict[str, TokenBucket] = {}
        self.submit_buckets: dict[str, TokenBucket] = {}   # per learner id, shared by its tabs
        self.class_bucket: TokenBucket | None = None

    def learner_submits(self, learner: str | None) -> TokenBucket:
        """A WebSocket learner's submit allowance: per learner id when the page sends one."""
        make = lambda: per_minute(self.limits.submits_per_minute)   # noqa: E731
        return make() if learner is None else bucket_for(self.submit_buckets, learner, make)

    @property
    def limits(self):
        return self.config.limits

    def check_prompt_text(self, text: str, instructor: bool, what: str = "the prompt") -> None:
        """Characters before tokens: a length the tokenizer never sees, and no lone surrogate."""
        if not instructor and len(text) > self.limits.max_prompt_chars:
            raise CommandError("prompt_too_long", f"{what} has {len(text)} characters; without the instructor token it "
                                                  f"may have at most {self.limits.max_prompt_chars} "
                                                  f"(kvscope serve --learner-max-prompt-chars)")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CommandError("invalid_field", f"{what}: character {exc.start} is a lone surrogate "
                                                f"({text[exc.start]!a}), not valid Unicode text") from None

    def check_prompt_tokens(self, ids: list[int], instructor: bool) -> None:
        if not instructor and len(ids) > self.limits.max_prompt_tokens:
            raise CommandError("prompt_too_long", f"the prompt has {len(ids)} tokens; without the instructor token "
                                                  f"a prompt may have at most {self.limits.max_prompt_tokens} "
                                                  f"(kvscope serve --learner-max-prompt-tokens)")

    def max_tokens(self, instructor: bool, engine_max: int) -> int:
        return engine_max if instructor else self.limits.max_tokens

    def rest_caller(self, headers, client_host: str | None, learner: str | None = None) -> tuple[bool, str | None]:
        """(instructor?, the key of the caller's rate bucket, None when not limited)."""
        if is_token(headers.get("authorization", "").removeprefix("Bearer ").strip(), self.config):
            return True, None
        if is_loopback(client_host) and not self.config.limit_loopback:
            return False, None
        learner = learner_id(learner)
        return False, f"learner:{learner}" if learner else f"addr:{client_host}"

    def admit_rest(self, key: str | None, cost: int = 1) -> None:
        """One bucket per caller for /api and /v1, and one for the class; a call with k prompts costs k."""
        if key is None:
            return
        rate, class_rate = self.config.rest_requests_per_minute, self.config.rest_class_requests_per_minute
        if class_rate > 0:
            self.class_bucket = self.class_bucket or per_minute(class_rate)
            take(self.class_bucket, cost, f"the class together may send {class_rate:g} REST/OpenAI prompts a "
                                          f"minute (kvscope serve --rest-class-requests-per-minute)")
        if rate > 0:
            bucket = bucket_for(self.rest_buckets, key, lambda: per_minute(rate))
            take(bucket, cost, f"at most {rate:g} prompts a minute (bursts of {bucket.burst:g}) per caller without "
                               f"the instructor token (kvscope serve --rest-requests-per-minute)")


def take(bucket: TokenBucket, cost: int, limit: str) -> None:
    if not bucket.take(cost):
        wait = max(1, math.ceil(bucket.retry_after(cost))) if cost <= bucket.burst else None
        when = f"retry in {wait} s" if wait is not None else f"send at most {bucket.burst:g} prompts in one call"
        raise RateLimited(f"{limit}; {when}", wait)


class RateLimited(CommandError):
    def __init__(self, message: str, retry_after: int | None):
        super().__init__("rate_limited", message)
        self.retry_after = retry_after

    def headers(self) -> dict:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
