"""Unit tests: the simulator."""
