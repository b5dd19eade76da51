"""`kvscope bench ...`: benchmarks that print figures. commands.py wires the subcommands and
runs throughput, latency and parallel (against transformers and, with --against vllm,
vLLM in its own process: vllm_peer.py, vllm_worker.py); spec.py, attention.py, tp.py and
serve.py (a class's load on a running server) are one subcommand each; shapes.py names the
random-weight model shapes and cpu_ceilings.py measures the machine's limits."""
