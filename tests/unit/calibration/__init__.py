"""Unit tests: calibration."""
