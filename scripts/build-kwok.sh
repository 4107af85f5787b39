#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok, pinned in tests/kwok/go.mod) into the same cache as the
# control plane (a few minutes cold on 2 cores). The replay harness runs it against the test
# kube-apiserver to keep fake nodes Ready and move pods Running -> Succeeded.
#
#   scripts/build-kwok.sh              build if not cached (no-op when cached); prints the binary last
#   scripts/build-kwok.sh --print-path print where the binary lives, build nothing
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/go-tool.sh
source "$here/scripts/lib/go-tool.sh"
# The module's own source already carries its version (pkg/consts.Version), so no -X flags.
go_tool_build kwok "$here/tests/kwok" sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok 30 "${1:-}" -- --help
