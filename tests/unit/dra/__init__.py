"""Unit tests: DRA objects read as GPUs."""
