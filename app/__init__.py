"""llm-placement: an LLM-lifecycle-aware Kubernetes scheduler extender."""

__version__ = "0.1.0"
