"""Application factory: the verbs on a bare ASGI fast path, FastAPI for everything else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import __version__
from app.api.access import ExplainAccess, OpenAccess
from app.api.fastpath import VerbFastPath
from app.api.routes import ExplainGate, extender_router, ops_router
from app.extender.service import ExtenderService


def create_fastapi(service: ExtenderService, access: ExplainAccess | None = None) -> FastAPI:
    """Every route, verbs included (the fast path in front of it handles POSTs to the verbs)."""
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        app.state.explain_gate.close()
        if service.gang_binder is not None:
            service.gang_binder.close()  # the gang planner's and binder's thread pools

    app = FastAPI(title="llm-placement", version=__version__, docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.service = service
    app.state.access = access or OpenAccess()
    app.state.explain_gate = ExplainGate()
    app.include_router(extender_router(), prefix=service.settings.url_prefix)
    app.include_router(ops_router())
    return app


def create_app(service: ExtenderService, access: ExplainAccess | None = None) -> VerbFastPath:
    """``access``: who may read explain (default open: no API server to ask, e.g. the demo)."""
    return VerbFastPath(service, create_fastapi(service, access))
