"""GPUs through Dynamic Resource Allocation: slices, claims, classes, selectors, taints. Pure."""
