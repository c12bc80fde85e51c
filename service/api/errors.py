"""Turning exceptions into JSON errors: `{"detail": ...}` with the right status, never a trace."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.core.exceptions import (
    AuthError,
    ForbiddenError,
    NotFoundError,
    NotReadyError,
    SpecError,
    StaleAttemptError,
    StateConflictError,
    TooLargeError,
    TooManyError,
)
from towerq.contract.spec import problem

log = logging.getLogger(__name__)

STATUS = {
    NotFoundError: 404,
    StateConflictError: 409,
    StaleAttemptError: 409,
    ForbiddenError: 403,
    TooManyError: 429,
}


def validation_detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's errors, each message prefixed with the field it is about."""
    detail = []
    for error in errors:
        path, message = problem(error)
        detail.append(
            {
                "loc": list(error.get("loc", ())),
                "msg": f"{path}: {message}" if path else message,
                "type": error.get("type", "value_error"),
            }
        )
    return detail


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": validation_detail(list(exc.errors()))})

    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError) -> JSONResponse:
        loc = ["body", *exc.field.split(".")]
        too_large = isinstance(exc, TooLargeError)
        detail = [
            {"loc": loc, "msg": f"{exc.field}: {exc.message}", "type": "too_large" if too_large else "value_error"}
        ]
        return JSONResponse(status_code=413 if too_large else 422, content={"detail": detail})

    @app.exception_handler(AuthError)
    async def _auth(_: Request, exc: AuthError) -> JSONResponse:
        return JSONResponse(status_code=401, content={"detail": str(exc)}, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(NotReadyError)
    async def _not_ready(_: Request, exc: NotReadyError) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)}, headers={"Retry-After": "2"})

    for exc_type, status in STATUS.items():
        app.add_exception_handler(exc_type, _status_handler(status))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail}, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            status_code=500, content={"detail": f"internal error: {type(exc).__name__} (logged by the API)"}
        )


def _status_handler(status: int) -> Any:
    async def handler(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=status, content={"detail": str(exc)})

    return handler
