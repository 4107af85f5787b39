"""Unit tests: the service and explain."""
