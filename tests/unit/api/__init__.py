"""Unit tests: the HTTP verbs."""
