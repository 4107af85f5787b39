"""Unit tests: metrics and quality gauges."""
