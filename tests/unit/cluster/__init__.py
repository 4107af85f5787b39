"""Unit tests: the Kubernetes adapters."""
