"""The ASGI application: shared state, the API-key check, error rendering, the routers."""

from __future__ import annotations

import hmac
import json
import os
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import SpeclaError, UsageError
from .engine import Engine, QueueFull
from .errors import APIError

# Seconds a client told "busy" (429) is asked to wait before retrying.
RETRY_AFTER_S = 1


@dataclass
class ServerState:
    model: object
    engine: Engine
    n_ctx: int                      # tokens one request's context holds (prompt + new tokens): -c
    model_id: str                   # the name /v1/models lists and answers carry
    model_path: str
    draft: object = None
    started: float = field(default_factory=time.time)


def _anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(path: str, error: APIError) -> JSONResponse:
    body = error.anthropic_body() if _anthropic_path(path) else error.openai_body()
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def busy_error(exc: QueueFull) -> APIError:
    return APIError(429, f"the server is busy: {exc}; retry after {RETRY_AFTER_S} s", code="server_busy",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class APIKeyCheck:
    """ASGI middleware: with a key set, every path but /health needs `Authorization: Bearer KEY`
    or `x-api-key: KEY` (compared in constant time); 401 otherwise."""

    OPEN_PATHS = ("/health",)

    def __init__(self, app, api_key: str):
        self.app = app
        self._key = api_key.encode()

    def _given(self, scope) -> bytes | None:
        headers = dict(scope.get("headers") or [])
        if b"x-api-key" in headers:
            return headers[b"x-api-key"].strip()
        auth = headers.get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        return token.strip() if scheme.lower() == b"bearer" else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = self._given(scope)
        if given is not None and hmac.compare_digest(given, self._key):
            return await self.app(scope, receive, send)
        error = APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                         code="invalid_api_key")
        response = error_response(scope["path"], error)
        await response(scope, receive, send)


def create_app(model, *, n_ctx: int, model_path: str | None = None, model_id: str | None = None, parallel: int = 1,
               queue_size: int = 16, draft=None, speculative_options: dict | None = None, api_key: str | None = None,
               engine: Engine | None = None) -> FastAPI:
    """The server application around a loaded model (the engine's worker thread starts here and
    stops with the app's lifespan, or with `app.state.server.engine.close()`)."""
    from contextlib import asynccontextmanager

    from . import anthropic_api, llama_api, openai_api

    path = model_path or str(getattr(getattr(model, "file", None), "path", "model"))
    engine = engine or Engine(model, parallel=parallel, queue_size=queue_size, draft=draft,
                              speculative_options=speculative_options, n_ctx=n_ctx)
    state = ServerState(model=model, engine=engine, n_ctx=n_ctx, model_id=model_id or os.path.basename(path),
                        model_path=path, draft=draft)

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    app = FastAPI(title="pyspecla", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(request.url.path, exc)

    @app.exception_handler(QueueFull)
    async def _busy(request: Request, exc: QueueFull):
        return error_response(request.url.path, busy_error(exc))

    @app.exception_handler(SpeclaError)
    async def _library_error(request: Request, exc: SpeclaError):
        status = 400 if isinstance(exc, UsageError) else 500  # a bad value, or the server's own failure
        return error_response(request.url.path, APIError(status, str(exc), code="invalid_value" if status == 400
                                                         else "internal_error"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        message = f"{request.method} {request.url.path}: {detail}"
        return error_response(request.url.path, APIError(exc.status_code, message, code=str(exc.status_code)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return error_response(request.url.path, APIError(500, f"internal error: {exc!r}", code="internal_error"))

    app.include_router(openai_api.router)
    app.include_router(llama_api.router)
    app.include_router(anthropic_api.router)
    if api_key:
        app.add_middleware(APIKeyCheck, api_key=api_key)
    return app
