//go:build tools

// Pins kwok (sigs.k8s.io/kwok) for the replay harness: it keeps thousands of fake nodes Ready and
// moves pods through Running to Succeeded on their trace durations. Built by scripts/build-kwok.sh.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
