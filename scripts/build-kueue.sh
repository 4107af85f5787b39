#!/usr/bin/env bash
# Builds Kueue's controller (sigs.k8s.io/kueue/cmd/kueue, pinned in tests/kueue/go.mod) into the same
# cache as the control plane, with the CRDs and webhook configuration of that same module version next
# to it (config/). bench/replay.py's `kueue` baseline runs it against the test kube-apiserver:
# all-or-nothing admission of pod groups in front of MostAllocated, what an operator would run instead.
#
#   scripts/build-kueue.sh              build if not cached (no-op when cached); prints the binary last
#   scripts/build-kueue.sh --print-path print where the binary lives, build nothing
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/go-tool.sh
source "$here/scripts/lib/go-tool.sh"
bin=$(go_tool_build kueue "$here/tests/kueue" sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue 40 "${1:-}" -- --help)
if [[ "${1:-}" != "--print-path" && ! -f "$(dirname "$bin")/config/webhook.yaml" ]]; then
  # The manifests ship in the module's source, not in the binary: take them from the module cache.
  src=$(cd "$here/tests/kueue" && GOTOOLCHAIN=local go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
  mkdir -p "$(dirname "$bin")/config.tmp/crd"
  cp "$src"/config/components/crd/bases/*.yaml "$(dirname "$bin")/config.tmp/crd/"
  cp "$src/config/components/webhook/manifests.yaml" "$(dirname "$bin")/config.tmp/webhook.yaml"
  chmod -R u+w "$(dirname "$bin")/config.tmp"
  mv "$(dirname "$bin")/config.tmp" "$(dirname "$bin")/config"
fi
echo "$bin"
