"""One user script for both engines: tests/test_vllm_same_api.py runs this file as it is on
kvscope, and with only its import line changed on vLLM, then compares what each printed.

    python same_script.py JOB.json OUT.json

JOB: {"model": DIR, "engine": {LLM keyword arguments}, "requests": [{"prompt": ..., "params":
{SamplingParams keyword arguments}}, ...], "chat": [messages] or null}. Every request goes
to one generate() call (one batch); OUT gets every output's fields and the type of each."""
import json
import sys

from kvscope import LLM, SamplingParams


def kind(value) -> str:
    """A value's shape, as names that are the same whichever engine made it."""
    if value is None:
        return "None"
    if isinstance(value, (bool, int, float, str)):
        return type(value).__name__
    if isinstance(value, dict):
        inner = sorted({f"{kind(k)}: {kind(v)}" for k, v in value.items()})
        return "dict[" + " | ".join(inner) + "]"
    if hasattr(value, "__len__") and hasattr(value, "__getitem__"):
        inner = sorted({kind(v) for v in value})
        return "list[" + " | ".join(inner) + "]"
    fields = ("logprob", "rank", "decoded_token")   # vLLM's Logprob
    if all(hasattr(value, f) for f in fields):
        return "Logprob(" + ", ".join(f"{f}: {kind(getattr(value, f))}" for f in fields) + ")"
    return "object"


def logprobs_of(positions):
    if positions is None:
        return None
    return [{str(token): [lp.logprob, lp.rank, lp.decoded_token] for token, lp in position.items()}
            for position in positions]


def describe(out) -> dict:
    request_fields = ("request_id", "prompt", "prompt_token_ids", "num_cached_tokens", "finished")
    choice_fields = ("index", "text", "token_ids", "cumulative_logprob", "logprobs", "finish_reason", "stop_reason")
    choices = [{**{f: getattr(c, f) for f in choice_fields},
                "token_ids": list(c.token_ids), "logprobs": logprobs_of(c.logprobs),
                "finished": c.finished(),
                "kinds": {f: kind(getattr(c, f)) for f in choice_fields}} for c in out.outputs]
    return {**{f: getattr(out, f) for f in request_fields}, "prompt_token_ids": list(out.prompt_token_ids),
            "outputs": choices, "has_metrics": hasattr(out, "metrics"),
            "kinds": {f: kind(getattr(out, f)) for f in request_fields}}


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    llm = LLM(model=job["model"], **job["engine"])
    prompts = [r["prompt"] for r in job["requests"]]
    params = [SamplingParams(**r["params"]) for r in job["requests"]]
    result = {"generate": [describe(o) for o in llm.generate(prompts, params, use_tqdm=False)]}
    if job.get("chat"):
        chat_params = SamplingParams(temperature=0.0, max_tokens=12)
        result["chat"] = [describe(o) for o in llm.chat(job["chat"], chat_params, use_tqdm=False)]
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":   # vLLM's LLM starts its engine in a new process: it must be created here
    main()
