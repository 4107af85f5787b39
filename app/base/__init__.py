"""Base vocabulary of every part: units, reasons, data files, GPU and model catalogs, the workload
spec. Pure."""
