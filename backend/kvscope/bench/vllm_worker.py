"""vLLM's side of `kvscope bench ... --against vllm`, run by vLLM's own Python (kvscope need
not be installed there): it builds one vllm.LLM from the JSON on its first stdin line, then
answers one JSON command per line on stdout, so the bench can alternate the two engines.

    {"op": "throughput", "prompts": [[ids], ...], "outputs": [n, ...]} -> {"elapsed", "generated"}
    {"op": "latency", "prompt": [ids], "n": N}                         -> {"ttft", "tpot"}
    {"op": "quit"}

vLLM's log goes to stderr; stdout carries only the answers."""
import json
import os
import sys
import time


def greedy(max_tokens: int):
    from vllm import SamplingParams
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)


def throughput(llm, prompts, outputs) -> dict:
    llm.reset_prefix_cache()   # each run computes its prompts, as kvscope's does
    requests = [{"prompt_token_ids": p} for p in prompts]
    start = time.perf_counter()
    done = llm.generate(requests, [greedy(n) for n in outputs], use_tqdm=False)
    elapsed = time.perf_counter() - start
    return {"elapsed": elapsed, "generated": sum(len(o.outputs[0].token_ids) for o in done)}


def latency(llm, prompt, n) -> dict:
    """Batch 1: one token (time to first token), then n; the difference is n - 1 decode steps."""
    def timed(max_tokens):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], greedy(max_tokens), use_tqdm=False)
        return time.perf_counter() - start
    ttft = timed(1)
    return {"ttft": ttft, "tpot": (timed(n) - ttft) / max(1, n - 1)}


def main():
    # answers go to a copy of stdout; fd 1 itself becomes stderr, so that whatever vLLM and
    # the engine process it spawns print stays off the answer channel
    stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from vllm import LLM
    setup = json.loads(sys.stdin.readline())
    llm = LLM(**setup)
    llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], greedy(4), use_tqdm=False)   # warm-up
    import vllm
    stdout.write(json.dumps({"ready": True, "version": vllm.__version__}) + "\n")
    stdout.flush()
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        if command["op"] == "throughput":
            answer = throughput(llm, command["prompts"], command["outputs"])
        else:
            answer = latency(llm, command["prompt"], command["n"])
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()


if __name__ == "__main__":   # vLLM starts its engine core in a new process
    main()
