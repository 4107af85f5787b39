"""Unit tests: node facts and the snapshot."""
