"""One error shape for every service: ``{"error": "<snake_case_code>", "detail": "<text>"}``.

Clients (the runtime's tools) branch on the code, never on the text, so FastAPI's own errors
(validation, unknown route, crashes) are rewritten into the same shape.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException


class ServiceError(Exception):
    """A refusal with an HTTP status and a stable code; raised anywhere in a handler."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail


def error_response(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def on_service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.status, exc.error, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def on_invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        return error_response(422, "invalid_request", problems)

    @app.exception_handler(HTTPException)
    async def on_http_error(_: Request, exc: HTTPException) -> JSONResponse:
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_").replace("-", "_")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def on_crash(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, "internal_error", type(exc).__name__)
