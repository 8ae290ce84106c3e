#!/usr/bin/env bash
# Generates Python protobuf and gRPC code for every proto under proto/ into OUT.
set -euo pipefail
PY=${1:?python}
OUT=${2:?output dir}
mkdir -p "$OUT"
mapfile -t files < <(cd proto && find fornax -name '*.proto' | sort)
"$PY" -m grpc_tools.protoc -Iproto --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" "${files[@]/#/proto/}"
# Every generated directory is a regular package.
find "$OUT/fornax" -type d -exec touch {}/__init__.py \;
