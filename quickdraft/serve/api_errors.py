"""Errors in OpenAI's shape: ApiError, the app's exception handlers, and a job's error event."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from quickdraft.serve.protocol import error_body


class ApiError(Exception):
    """An OpenAI-style error answer: status code, message, type, param."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def job_error(message: str, status: int) -> ApiError:
    """A job's error event as an answer: the scheduler's status (400 bad input, 500 ours, 503 shutting
    down) and the OpenAI type that goes with it."""
    return ApiError(status, message, kind="server_error" if status >= 500 else "invalid_request_error")


def too_long(what: str, limit: int, param: str) -> ApiError:
    return ApiError(
        400,
        f"{what} is longer than the context length of {limit} tokens; shorten it",
        param=param,
        code="context_length_exceeded",
    )


def add_error_handlers(app: FastAPI) -> None:
    """Every error the app raises answered in OpenAI's shape and counted under its route."""
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(Exception, _unexpected)


def _answer(request: Request, error: ApiError) -> JSONResponse:
    request.app.state.metrics.answered(request, error.status)
    return error.response()


async def _invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
    first = _most_specific(error.errors())
    where = ".".join(str(part) for part in first.get("loc", ())[1:] if "[" not in str(part)) or None
    message = (
        "request body is not valid JSON"
        if first.get("type") == "json_invalid"
        else (f"{where or 'body'}: {first.get('msg', 'invalid value')}")
    )
    return _answer(request, ApiError(400, message, param=where))


async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return _answer(request, ApiError(error.status_code, str(error.detail), kind, headers=error.headers))


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    return _answer(request, error)


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    return _answer(request, ApiError(500, f"internal server error: {type(error).__name__}", "server_error"))


def _most_specific(errors: list[dict]) -> dict:
    """The validation error to report: the deepest, and a broken constraint before a type mismatch
    (a union field reports one mismatch per alternative it tried)."""
    return min(errors, key=lambda e: (-len(e.get("loc", ())), str(e.get("type", "")).endswith("_type")), default={})
