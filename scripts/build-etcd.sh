#!/usr/bin/env bash
# Builds etcd (the `etcd` command of go.etcd.io/etcd/server/v3, pinned in tests/etcd/go.mod) into the
# same cache as the control plane. The integration suite and the benchmarks run it under
# kube-apiserver: the etcd 3.6 line Kubernetes 1.36 is tested with (docs/control-plane.md).
#
#   scripts/build-etcd.sh              build if not cached (no-op when cached); prints the binary last
#   scripts/build-etcd.sh --print-path print where the binary lives, build nothing
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/go-tool.sh
source "$here/scripts/lib/go-tool.sh"
go_tool_build etcd "$here/tests/etcd" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3 30 "${1:-}" -- --version
