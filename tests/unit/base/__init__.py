"""Unit tests: units, reasons, catalogs, the workload spec."""
