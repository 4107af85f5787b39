"""The Prometheus metric set (llm_placement_*) and the placement-quality gauges."""
