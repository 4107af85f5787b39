//go:build tools

// Package tools pins Kueue (sigs.k8s.io/kueue/cmd/kueue) for scripts/build-kueue.sh: the all-or-nothing
// admission baseline of bench/replay.py runs the real controller against the test control plane.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
