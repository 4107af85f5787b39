#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok, pinned in tests/kwok/go.mod) into the same cache as the
# control plane, keyed by version, so later runs reuse it. The replay harness runs it against the
# test kube-apiserver to keep fake nodes Ready and move pods Running -> Succeeded.
#
#   scripts/build-kwok.sh              build if not cached (no-op when cached); prints the binary last
#   scripts/build-kwok.sh --print-path print where the binary lives, build nothing
#
# Cache: ${LLMP_CACHE:-$HOME/.cache/llm-placement}/kwok/<kwok version>/kwok.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mod="$here/tests/kwok"
version=$(awk '/^require sigs.k8s.io\/kwok/ {print $3}' "$mod/go.mod")
if [[ -z "$version" ]]; then
  echo "cannot read the sigs.k8s.io/kwok version from $mod/go.mod" >&2
  exit 1
fi
root="${LLMP_CACHE:-$HOME/.cache/llm-placement}/kwok"
cache="$root/$version"
if [[ "${1:-}" == "--print-path" ]]; then
  echo "$cache/kwok"
  exit 0
fi
have() { [[ -x "$cache/kwok" ]]; }
if have; then
  echo "kwok $version: cached in $cache" >&2
  echo "$cache/kwok"
  exit 0
fi
command -v go >/dev/null || { echo "Go is required to build kwok (go.mod wants $(awk '/^go / {print $2}' "$mod/go.mod"))" >&2; exit 1; }
# Never let the go command fetch a different toolchain behind our back.
export GOTOOLCHAIN=local
mkdir -p "$root"
# Two builds at once (make kwok and a pytest run) would both write $cache.tmp; the second waits.
exec 9>"$root/.build-$version.lock"
if ! flock -n 9; then
  echo "another build of kwok $version is running; waiting for it (up to 30 min)" >&2
  flock -w 1800 9 || { echo "timed out waiting for the other build" >&2; exit 1; }
fi
if have; then
  echo "kwok $version: cached in $cache (built by the other run)" >&2
  echo "$cache/kwok"
  exit 0
fi
rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
start=$(date +%s)
echo "building kwok $version with $(go version | cut -d' ' -f3) into $cache (a few minutes cold on 2 cores)" >&2
# The module's own source already carries its version (pkg/consts.Version), so no -X flags.
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$cache.tmp/kwok" sigs.k8s.io/kwok/cmd/kwok) >&2
"$cache.tmp/kwok" --version >/dev/null 2>&1 || "$cache.tmp/kwok" --help >/dev/null
rm -rf "$cache" && mv "$cache.tmp" "$cache"
end=$(date +%s)
echo "built in $((end - start)) s: $(du -sh "$cache/kwok" | cut -f1)" >&2
echo "$cache/kwok"
