"""Pure placement logic: no FastAPI and no Kubernetes client imports below this package."""
