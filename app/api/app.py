"""FastAPI application factory: verbs under the configured prefix, ops routes at the root."""

from __future__ import annotations

from fastapi import FastAPI

from app import __version__
from app.api.routes import extender_router, ops_router
from app.service import ExtenderService


def create_app(service: ExtenderService) -> FastAPI:
    app = FastAPI(title="llm-placement", version=__version__, docs_url=None, redoc_url=None)
    app.state.service = service
    app.include_router(extender_router(), prefix=service.settings.url_prefix)
    app.include_router(ops_router())
    return app
