#!/usr/bin/env bash
# The Python that tests/cli/hf_oracle.sh and the model docs use as the
# oracle: torch, transformers, tokenizers, safetensors and numpy from PyPI in
# build/hf-venv (about 5.6 GB with torch's CUDA libraries; made once, kept
# out of the default build). Usage: bench/hf_venv.sh [DIR]
set -euo pipefail
dir=${1:-"$(cd "$(dirname "$0")/.." && pwd)/build/hf-venv"}
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
if "$dir/bin/python3" -c 'import torch, transformers, tokenizers, safetensors, numpy' 2>/dev/null; then
  echo "hf_venv: $dir already has torch and transformers"
  exit 0
fi
[ -x "$dir/bin/python3" ] || "$py" -m venv "$dir"
"$dir/bin/pip" install --quiet torch transformers tokenizers safetensors numpy
"$dir/bin/python3" -c 'import torch, transformers; print("hf_venv: torch", torch.__version__, "transformers", transformers.__version__, "in", "'"$dir"'")'
