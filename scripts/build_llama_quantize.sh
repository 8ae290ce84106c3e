#!/usr/bin/env bash
# llama.cpp's converter source and its `llama-quantize`, built from the llama-cpp-python sdist
# into a cache directory (default ~/.cache/fornax/llama.cpp), for the GGUF tests:
#   FORNAX_LLAMA_CPP_DIR=<cache>/llama_cpp_python-<v>/vendor/llama.cpp
#   FORNAX_LLAMA_QUANTIZE=<cache>/build/bin/llama-quantize
# Idempotent: an existing binary is kept. Prints the two exports last. The build runs under
# `nice -n 19` with -j "${JOBS:-2}"; on a shared 2-CPU box it took about 4.5 minutes.
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${FORNAX_LLAMA_CACHE:-$HOME/.cache/fornax/llama.cpp}
PYTHON=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
SRC=$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp
BIN=$CACHE/build/bin/llama-quantize
mkdir -p "$CACHE"
if [[ ! -f $SRC/convert_hf_to_gguf.py ]]; then
  "$PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE" >&2
  tar xzf "$CACHE/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"
fi
if [[ ! -x $BIN ]]; then
  started=$(date +%s)
  cmake -S "$SRC" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF >&2
  nice -n 19 cmake --build "$CACHE/build" --target llama-quantize -j "${JOBS:-2}" >&2
  echo "built llama-quantize in $(( $(date +%s) - started )) s (physical: this host, cmake --build -j ${JOBS:-2})" >&2
fi
echo "export FORNAX_LLAMA_CPP_DIR=$SRC"
echo "export FORNAX_LLAMA_QUANTIZE=$BIN"
