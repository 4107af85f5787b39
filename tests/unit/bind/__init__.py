"""Unit tests: binding."""
