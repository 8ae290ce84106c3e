#!/usr/bin/env bash
# Builds one image per service: localhost/fornax-<service>:<version>.
#   scripts/images/build.sh [service ...]     (default: all five)
#   COMPILE_CACHE_CHECKPOINT=DIR bakes that checkpoint's MAX graphs into the stage worker image.
# The base comes from debootstrap (build_base.sh). Wheels are fetched on the host into a
# per-service wheelhouse; inside the build, RUN steps have no network at all.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PY:-.venv/bin/python}
ALL_SERVICES=(planner evidence_registry artifact_builder orchestrator stage_worker)
SERVICES=("$@")
[[ ${#SERVICES[@]} -gt 0 ]] || SERVICES=("${ALL_SERVICES[@]}")
BASE_IMAGE=${FORNAX_BASE_IMAGE:-localhost/fornax-base:bookworm}
OUT=build/images
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')

for tool in buildah debootstrap unshare; do
  command -v "$tool" >/dev/null || { echo "images: $tool is missing (apt-get install buildah debootstrap)" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "images: debootstrap and chroot builds need root" >&2; exit 2; }

export FORNAX_BASE_IMAGE=$BASE_IMAGE
bash scripts/images/build_base.sh

# The project's own wheel; its dependencies come from each service's list instead.
rm -rf "$OUT/project" && mkdir -p "$OUT/project"
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$OUT/project" .
project_wheel=$(ls "$OUT"/project/fornax-*.whl)

for svc in "${SERVICES[@]}"; do
  reqs=images/requirements/$svc.txt
  [[ -f $reqs ]] || { echo "images: unknown service $svc" >&2; exit 2; }
  ctx=$OUT/$svc
  rm -rf "$ctx" && mkdir -p "$ctx/wheels"
  start=$(date +%s)
  "$PY" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --dest "$ctx/wheels" \
    -r "$reqs" -c requirements.lock
  cp "$project_wheel" "$ctx/wheels/"
  # Flatten the -r includes: inside the image only the wheelhouse exists.
  grep -h -v -e '^-r' -e '^#' -e '^$' images/requirements/common.txt "$reqs" | sort -u >"$ctx/wheels/requirements.txt"
  echo "/wheels/$(basename "$project_wheel")" >"$ctx/wheels/project.txt"
  if [[ $svc == stage_worker ]]; then
    # The image layer can carry the MAX compile cache for one checkpoint's graph shapes,
    # compiled here by the same MAX build the wheelhouse pins (requirements.lock).
    mkdir -p "$ctx/compile-cache"
    if [[ -n ${COMPILE_CACHE_CHECKPOINT:-} ]]; then
      MODULAR_TELEMETRY_ENABLED=0 "$PY" -m apps.cli.main max warmup --checkpoint "$COMPILE_CACHE_CHECKPOINT" \
        --cache-dir "$ctx/compile-cache"
    fi
  fi
  name=fornax-${svc//_/-}
  previous=$(buildah images --quiet --no-trunc "localhost/$name:$VERSION" 2>/dev/null || true)
  # chroot isolation shares the caller's network namespace, so the build runs in a fresh one
  # that has no interfaces: a RUN step that reaches for the network fails.
  unshare --net buildah bud --isolation chroot --layers=false \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --label "org.opencontainers.image.title=$name" \
    --label "org.opencontainers.image.version=$VERSION" \
    -f "services/$svc/Dockerfile" -t "localhost/$name:$VERSION" "$ctx"
  # The image the tag pointed at before is now unnamed; drop it rather than pile them up.
  current=$(buildah images --quiet --no-trunc "localhost/$name:$VERSION")
  if [[ -n $previous && $previous != "$current" ]]; then
    buildah rmi "$previous" >/dev/null || true
  fi
  echo "images: built localhost/$name:$VERSION in $(($(date +%s) - start)) s"
done
