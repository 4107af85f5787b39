#!/usr/bin/env bash
# Builds the extender image from the shipped Dockerfile, unchanged, with BuildKit (its RUN --mount).
#
#   scripts/build-image.sh                 against the Dockerfile's default base (the official
#                                          python:3.11 slim image, pulled from its registry)
#   scripts/build-image.sh --base debian   against scripts/build-base-image.sh's Python 3.11 base made
#                                          from Debian packages (no container registry needed: CI)
#   scripts/build-image.sh --print-tag [--base debian]   print the tag, build nothing
#
# Tags: llm-placement:<version> (official base), llm-placement:<version>-debian (Debian base); the
# tag is printed last. Docker's layer cache makes an unchanged rebuild take seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
base=official print=""
while (($#)); do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --print-tag) print=1; shift ;;
    *) echo "usage: $0 [--base official|debian] [--print-tag]" >&2; exit 2 ;;
  esac
done
version=$(awk -F'"' '/^version = / {print $2; exit}' "$here/pyproject.toml")
case "$base" in
  official) tag="llm-placement:$version" ;;
  debian) tag="llm-placement:$version-debian" ;;
  *) echo "--base must be official or debian, not $base" >&2; exit 2 ;;
esac
if [[ -n "$print" ]]; then echo "$tag"; exit 0; fi
# The Dockerfile's RUN --mount needs BuildKit. Docker >= 23 runs it through the buildx plugin; Debian
# bookworm's docker.io (20.10) has no buildx package but its own CLI still embeds the BuildKit client
# (DOCKER_BUILDKIT=1), so no extra build is needed there (docs/install.md, "Building the image").
cli=""
if docker buildx version >/dev/null 2>&1; then
  cli=docker
else
  for c in docker /usr/bin/docker; do
    v=$("$c" version --format '{{.Client.Version}}' 2>/dev/null || true)
    if [[ -n "$v" && "${v%%.*}" -lt 23 ]]; then cli=$c; break; fi
  done
fi
[[ -n "$cli" ]] || { echo "no BuildKit-capable docker CLI: install the buildx plugin (Docker >= 23) or Debian's docker.io" >&2; exit 1; }
args=()
if [[ "$base" == debian ]]; then
  args+=(--build-arg "PYTHON_IMAGE=$(bash "$here/scripts/build-base-image.sh" | tail -1)")
fi
start=$(date +%s)
DOCKER_BUILDKIT=1 "$cli" build --progress=plain "${args[@]}" -t "$tag" "$here" >"${LLMP_IMAGE_BUILD_LOG:-/dev/stderr}" 2>&1 \
  || { echo "docker build failed${LLMP_IMAGE_BUILD_LOG:+ (log: $LLMP_IMAGE_BUILD_LOG)}" >&2; exit 1; }
echo "image $tag built in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')" >&2
echo "$tag"
