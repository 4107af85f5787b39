"""Integration suite: a real etcd, kube-apiserver and kube-scheduler calling the extender."""
