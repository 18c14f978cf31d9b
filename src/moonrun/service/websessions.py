"""Console sign-in: session cookies (only their SHA-256 at rest), CSRF tokens, throttling."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading

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
        user = self._store.web_session_user(token_hash(token), self._clock.now())
        return None if user is None or user.disabled else user

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
    """Backoff for failed sign-ins, per name and per client address.

    After `free` failures of a key (`name_free` for a name, `address_free` for an address:
    many people may share one address behind a proxy), its next try must wait
    `base_s * 2**k` seconds after its latest failure, k counting the failures past `free`,
    never more than `max_s`. Tries refused while a key waits count for nothing, so a guesser
    holds a name's owner off for at most `max_s` after its latest guess, and the right password
    once the wait is over signs in. A key that has not failed for `forget_s` starts afresh.

    In memory, per platform instance: a restart forgets, and replicas count apart.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        name_free: int = 5,
        address_free: int = 50,
        base_s: float = 1,
        max_s: float = 60,
        forget_s: float = 900,
    ) -> None:
        self._clock = clock
        self._free = {"name": name_free, "addr": address_free}
        self._base_ms = round(base_s * 1000)
        self._max_ms = round(max_s * 1000)
        self._forget_ms = max(round(forget_s * 1000), self._max_ms)
        self._failures: dict[str, tuple[int, int]] = {}
        """key -> (failures, time of the latest)."""
        self._lock = threading.Lock()

    def wait_s(self, name: str, address: str) -> int:
        """Seconds until another attempt may be made (0: now)."""
        now = self._clock.now()
        with self._lock:
            wait_ms = max(self._wait_ms(key, now) for key in _keys(name, address))
        return (wait_ms + 999) // 1000

    def failed(self, name: str, address: str) -> None:
        now = self._clock.now()
        with self._lock:
            for key in _keys(name, address):
                count, _ = self._current(key, now)
                self._failures[key] = (count + 1, now)
            if len(self._failures) > PRUNE_AT:
                self._prune(now)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(f"name:{name.lower()}", None)

    def _wait_ms(self, key: str, now: int) -> int:
        count, latest = self._current(key, now)
        past = count - self._free[key.split(":", 1)[0]]
        if past < 0:
            return 0
        backoff = min(self._base_ms << min(past, 40), self._max_ms)
        return max(0, latest + backoff - now)

    def _current(self, key: str, now: int) -> tuple[int, int]:
        count, latest = self._failures.get(key, (0, now))
        if now - latest >= self._forget_ms:
            return 0, now
        return count, latest

    def _prune(self, now: int) -> None:
        self._failures = {
            key: value for key, value in self._failures.items() if now - value[1] < self._forget_ms
        }


PRUNE_AT = 10_000
"""Keys held before forgotten ones are dropped (each failure with a new name adds one)."""


def _keys(name: str, address: str) -> tuple[str, str]:
    return f"name:{name.lower()}", f"addr:{address}"
