"""Console sign-in: session cookies (only their SHA-256 at rest), CSRF tokens, throttling."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from moonrun.clock import Clock
from moonrun.scheduling.fingerprint import token_hash
from moonrun.scheduling.records import User
from moonrun.security.sign_in_ledger import Failures, Ledger, MemoryLedger
from moonrun.security.tokens import b64url
from moonrun.store.protocol import Store

SESSION_COOKIE = "moonrun_session"
SIGN_IN_COOKIE = "moonrun_signin"
"""Holds a random value (and when it was issued) before there is a session; the sign-in form
carries its HMAC with the platform secret (a signed double submit)."""
SIGN_IN_FORM_TTL_S = 3600
"""How long a sign-in form (its cookie and token) is accepted."""


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

    def sign_in_form(self, cookie: str | None) -> tuple[str, str]:
        """The sign-in form's cookie and CSRF token: the cookie sent, while it is fresh, else a
        new one (a random value and when it was issued)."""
        if cookie is None or not self._fresh(cookie):
            cookie = f"{b64url(secrets.token_bytes(32))}.{self._clock.now()}"
        return cookie, self._sign_in_token(cookie)

    def sign_in_form_ok(self, cookie: str | None, presented: str | None) -> bool:
        """Whether a sign-in form's token is the one this platform issued for its cookie,
        within `SIGN_IN_FORM_TTL_S` (a value the client chose fails: it has no secret)."""
        if not cookie or not presented or not self._fresh(cookie):
            return False
        return hmac.compare_digest(self._sign_in_token(cookie).encode(), presented.encode())

    def _sign_in_token(self, cookie: str) -> str:
        digest = hmac.new(self._secret, b"moonrun-signin:" + cookie.encode(), hashlib.sha256)
        return b64url(digest.digest())

    def _fresh(self, cookie: str) -> bool:
        issued = cookie.rpartition(".")[2]
        if not issued.isascii() or not issued.isdigit() or len(issued) > 15:
            return False
        return 0 <= self._clock.now() - int(issued) < SIGN_IN_FORM_TTL_S * 1000

    def csrf_ok(self, token: str | None, presented: str | None) -> bool:
        return bool(token and presented) and hmac.compare_digest(
            self.csrf(token or ""), presented or ""
        )


class SignInThrottle:
    """Backoff for failed sign-ins, per name and per client address; a try counts as a failure
    from before its password is checked (`reserve`) until it signs in (`succeeded`).

    After `free` failures of a key (`name_free` for a name, `address_free` for an address:
    many people may share one address behind a proxy), its next try must wait
    `base_s * 2**k` seconds after its latest failure, k counting the failures past `free`,
    never more than `max_s`. Tries refused while a key waits count for nothing, so a guesser
    holds a name's owner off for at most `max_s` after its latest guess, and the right password
    once the wait is over signs in. A key that has not failed for `forget_s` starts afresh.

    Counted in `ledger`: this process's memory by default (a restart forgets), or files every
    platform process shares (`security/sign_in_ledger.py`), so that they count together.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        ledger: Ledger | None = None,
        name_free: int = 5,
        address_free: int = 50,
        base_s: float = 1,
        max_s: float = 60,
        forget_s: float = 900,
    ) -> None:
        self._clock = clock
        self._ledger: Ledger = ledger if ledger is not None else MemoryLedger()
        self._free = {"name": name_free, "addr": address_free}
        self._base_ms = round(base_s * 1000)
        self._max_ms = round(max_s * 1000)
        self._forget_ms = max(round(forget_s * 1000), self._max_ms)

    def reserve(self, name: str, address: str) -> int:
        """Count a try before its password is checked: 0 when it may go on (it counts as a
        failure from now, so that tries in flight at once cannot exceed the allowance), else
        the seconds until another may be made (and it counts for nothing)."""
        now = self._clock.now()
        keys = _keys(name, address)
        wait_ms = 0

        def count(failures: dict[str, Failures]) -> dict[str, Failures | None]:
            nonlocal wait_ms
            current = {key: self._current(failures.get(key), now) for key in keys}
            wait_ms = max(self._wait_ms(key, current[key], now) for key in keys)
            if wait_ms:
                return {}
            return {key: (current[key][0] + 1, now) for key in keys}

        self._ledger.update(keys, count)
        if self._ledger.prune_due():
            self._ledger.prune(now - self._forget_ms)
        return (wait_ms + 999) // 1000

    def succeeded(self, name: str, address: str) -> None:
        """A reserved try signed in: its name starts afresh, and its address no longer counts
        it as a failure."""
        name_key, address_key = _keys(name, address)

        def take_back(failures: dict[str, Failures]) -> dict[str, Failures | None]:
            count, latest = failures.get(address_key, (0, 0))
            return {name_key: None, address_key: (count - 1, latest) if count > 1 else None}

        self._ledger.update((name_key, address_key), take_back)

    def _wait_ms(self, key: str, failures: Failures, now: int) -> int:
        count, latest = failures
        past = count - self._free[key.split(":", 1)[0]]
        if past < 0:
            return 0
        backoff = min(self._base_ms << min(past, 40), self._max_ms)
        return max(0, latest + backoff - now)

    def _current(self, failures: Failures | None, now: int) -> Failures:
        count, latest = failures or (0, now)
        if now - latest >= self._forget_ms:
            return 0, now
        return count, latest


def _keys(name: str, address: str) -> tuple[str, str]:
    return f"name:{name.lower()}", f"addr:{address}"
