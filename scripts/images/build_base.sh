#!/usr/bin/env bash
# Builds the Debian bookworm base image (python3.11) with debootstrap, so that no image is
# pulled from any registry. The mirror is the host's own apt mirror unless
# FORNAX_DEBIAN_MIRROR says otherwise.
set -euo pipefail

BASE_IMAGE=${FORNAX_BASE_IMAGE:-localhost/fornax-base:bookworm}
SUITE=bookworm

host_mirror() {
  local src
  for src in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    [[ -f $src ]] || continue
    awk '/^URIs:/ {print $2; exit} /^deb / && $0 !~ /security/ {print $2; exit}' "$src"
    return
  done
}

here=$(cd "$(dirname "$0")" && pwd)
# The base is rebuilt when this script or the wheel installer it bakes in changes.
recipe=$(cat "$here/build_base.sh" "$here/install_wheels.sh" | sha256sum | cut -c1-16)
current=$(buildah inspect --type image --format '{{index .ImageAnnotations "dev.fornax.base.recipe"}}' \
  "$BASE_IMAGE" 2>/dev/null || true)
if [[ $current == "$recipe" && ${FORNAX_REBUILD_BASE:-0} != 1 ]]; then
  echo "build_base: $BASE_IMAGE is current (FORNAX_REBUILD_BASE=1 rebuilds it)"
  exit 0
fi

MIRROR=${FORNAX_DEBIAN_MIRROR:-$(host_mirror)}
[[ -n $MIRROR ]] || { echo "build_base: no Debian mirror found; set FORNAX_DEBIAN_MIRROR" >&2; exit 2; }

work=$(mktemp -d)
ctr=""
cleanup() {
  [[ -n $ctr ]] && buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# python3-venv brings ensurepip, used by the builder stage to make the service venv.
debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$work/rootfs" "$MIRROR"

# Package lists, docs and locales are never needed at run time.
rm -rf "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/cache/apt/* \
  "$work"/rootfs/usr/share/doc/* "$work"/rootfs/usr/share/man/* "$work"/rootfs/usr/share/info/*
tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
rm -rf "$work/rootfs"

ctr=$(buildah from scratch)
buildah add "$ctr" "$work/rootfs.tar" /
buildah copy --chmod 0755 "$ctr" "$here/install_wheels.sh" /usr/local/bin/fornax-install-wheels
# What every service container shares (service configuration contract: containers bind
# 0.0.0.0, gRPC on 50051, metrics on 9464); HOME is writable under a read-only root.
buildah config --env LANG=C.UTF-8 --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
  --env PATH=/opt/fornax/bin:/usr/local/bin:/usr/bin:/bin --env HOME=/tmp \
  --env FORNAX_HOST=0.0.0.0 --env FORNAX_GRPC_PORT=50051 --env FORNAX_METRICS_PORT=9464 \
  --workingdir /tmp --cmd /bin/bash \
  --label org.opencontainers.image.title=fornax-base --annotation "dev.fornax.base.recipe=$recipe" "$ctr"
buildah commit --rm "$ctr" "$BASE_IMAGE"
ctr=""
echo "build_base: built $BASE_IMAGE"
