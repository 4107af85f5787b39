#!/usr/bin/env bash
# Builds kube-apiserver and kube-scheduler (official k8s.io/kubernetes module, via the Go module
# proxy) into a cache outside the clone, keyed by version, so later runs reuse them.
#
#   scripts/build-controlplane.sh              build if not cached (no-op when cached)
#   scripts/build-controlplane.sh --print-dir  print the cache folder the binaries live in, build nothing
#
# Cache: ${LLMP_CACHE:-$HOME/.cache/llm-placement}/controlplane/<k8s version>/. Go's own module and
# build caches (GOMODCACHE, GOCACHE) also persist in the home folder between runs on one machine.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mod="$here/tests/controlplane"
version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$mod/go.mod")
if [[ -z "$version" ]]; then
  echo "cannot read the k8s.io/kubernetes version from $mod/go.mod" >&2
  exit 1
fi
root="${LLMP_CACHE:-$HOME/.cache/llm-placement}/controlplane"
cache="$root/$version"
if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$cache"
  exit 0
fi
have() { [[ -x "$cache/kube-apiserver" && -x "$cache/kube-scheduler" ]]; }
if have; then
  echo "control plane $version: cached in $cache"
  exit 0
fi
command -v go >/dev/null || { echo "Go is required to build the control plane (go.mod wants $(awk '/^go / {print $2}' "$mod/go.mod"))" >&2; exit 1; }
export GOTOOLCHAIN=local
# Go >= 1.27 breaks the apiserver's OpenAPI output unless JSONv2 is off; harmless on 1.26.
export GOEXPERIMENT="${GOEXPERIMENT:-nojsonv2}"
mkdir -p "$root"
# Two builds at once (make e2e and a pytest fixture, two terminals) would each take ~2 GB and both
# write $cache.tmp; the second one waits for the first and then finds the binaries cached.
exec 9>"$root/.build-$version.lock"
if ! flock -n 9; then
  echo "another build of the control plane $version is running; waiting for it (up to 40 min)"
  flock -w 2400 9 || { echo "timed out waiting for the other build" >&2; exit 1; }
fi
if have; then
  echo "control plane $version: cached in $cache (built by the other run)"
  exit 0
fi
rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
start=$(date +%s)
echo "building kube-apiserver + kube-scheduler $version with $(go version | cut -d' ' -f3) into $cache"
echo "(cold: ~5 min on 2 cores with the Go module cache already filled, plus the module download on a fresh machine)"
# Stamp the release version (what hack/lib/version.sh does) so /version and the logs report it,
# not v0.0.0-master.
minor=$(echo "$version" | cut -d. -f2)
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$version"
(cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$cache.tmp/" \
   k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler)
"$cache.tmp/kube-apiserver" --version >/dev/null
rm -rf "$cache" && mv "$cache.tmp" "$cache"
end=$(date +%s)
echo "built in $((end - start)) s; binaries: $(du -sh "$cache" | cut -f1)" \
  "; Go build cache $(du -sh "$(go env GOCACHE)" 2>/dev/null | cut -f1), module cache $(du -sh "$(go env GOMODCACHE)" 2>/dev/null | cut -f1)"
