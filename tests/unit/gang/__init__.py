"""Unit tests: gangs."""
