"""Unit tests: the settings file."""
