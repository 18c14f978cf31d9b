"""Errors to HTTP for FastAPI's routes: the console's pages (`web/console.py`) on console paths,
moonrun's one table in the JSON envelope for operations; validation and routing errors in the
same shape. (`http/api.py` answers the APIs' own.)"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from moonrun.errors import MoonrunError, NotFound
from moonrun.http.platform import error_response
from moonrun.web import console


def install_error_handlers(app: FastAPI) -> None:
    """moonrun errors by the one table; validation and routing errors in the same shape."""

    async def moonrun_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, MoonrunError)
        if console.is_console(request.url.path):
            return await console.error_page(request, error)
        return error_response(error.status, error.code, error.message)

    async def invalid(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        # Name the field and the problem, never the input (it may be a secret).
        problems = [
            f"{'.'.join(str(p) for p in problem['loc'] if p != 'body')}: {problem['msg']}"
            for problem in error.errors()[:5]
        ]
        return error_response(422, "invalid_request", "; ".join(problems) or "invalid request")

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        if error.status_code == 400:  # a body that is not JSON, or not UTF-8
            return error_response(422, "invalid_request", "the body is not valid JSON")
        codes = {404: "not_found", 405: "method_not_allowed"}
        if console.is_console(request.url.path) and error.status_code in (404, 405):
            return await console.error_page(request, _ConsolePageMissing())
        response = error_response(
            error.status_code, codes.get(error.status_code, "http_error"), str(error.detail)
        )
        response.headers.update(error.headers or {})
        return response

    app.add_exception_handler(MoonrunError, moonrun_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)


class _ConsolePageMissing(NotFound):
    """There is no such page."""
