"""Test-only support shared by the tests and the benchmarks: generated instances and brute-force
checkers. Not product code: nothing under ``app/`` imports it, and it is not packaged."""
