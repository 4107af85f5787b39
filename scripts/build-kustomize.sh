#!/usr/bin/env bash
# Builds kustomize (sigs.k8s.io/kustomize/kustomize/v5, pinned in tests/kustomize/go.mod) into the
# cache beside the control plane (~25 s cold on 2 cores). The deploy tests run `kustomize build` on
# the example kustomizations (the same engine `kubectl kustomize` embeds).
#
#   scripts/build-kustomize.sh              build if not cached (no-op when cached); prints the binary last
#   scripts/build-kustomize.sh --print-path print where the binary lives, build nothing
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/go-tool.sh
source "$here/scripts/lib/go-tool.sh"
go_tool_build kustomize "$here/tests/kustomize" sigs.k8s.io/kustomize/kustomize/v5 \
  sigs.k8s.io/kustomize/kustomize/v5 10 "${1:-}" -- version
