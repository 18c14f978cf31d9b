"""Console sign-in: session cookies (only their SHA-256 at rest), CSRF tokens, throttling."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import deque

from moonrun.clock import Clock
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.records import User
from moonrun.security.tokens import b64url
from moonrun.store.protocol import Store

SESSION_COOKIE = "moonrun_session"
SIGN_IN_COOKIE = "moonrun_signin"
"""Holds the sign-in form's CSRF value before there is a session (double submit)."""


class WebSessions:
    """Console sessions in the store; the browser holds the only copy of each token."""

    def __init__(self, store: Store, clock: Clock, secret: bytes, ttl_s: float = 12 * 3600):
        self._store = store
        self._clock = clock
        self._secret = secret
        self.ttl_s = ttl_s

    def open(self, user: User) -> str:
        token = b64url(secrets.token_bytes(32))
        now = self._clock.now()
        self._store.insert_web_session(
            token_hash(token), user.id, now, now + round(self.ttl_s * 1000)
        )
        return token

    def user(self, token: str | None) -> User | None:
        if not token:
            return None
        return self._store.web_session_user(token_hash(token), self._clock.now())

    def close(self, token: str | None) -> None:
        if token:
            self._store.delete_web_session(token_hash(token))

    def csrf(self, token: str) -> str:
        """The CSRF token of a session: derived, so nothing more is stored."""
        digest = hmac.new(
            self._secret, b"moonrun-csrf:" + token_hash(token).encode(), hashlib.sha256
        )
        return b64url(digest.digest())

    @staticmethod
    def new_sign_in_token() -> str:
        """A random value for the sign-in form and its cookie (double submit)."""
        return b64url(secrets.token_bytes(32))

    @staticmethod
    def same(expected: str, presented: str) -> bool:
        return hmac.compare_digest(expected.encode(), presented.encode())

    def csrf_ok(self, token: str | None, presented: str | None) -> bool:
        return bool(token and presented) and hmac.compare_digest(
            self.csrf(token or ""), presented or ""
        )


class SignInThrottle:
    """At most `limit` failed sign-ins per name, and `address_limit` per client address (many
    people may share one address behind a proxy), within `window_s`.

    In memory, per platform instance: a restart forgets, and replicas count apart.
    """

    def __init__(
        self, clock: Clock, limit: int = 5, address_limit: int = 50, window_s: float = 300
    ) -> None:
        self._clock = clock
        self._limits = {"name": limit, "addr": address_limit}
        self._window_ms = round(window_s * 1000)
        self._failures: dict[str, deque[int]] = {}
        self._lock = threading.Lock()

    def wait_s(self, name: str, address: str) -> int:
        """Seconds until another attempt may be made (0: now)."""
        now = self._clock.now()
        waits = [0]
        with self._lock:
            for key in (f"name:{name.lower()}", f"addr:{address}"):
                failures = self._recent(key, now)
                if len(failures) >= self._limits[key.split(":", 1)[0]]:
                    waits.append((failures[0] + self._window_ms - now + 999) // 1000)
        return max(waits)

    def failed(self, name: str, address: str) -> None:
        now = self._clock.now()
        with self._lock:
            for key in (f"name:{name.lower()}", f"addr:{address}"):
                self._recent(key, now).append(now)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(f"name:{name.lower()}", None)

    def _recent(self, key: str, now: int) -> deque[int]:
        failures = self._failures.setdefault(key, deque())
        while failures and failures[0] <= now - self._window_ms:
            failures.popleft()
        return failures
