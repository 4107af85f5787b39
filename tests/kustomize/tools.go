//go:build tools

// Pins kustomize (sigs.k8s.io/kustomize/kustomize/v5), the engine behind `kubectl kustomize`, for
// the deploy tests that build the example kustomizations. Built by scripts/build-kustomize.sh: a
// ~25 s build, where all of kubectl would add ~15 min to a cold CI run.
package tools

import _ "sigs.k8s.io/kustomize/kustomize/v5"
