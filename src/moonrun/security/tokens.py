"""Where the platform's randomness comes from: typed tokens, record ids and jitter draws."""

from __future__ import annotations

import base64
import binascii
import random
import secrets
from typing import Protocol

JOIN_PREFIX = "mrj_"
API_PREFIX = "mra_"
LEASE_PREFIX = "mrl_"


def b64url(data: bytes) -> str:
    """Base64url without padding (RFC 4648 section 5)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Base64url, padded or not (both: docs/protocol.md, "Conventions"); else ValueError."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None


class TokenSource(Protocol):
    """All randomness the service uses, injected so that tests can make it repeatable."""

    def token(self, prefix: str) -> str:
        """`prefix` + base64url of 32 random bytes."""
        ...

    def identifier(self, prefix: str) -> str:
        """A new record id such as `job_3kq...`; unique, not secret."""
        ...

    def draw(self) -> float:
        """A uniform draw in [0, 1) for backoff jitter."""
        ...


class SystemTokenSource:
    """Tokens from the operating system's CSPRNG."""

    def token(self, prefix: str) -> str:
        return prefix + b64url(secrets.token_bytes(32))

    def identifier(self, prefix: str) -> str:
        return prefix + base64.b32encode(secrets.token_bytes(10)).decode("ascii").lower()

    def draw(self) -> float:
        return secrets.randbits(53) / (1 << 53)


class SeededTokenSource:
    """Repeatable tokens for tests and simulations. Never use outside tests."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def token(self, prefix: str) -> str:
        return prefix + b64url(self._random.randbytes(32))

    def identifier(self, prefix: str) -> str:
        return prefix + base64.b32encode(self._random.randbytes(10)).decode("ascii").lower()

    def draw(self) -> float:
        return self._random.random()
