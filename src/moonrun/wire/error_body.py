"""The envelope every refusal is sent in, by both APIs: `{"error": {"code", "message"}}`."""

from __future__ import annotations

from typing import NotRequired

from typing_extensions import TypedDict


class FieldProblem(TypedDict):
    field: str
    """Where in the request's payload, e.g. `argv[0]`; "" is the whole payload."""
    message: str


class ErrorDetail(TypedDict):
    code: str
    """Stable: the API (moonrun.errors.ERROR_TABLE)."""
    message: str
    """For people; not API."""
    fields: NotRequired[list[FieldProblem]]
    """With `invalid_payload`, `invalid_labels` and `invalid_selector`: each bad field."""


class ErrorBody(TypedDict):
    error: ErrorDetail


def error_body(code: str, message: str, fields: tuple[tuple[str, str], ...] = ()) -> ErrorBody:
    """The envelope of one refusal (`fields` only when there are some)."""
    detail: ErrorDetail = {"code": code, "message": message}
    if fields:
        detail["fields"] = [{"field": field, "message": text} for field, text in fields]
    return {"error": detail}
