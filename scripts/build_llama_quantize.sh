#!/usr/bin/env bash
# llama.cpp's converter source and its `llama-quantize`, built from the llama-cpp-python sdist
# into a cache directory (default ~/.cache/fornax/llama.cpp), for the GGUF tests:
#   FORNAX_LLAMA_CPP_DIR=<cache>/llama_cpp_python-<v>/vendor/llama.cpp
#   FORNAX_LLAMA_QUANTIZE=<cache>/build/bin/llama-quantize
# With `--server` it also builds `llama-server` in the same build tree, for
# `fornax bench serve --peer llama.cpp` and the real-server tests:
#   FORNAX_LLAMA_SERVER=<cache>/build/bin/llama-server
# Idempotent: an existing binary is kept. Prints the exports last. The build runs under
# `nice -n 19` with -j "${JOBS:-2}"; on a shared 2-CPU box llama-quantize took about 4.5 minutes.
set -euo pipefail
WITH_SERVER=OFF
if [[ ${1:-} == --server ]]; then WITH_SERVER=ON; elif [[ -n ${1:-} ]]; then
  echo "usage: $0 [--server]" >&2; exit 2
fi
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${FORNAX_LLAMA_CACHE:-$HOME/.cache/fornax/llama.cpp}
PYTHON=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
SRC=$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$CACHE/build
BIN=$BUILD/bin/llama-quantize
SERVER_BIN=$BUILD/bin/llama-server
mkdir -p "$CACHE"
if [[ ! -f $SRC/convert_hf_to_gguf.py ]]; then
  "$PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE" >&2
  tar xzf "$CACHE/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"
fi

# One configuration for both targets. LLAMA_BUILD_SERVER only adds the server's subdirectories, so
# turning it on in an existing tree reuses the objects llama-quantize already built. The prebuilt
# web UI (a download) and HTTPS stay off: the bench speaks HTTP on loopback.
configure() {
  nice -n 19 cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER="$1" -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF >&2
}

build() {  # build TARGET
  local started
  started=$(date +%s)
  nice -n 19 cmake --build "$BUILD" --target "$1" -j "${JOBS:-2}" >&2
  echo "built $1 in $(( $(date +%s) - started )) s (physical: this host, cmake --build -j ${JOBS:-2})" >&2
}

if [[ ! -x $BIN ]]; then
  configure "$WITH_SERVER"
  build llama-quantize
fi
if [[ $WITH_SERVER == ON && ! -x $SERVER_BIN ]]; then
  configure ON
  build llama-server
fi
echo "export FORNAX_LLAMA_CPP_DIR=$SRC"
echo "export FORNAX_LLAMA_QUANTIZE=$BIN"
if [[ -x $SERVER_BIN ]]; then echo "export FORNAX_LLAMA_SERVER=$SERVER_BIN"; fi
