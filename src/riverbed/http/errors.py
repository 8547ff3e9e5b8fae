"""How the admin API answers errors: always `{"error": "..."}` as JSON.

400-range for the caller's mistake (401 no or wrong token, 403 a read token
writing, 404 not found, 409 exists already, 413 too large, 422 bad input
naming the field and the rule, with nothing changed), 503 when the store is
unreachable or full. Route modules raise `ApiError` or the project's own
errors (`riverbed.errors`); `install_error_handlers` turns both into answers.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from riverbed.errors import (
    AlreadyExists,
    InvalidInput,
    NotFound,
    RiverbedError,
    StorageError,
)


class ApiError(Exception):
    """An error answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def status_of(exc: RiverbedError) -> int:
    """The HTTP status for one of the project's errors."""
    if isinstance(exc, InvalidInput):
        return 422
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, AlreadyExists):
        return 409
    if isinstance(exc, StorageError):
        return 503
    return 500


def error_response(code: int, message: str, **extra: object) -> JSONResponse:
    """`{"error": message, **extra}` with status `code` (401s say Bearer)."""
    headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
    return JSONResponse({"error": message, **extra}, status_code=code, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, list[dict[str, str]]]:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        problems.append({"field": where or "body", "rule": str(error.get("msg", ""))})
    text = "; ".join(f"{p['field']}: {p['rule']}" for p in problems)
    return text or "the request is not valid", problems


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error `app` raises as JSON (the module docstring)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, str(exc))

    @app.exception_handler(RiverbedError)
    async def riverbed_error(request: Request, exc: RiverbedError) -> JSONResponse:
        return error_response(status_of(exc), str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        text, problems = _validation_message(exc)
        return error_response(422, text, fields=problems)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))
