"""Password hashing: argon2id, and only its hash is ever stored."""

from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from moonrun.errors import InvalidRequest

_HASHER = PasswordHasher()
MIN_LENGTH = 8
MAX_LENGTH = 1024


def hash_password(password: str) -> str:
    if not isinstance(password, str) or not MIN_LENGTH <= len(password) <= MAX_LENGTH:
        raise InvalidRequest(f"password must be {MIN_LENGTH} to {MAX_LENGTH} characters")
    return _HASHER.hash(password)


def password_matches(password: str, stored_hash: str | None) -> bool:
    if stored_hash is None:
        _HASHER.hash("the same work whether or not the user exists")
        return False
    try:
        return _HASHER.verify(stored_hash, password)
    except (VerificationError, InvalidHashError):
        return False
