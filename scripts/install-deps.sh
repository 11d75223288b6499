#!/usr/bin/env bash
# Installs what dsc needs to build and test on Debian 12 (run as root or with sudo).
# The one list of packages: the README's commands, CI (.ci/run -> scripts/test.sh)
# and scripts/fresh-check.sh all come through here, and the fresh check proves
# on a minimal Debian that nothing is missing.
#
#   scripts/install-deps.sh               the Debian packages
#   scripts/install-deps.sh --venv DIR    also a Python venv in DIR with the PyPI
#                                         packages the tests use (scripts/test.sh)
#   scripts/install-deps.sh --hf-venv DIR also a venv in DIR with transformers
#                                         over Debian's torch (tests/cli/hf_oracle.sh)
set -euo pipefail
venv=""
hf_venv=""
while [ $# -gt 0 ]; do
  case $1 in
  --venv) venv=${2:?--venv needs a directory}; shift ;;
  --hf-venv) hf_venv=${2:?--hf-venv needs a directory}; shift ;;
  *) echo "install-deps: unknown argument '$1'" >&2; exit 1 ;;
  esac
  shift
done

pkgs=(
  # the build: compilers, CMake + Ninja, the frontend's generators
  build-essential cmake ninja-build flex bison
  # libraries CMake finds: cJSON (safetensors headers, checkpoint state),
  # PCRE2 and utf8proc (the tokenizers' regexes and Unicode normalization),
  # LLVM + oneDNN (the CPU backend), Open MPI (the MPI backend, mpirun for
  # the tests and dsc launch), GoogleTest (unit tests), libmicrohttpd (dsc
  # serve's HTTP server)
  libcjson-dev libpcre2-dev libutf8proc-dev llvm-14-dev libdnnl-dev libopenmpi-dev openmpi-bin libgtest-dev
  libmicrohttpd-dev
  # the fuzzers: clang with libFuzzer
  clang libclang-rt-14-dev
  # the tests' checks: python3 with numpy (Debian's), venv + certificates for
  # the PyPI packages Debian lacks (safetensors, tokenizers: below)
  python3 python3-numpy python3-venv ca-certificates
  # an HTTP client for dsc serve (the README's example, tests/cli/serve.sh)
  curl
  # the oracle of the Hugging Face import and export (tests/cli/hf_oracle.sh):
  # Debian's CPU-only torch (48 MB to download; PyPI's pulls several GB of
  # CUDA libraries), transformers over it in the --hf-venv below
  python3-torch
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python safetensors package (not in Debian 12) for the test that reads
# dsc's files with an independent reader, and tokenizers (Hugging Face's,
# not in Debian 12), the oracle of dsc's tokenizer.json reader
# (tests/cli/tokenizer_oracle.sh), and the openai client (tests/cli/serve.sh:
# dsc serve answers what it parses). Debian's pip refuses to install
# into the system Python, hence a venv, made from Debian's python3 so that it
# sees Debian's numpy (another python3 first on PATH, such as pyenv's, sees
# neither: then numpy comes from PyPI too).
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
make_venv() { # dir
  if [ ! -x "$1/bin/python3" ]; then
    echo "install-deps: making a Python venv in $1 ($py)"
    "$py" -m venv --system-site-packages "$1"
  fi
}
if [ -n "$venv" ]; then
  if python3 -c 'import safetensors, tokenizers, numpy, openai' 2>/dev/null; then
    echo "install-deps: python3 already has safetensors, tokenizers, numpy and openai (no venv needed)"
  else
    make_venv "$venv"
    want=()
    "$venv/bin/python3" -c 'import safetensors' 2>/dev/null || want+=(safetensors)
    "$venv/bin/python3" -c 'import tokenizers' 2>/dev/null || want+=(tokenizers)
    "$venv/bin/python3" -c 'import numpy' 2>/dev/null || want+=(numpy)
    "$venv/bin/python3" -c 'import openai' 2>/dev/null || want+=(openai)
    if [ ${#want[@]} -gt 0 ]; then
      echo "install-deps: installing ${want[*]} from PyPI into $venv"
      "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "${want[@]}"
    fi
  fi
fi

# transformers for the oracle over Debian's torch 1.13: 4.46 is the last
# release that accepts a torch before 2.0 (later ones disable PyTorch at
# import). Its own venv, since it pins tokenizers below the release that
# tokenizer_oracle.sh checks against.
[ -n "$hf_venv" ] || exit 0
hf=transformers==4.46.3
make_venv "$hf_venv"
if ! "$hf_venv/bin/python3" -c 'import torch, transformers, safetensors
assert transformers.__version__ == "'"${hf#*==}"'"' 2>/dev/null; then
  echo "install-deps: installing $hf from PyPI into $hf_venv"
  "$hf_venv/bin/python3" -m pip install --quiet --disable-pip-version-check "$hf" safetensors
fi
