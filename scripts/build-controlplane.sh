#!/usr/bin/env bash
# Builds kube-apiserver and kube-scheduler (official k8s.io/kubernetes module, via the Go module
# proxy) into a cache outside the clone, keyed by version, so later runs reuse them.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mod="$here/tests/controlplane"
version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$mod/go.mod")
cache="${LLMP_CACHE:-$HOME/.cache/llm-placement}/controlplane/$version"
export GOTOOLCHAIN=local
# Go >= 1.27 breaks the apiserver's OpenAPI output unless JSONv2 is off; harmless on 1.26.
export GOEXPERIMENT="${GOEXPERIMENT:-nojsonv2}"
if [[ -x "$cache/kube-apiserver" && -x "$cache/kube-scheduler" ]]; then
  echo "control plane $version: cached in $cache"
  exit 0
fi
mkdir -p "$cache.tmp"
start=$(date +%s)
echo "building kube-apiserver + kube-scheduler $version into $cache (first build takes ~5 min on 2 cores)"
(cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$cache.tmp/" \
   k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler)
rm -rf "$cache" && mv "$cache.tmp" "$cache"
end=$(date +%s)
echo "built in $((end - start)) s; binaries: $(du -sh "$cache" | cut -f1)"
