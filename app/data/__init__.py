"""Packaged data files (GPU catalog)."""
