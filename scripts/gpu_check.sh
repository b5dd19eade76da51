#!/usr/bin/env bash
# The GPU checks, in one go, on a bare CUDA machine with no internet (PyTorch, Triton and
# transformers installed there; no FastAPI or uvicorn): install kvscope without fetching
# anything, then run the GPU tests, the Triton kernel's tests compiled for the real GPU, and
# the attention, latency, throughput and watch benchmarks, and the class load test where its
# packages are there. Each stage has its own timeout, and the whole stays within TOTAL_SECONDS
# (8 minutes): a stage that would not fit is skipped and says so. Every log goes to one
# folder, "$OUT" (default ./gpu_out); summary.txt lists each stage's exit status and time.
#
#   bash scripts/gpu_check.sh            # from the repository's root
#
# Wheels the machine lacks can travel in .whl/ (see DEVELOPERS.md): they are installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_out}"
TOTAL_SECONDS="${TOTAL_SECONDS:-480}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
START=$(date +%s)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"

# stage NAME LIMIT_SECONDS COMMAND...: runs COMMAND under `timeout`, its output in $OUT/NAME.log
stage() {
    local name=$1 limit=$2
    shift 2
    local left=$((TOTAL_SECONDS - ($(date +%s) - START)))
    if ((left < 15)); then
        echo "$name: skipped (the ${TOTAL_SECONDS} s budget is spent)" | tee -a "$SUMMARY"
        return
    fi
    ((limit > left)) && limit=$left
    local t0=$(date +%s)
    echo "== $name (at most ${limit} s): $*"
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local why=""
    ((rc == 124 || rc == 137)) && why=" (timed out)"
    echo "$name: exit $rc$why in $(($(date +%s) - t0)) s" | tee -a "$SUMMARY"
    tail -n 5 "$OUT/$name.log"
}

skip() { echo "$1: skipped ($2)" | tee -a "$SUMMARY"; }

install() {
    if compgen -G ".whl/*.whl" > /dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/kvscope-wheels .whl/*.whl \
            || return 1
        export PYTHONPATH="/tmp/kvscope-wheels${PYTHONPATH:+:$PYTHONPATH}"
    fi
    # no build isolation: it would fetch setuptools, and there is no internet. kvscope is pure
    # Python (its C source is built at run time), so where pip cannot build it, the tree will do.
    if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .; then
        echo "pip could not install kvscope: running it from $PWD/backend instead"
        export PYTHONPATH="$PWD/backend${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$PY" -c "import kvscope, torch, triton; print(kvscope.__file__, torch.__version__, triton.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO CUDA DEVICE')"
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv || true
    "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} > "$OUT/machine.log" 2>&1
cat "$OUT/machine.log"

# pip's output lands in install.log; the functions above run in this shell, so PYTHONPATH stays
echo "== install"
if install > "$OUT/install.log" 2>&1; then
    echo "install: ok, $(tail -n 1 "$OUT/install.log")" | tee -a "$SUMMARY"
else
    echo "install: FAILED (see install.log)" | tee -a "$SUMMARY"
    tail -n 20 "$OUT/install.log"
    exit 1
fi

MODEL=shape:qwen3-0.6b
stage test_gpu 150 "$PY" -m pytest -q -x tests/test_gpu.py
stage test_triton_kernel 90 env KVSCOPE_TRITON_ON_GPU=1 "$PY" -m pytest -q -x \
    tests/test_triton_kernel.py tests/test_attention_context.py
stage bench_attention 60 "$PY" -m kvscope.cli bench attention --device cuda --batch 1 256 --repeats 3
stage bench_latency 60 "$PY" -m kvscope.cli bench latency --model "$MODEL" --device cuda --dtype bfloat16 \
    --load-format dummy --no-hf --input-len 512 --output-len 128 --repeats 1
# nano-vllm's workload: 256 requests, prompts and outputs of 100-1024 tokens
stage bench_throughput 150 "$PY" -m kvscope.cli bench throughput --model "$MODEL" --device cuda --dtype bfloat16 \
    --load-format dummy --no-hf --num-requests 256 --input-len 100 1024 --output-len 100 1024
if "$PY" -m kvscope.cli bench throughput --help 2>/dev/null | grep -q -- "--watchers"; then
    # off, listen, watch-1 and watch-32 alternated in one run, so their ratios share the card's state
    stage bench_watch 120 "$PY" -m kvscope.cli bench throughput --model "$MODEL" --device cuda \
        --dtype bfloat16 --load-format dummy --no-hf --num-requests 64 --input-len 100 200 --output-len 64 128 \
        --instrument watch --watchers 1 32
else
    skip bench_watch "this kvscope's bench throughput has no --watchers"
fi
if "$PY" -c "import fastapi, uvicorn, websockets, httpx" 2> /dev/null; then
    stage bench_serve 75 "$PY" -m kvscope.cli bench serve --viewers 200 --concurrency 32 --duration 30 --timeout 60
else
    skip bench_serve "fastapi, uvicorn, websockets or httpx missing: carry their wheels in .whl/"
fi
echo "total: $(($(date +%s) - START)) s" | tee -a "$SUMMARY"
