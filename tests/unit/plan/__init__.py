"""Unit tests: the workflow planner."""
