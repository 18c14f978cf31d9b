"""The platform secret, session keys derived from it, and the nonce cache against replays."""

from __future__ import annotations

import hashlib
import heapq
import hmac
import os
import secrets
import stat
import threading
from pathlib import Path

from moonrun.errors import Replayed, SecretFileError
from moonrun.security.files import private_directory

SESSION_KEY_PREFIX = b"moonrun-session:"


def load_or_create_secret(path: Path) -> bytes:
    """The 32-byte platform secret from `path` (64 hex characters), created 0600 if missing.

    A file readable or writable by group or others, or holding anything but 64 hex
    characters, is refused: replicas must share one secret, and nobody else may read it.
    """
    if not path.exists():
        secret = secrets.token_bytes(32)
        try:
            private_directory(path.parent)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return load_or_create_secret(path)  # another replica created it first
        except OSError as error:
            raise SecretFileError(f"cannot create {path}: {error.strerror}") from None
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secret.hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return secret
    if not path.is_file():
        raise SecretFileError(f"{path} is not a regular file")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SecretFileError(
            f"{path} is accessible by group or others (mode {mode:o}); chmod 600 {path}"
        )
    try:
        text = path.read_bytes().strip()
    except OSError as error:
        raise SecretFileError(f"cannot read {path}: {error.strerror}") from None
    if len(text) != 64 or any(c not in b"0123456789abcdefABCDEF" for c in text):
        raise SecretFileError(f"{path} must hold exactly 64 hex characters")
    return bytes.fromhex(text.decode("ascii"))


def session_key(secret: bytes, session_id: str) -> bytes:
    """HMAC-SHA256(platform secret, "moonrun-session:" + session_id): never stored anywhere."""
    return hmac.new(secret, SESSION_KEY_PREFIX + session_id.encode(), hashlib.sha256).digest()


class NonceCache:
    """Nonces seen within the signature window; a second sighting is a replay.

    In memory, per platform instance: a restarted instance refuses signatures created before
    it started, so the window its lost cache covered cannot be replayed into.

    Each nonce leaves as its window ends, a few at every call (a heap ordered by expiry): a
    purge of the whole cache every 10 s held its lock for 0.8 s at a million nonces, which a
    fleet of 5,000 Runs reaches in about three minutes (docs/benchmarks.md, issue 24).
    """

    def __init__(self, window_s: int) -> None:
        self._window_s = window_s
        self._seen: dict[str, float] = {}
        self._expiries: list[tuple[float, str]] = []
        """(until, entry) of every nonce in `_seen`, a heap: the first to expire first."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def remember(self, key_id: str, nonce: str, created: float, now_s: float) -> None:
        """Record a verified nonce, or raise `Replayed` if it was seen within the window."""
        entry = f"{key_id} {nonce}"
        with self._lock:
            self._forget_expired(now_s)
            if entry in self._seen:
                raise Replayed()
            until = created + self._window_s
            self._seen[entry] = until
            heapq.heappush(self._expiries, (until, entry))

    def _forget_expired(self, now_s: float) -> None:
        expiries, seen = self._expiries, self._seen
        while expiries and expiries[0][0] < now_s:
            _, entry = heapq.heappop(expiries)
            del seen[entry]
