//go:build tools

// Pins etcd (go.etcd.io/etcd/server/v3, its `etcd` command) for the integration suite: the same
// etcd 3.6 line Kubernetes 1.36 is tested with, so kube-apiserver's watch-list and progress-notify
// paths behave as in a real cluster. Built by scripts/build-etcd.sh.
package tools

import _ "go.etcd.io/etcd/server/v3"
