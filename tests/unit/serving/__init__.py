"""Unit tests: the serving model and profiles."""
