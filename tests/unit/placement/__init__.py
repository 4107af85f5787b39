"""Unit tests: filter, score, rank, gravity."""
