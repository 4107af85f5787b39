"""Unit tests: rules over the repository: layers, layout, packaging, shipped policies."""
