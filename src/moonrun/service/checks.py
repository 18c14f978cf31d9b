"""Input checks for the service's use cases: a bad value is `InvalidRequest`, never a crash."""

from __future__ import annotations

import re

from moonrun.errors import InvalidRequest
from moonrun.scheduling.jobs import Job
from moonrun.security.tokens import b64url, b64url_decode
from moonrun.store.protocol import JobCursor

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
BOOT_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
RUN_VERSION_PATTERN = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
IDEMPOTENCY_KEY_PATTERN = re.compile(r"^[!-~]{1,255}$")
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ID_PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_-]{7,64}$")
"""A search by id prefix: long enough (`job_` and three more) to find few jobs in any store."""


def check_pattern(name: str, value: object, pattern: re.Pattern[str]) -> None:
    if not isinstance(value, str) or not pattern.match(value):
        raise InvalidRequest(f"{name} must match {pattern.pattern}")


def check_name(name: str, value: object) -> None:
    check_pattern(name, value, NAME_PATTERN)


def decode_public_key(text: object) -> str:
    if not isinstance(text, str):
        raise InvalidRequest("identity_public_key must be a base64url string")
    try:
        raw = b64url_decode(text)
    except ValueError:
        raise InvalidRequest("identity_public_key is not base64url") from None
    if len(raw) != 32:
        raise InvalidRequest("identity_public_key must be 32 raw bytes (Ed25519)")
    return b64url(raw)


def encode_cursor(job: Job) -> str:
    return b64url(f"{job.created_at}:{job.id}".encode())


def decode_cursor(cursor: str | None) -> JobCursor | None:
    if cursor is None:
        return None
    try:
        created_at, job_id = b64url_decode(cursor).decode().split(":", 1)
        instant = int(created_at)
    except (ValueError, UnicodeDecodeError):
        instant, job_id = -1, ""
    # Only what encode_cursor can have written: an instant a store column holds (a signed
    # 64-bit integer would overflow the driver beyond it) and a job id.
    if not 0 <= instant < 2**63 or not JOB_ID_PATTERN.match(job_id):
        raise InvalidRequest("cursor is not one this platform issued")
    return instant, job_id
