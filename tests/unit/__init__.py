"""Unit tests, one folder per part of app/ (README, "Layout")."""
