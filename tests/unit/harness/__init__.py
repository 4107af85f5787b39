"""Unit tests: the control-plane harness and testkit."""
