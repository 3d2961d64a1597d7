"""OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``, for every failure."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

# HTTP status -> OpenAI's error ``type``.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout",
    413: "invalid_request_error",
    429: "requests",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """A failure the client is told about with an HTTP status and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON body of an error response (also sent as the last SSE frame of a failed stream)."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    body = error_body(err.status, err.message, err.param, err.code)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def _validation_path(loc: tuple[Any, ...]) -> list[str]:
    """``("body", "prompt", "list[int]", 0)`` -> ``["prompt", "0"]``: the field path, without
    the "body" root and the union-branch names pydantic puts in it."""
    parts = []
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        text = str(part)
        if "[" in text or text in _TYPE_NAMES or text.startswith("function-"):
            continue
        parts.append(text)
    return parts


def install_error_handlers(app: FastAPI) -> None:
    """Turn every exception a route can raise into OpenAI's shape; 422 becomes 400."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors()
        first: dict[str, Any] = dict(errors[0]) if errors else {"loc": (), "msg": "invalid request"}
        path = _validation_path(tuple(first.get("loc", ())))
        param = path[0] if path else None  # the request's own field, as OpenAI names it
        if first.get("type") == "json_invalid":
            message = f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}"
            param = None
        else:
            message = f"{'.'.join(path)}: {first['msg']}" if path else str(first["msg"])
        return error_response(APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        headers = dict(err.headers) if err.headers else None
        return error_response(APIError(err.status_code, str(err.detail), headers=headers))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, err: Exception) -> JSONResponse:
        return error_response(APIError(500, f"internal error: {type(err).__name__}: {err}"))
