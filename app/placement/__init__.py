"""Placement: hard rules (filter), soft preferences (score), kube-scheduler's bands, narrowing, the
placer, data gravity. Pure."""
