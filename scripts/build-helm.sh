#!/usr/bin/env bash
# Builds the helm CLI from the official Go module (helm.sh/helm/v3) through the Go module proxy into
# a cache outside the clone, keyed by version, so later runs reuse it. Prints the binary's path last.
#   HELM_VERSION   module version to build (default below; v3.22.0 is accepted on Go 1.26)
#   LLMP_CACHE     cache root (default ~/.cache/llm-placement)
set -euo pipefail
version="${HELM_VERSION:-v3.22.0}"
cache="${LLMP_CACHE:-$HOME/.cache/llm-placement}/helm/$version"
# Never let the go command fetch a different toolchain behind our back.
export GOTOOLCHAIN=local
if [[ -x "$cache/helm" ]]; then
  echo "helm $version: cached in $cache" >&2
  echo "$cache/helm"
  exit 0
fi
rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
start=$(date +%s)
echo "building helm $version into $cache (about 2-3 min cold on 2 cores)" >&2
# The same -X flags as helm's own Makefile. Without the Kubernetes version ones, `helm template` and
# `helm lint` assume Kubernetes v1.20 and reject charts that require newer (ours needs >= 1.25);
# helm derives them from the client-go it is built with (client-go v0.N -> Kubernetes 1.N).
gomod=$(go mod download -json "helm.sh/helm/v3@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
client_go=$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod")
k8s_minor=$(echo "$client_go" | cut -d. -f2)
[[ -n "$k8s_minor" ]] || { echo "cannot read the client-go version from $gomod" >&2; exit 1; }
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
ldflags+=" -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
# `go install module@version` builds with the module's own go.mod: no local module is needed.
GOBIN="$cache.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$version" >&2
rm -rf "$cache" && mv "$cache.tmp" "$cache"
end=$(date +%s)
echo "built in $((end - start)) s: $("$cache/helm" version --short)" >&2
echo "$cache/helm"
