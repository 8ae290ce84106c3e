#!/usr/bin/env bash
# System packages the test suite needs beyond Python; idempotent.
set -euo pipefail
need_apt=()
command -v make >/dev/null || need_apt+=(make)
command -v prometheus >/dev/null || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
