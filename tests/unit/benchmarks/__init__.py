"""Unit tests: the benchmarks' own logic."""
