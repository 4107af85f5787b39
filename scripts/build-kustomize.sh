#!/usr/bin/env bash
# Builds kustomize (sigs.k8s.io/kustomize/kustomize/v5, pinned in tests/kustomize/go.mod) into the
# same cache as the control plane, keyed by version. The deploy tests run `kustomize build` on the
# example kustomizations (the same engine `kubectl kustomize` embeds).
#
#   scripts/build-kustomize.sh              build if not cached (no-op when cached); prints the binary last
#   scripts/build-kustomize.sh --print-path print where the binary lives, build nothing
#
# Cache: ${LLMP_CACHE:-$HOME/.cache/llm-placement}/kustomize/<version>/kustomize.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mod="$here/tests/kustomize"
version=$(awk '/^require sigs.k8s.io\/kustomize\/kustomize\/v5/ {print $3}' "$mod/go.mod")
if [[ -z "$version" ]]; then
  echo "cannot read the sigs.k8s.io/kustomize/kustomize/v5 version from $mod/go.mod" >&2
  exit 1
fi
root="${LLMP_CACHE:-$HOME/.cache/llm-placement}/kustomize"
cache="$root/$version"
if [[ "${1:-}" == "--print-path" ]]; then
  echo "$cache/kustomize"
  exit 0
fi
have() { [[ -x "$cache/kustomize" ]]; }
if have; then
  echo "kustomize $version: cached in $cache" >&2
  echo "$cache/kustomize"
  exit 0
fi
command -v go >/dev/null || { echo "Go is required to build kustomize (go.mod wants $(awk '/^go / {print $2}' "$mod/go.mod"))" >&2; exit 1; }
# Never let the go command fetch a different toolchain behind our back.
export GOTOOLCHAIN=local
mkdir -p "$root"
# Two builds at once (make and a pytest fixture) would both write $cache.tmp; the second waits.
exec 9>"$root/.build-$version.lock"
if ! flock -n 9; then
  echo "another build of kustomize $version is running; waiting for it (up to 10 min)" >&2
  flock -w 600 9 || { echo "timed out waiting for the other build" >&2; exit 1; }
fi
if have; then
  echo "kustomize $version: cached in $cache (built by the other run)" >&2
  echo "$cache/kustomize"
  exit 0
fi
rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
start=$(date +%s)
echo "building kustomize $version with $(go version | cut -d' ' -f3) into $cache (~30 s cold on 2 cores)" >&2
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$cache.tmp/kustomize" \
   sigs.k8s.io/kustomize/kustomize/v5) >&2
"$cache.tmp/kustomize" version >/dev/null
rm -rf "$cache" && mv "$cache.tmp" "$cache"
end=$(date +%s)
echo "built in $((end - start)) s: $(du -sh "$cache/kustomize" | cut -f1)" >&2
echo "$cache/kustomize"
