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

python3 -m pytest -q "$@"
