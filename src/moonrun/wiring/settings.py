"""Wiring of the platform: configuration values in, the chosen implementations out.

`cli.py` fills a `PlatformConfig` from flags and `MOONRUN_*` environment variables; this
module opens the store, loads the secret and builds the `Platform` the HTTP app serves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moonrun.artifacts.file import FileArtifactStore
from moonrun.artifacts.protocol import ArtifactLimits
from moonrun.clock import SystemClock
from moonrun.http.channels import Channels
from moonrun.http.platform import HttpSettings
from moonrun.logs.file import FileLogStore
from moonrun.logs.memory import MemoryLogStore
from moonrun.logs.protocol import LogLimits, LogStore
from moonrun.security.keys import load_or_create_secret
from moonrun.security.sign_in_ledger import FileLedger
from moonrun.security.tokens import SystemTokenSource
from moonrun.service.config import SchedulingSettings, WaitLimits
from moonrun.service.directory import Bootstrap, Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.service.waiting import Announcer
from moonrun.service.websessions import WebSessions
from moonrun.store import DEFAULT_STORE_URL, open_store
from moonrun.store.file import FileStore
from moonrun.store.memory import MemoryStore
from moonrun.store.mysql import MySQLStore
from moonrun.store.mysql_wakeups import MySQLWakeups
from moonrun.store.pg_wakeups import PostgresWakeups
from moonrun.store.postgres import PostgresStore
from moonrun.store.protocol import Store
from moonrun.wiring.platform import Platform


@dataclass(frozen=True)
class PlatformConfig:
    store_url: str = DEFAULT_STORE_URL
    listen: str = "127.0.0.1:8470"
    secret_file: Path | None = None
    data_dir: Path | None = None
    bootstrap_admin_token: str | None = None
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    logs: LogLimits = field(default_factory=LogLimits)
    artifacts: ArtifactLimits = field(default_factory=ArtifactLimits)
    sweep_interval_s: float = 1.0

    @property
    def host_and_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"--listen must be HOST:PORT, not {self.listen!r}")
        return host.strip("[]"), int(port)

    @property
    def store_path(self) -> Path | None:
        """The database file of a file store; None for memory:// and MySQL."""
        if self.store_url.startswith("file:"):
            return Path(self.store_url.removeprefix("file:").removeprefix("//").partition("?")[0])
        return None

    @property
    def state_dir(self) -> Path:
        """Beside a file store, else `.moonrun`: where the secret and artifacts live by default."""
        path = self.store_path
        return path.parent if path is not None else Path(".moonrun")

    @property
    def secret_path(self) -> Path:
        return self.secret_file or self.state_dir / "platform.secret"

    @property
    def artifacts_dir(self) -> Path:
        return (self.data_dir or self.state_dir) / "artifacts"

    @property
    def logs_dir(self) -> Path:
        return (self.data_dir or self.state_dir) / "logs"

    @property
    def sign_in_dir(self) -> Path:
        """Failed sign-ins, counted by every platform process that shares the data directory."""
        return (self.data_dir or self.state_dir) / "sign-in"


def secret_created_notice(config: PlatformConfig) -> str:
    """What `platform serve` says once, when it has just made the platform secret: where (a
    default path is relative to the working directory, easy to lose or to make twice), and
    what depends on keeping it."""
    shared = not config.store_url.startswith(("file:", "memory:"))
    others = (
        "every other platform process on this store needs this same file (copy it, mode 0600, "
        "before starting them): one that makes its own breaks the Runs it did not register"
        if shared
        else "keep it with the store: if it changes, every Run must be restarted"
    )
    chosen = "" if config.secret_file is not None else " (choose with --secret-file)"
    return (
        f"created the platform secret {config.secret_path.absolute()} (mode 0600){chosen}; {others}"
    )


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_retention(text: str) -> float:
    """`--retain-finished` in seconds: a number with a unit (`30d`, `12h`, `90m`, `45s`), a bare
    number is seconds, and `0` keeps finished jobs forever. ValueError names what is wrong."""
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in _UNITS else "s"
    number = value[:-1] if value[-1:] in _UNITS else value
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(
            f"--retain-finished must be a duration such as 30d, 12h, 90m or 45s (0 keeps "
            f"finished jobs forever), not {text!r}"
        )
    return seconds


def log_store(config: PlatformConfig, store: object) -> LogStore:
    """Logs on disk beside a durable store (`<data dir>/logs`, which the platform processes on
    one MySQL or PostgreSQL database may share), in memory beside memory://."""
    limits = config.logs
    bounds: dict[str, Any] = {
        "line_bytes": limits.line_bytes,
        "attempt_bytes": limits.attempt_bytes,
        "attempt_lines": limits.attempt_lines,
        "total_bytes": limits.total_bytes,
        "max_attempts": limits.max_attempts,
    }
    if isinstance(store, MemoryStore):
        return MemoryLogStore(**bounds)
    # Beside MySQL or PostgreSQL other platform processes may write the same directory
    # (docs/operations.md, "Several platforms"): reads read what files gained, and the directory
    # is listed again now and then.
    shared = isinstance(store, MySQLStore | PostgresStore)
    return FileLogStore(config.logs_dir, shared=shared, **bounds)


SHARED_RECHECK_S = 0.25
"""How often a waiting request looks again over PostgreSQL, where it covers a lost
notification."""
SAFETY_RECHECK_S = 5.0
"""How often a waiting request looks again over MySQL, where one poll per process brings the
others' changes."""
LONE_RECHECK_S = 120.0
"""How often a waiting request looks again where its platform process is the only one: longer
than any wait (`max_claim_wait_s`), so a claim looks when it arrives, when woken and at its
deadline, never in between."""


def recheck_s(store: Store) -> float:
    """How often a waiting request looks again (`WaitLimits.recheck_s`) over `store`.

    On PostgreSQL what covers a lost notification: 0.25 s. Over MySQL a slow safety net, as the
    processes' changes reach one another through one poll per process
    (`store/mysql_wakeups.py`): 5 s. A FileStore or MemoryStore has one platform process,
    whose every change of note wakes its waiters at once, and whose due times (a retry's
    backoff) a waiting claim reads with what it read: no re-check at all. An idle fleet of
    5,000 Runs then costs 400 reads a second (each claim looks when it arrives and at its
    deadline), not 1,700 (every 2.5 to 5 s besides) or 20,000 (every 0.25 s)."""
    if isinstance(store, PostgresStore):
        return SHARED_RECHECK_S
    return SAFETY_RECHECK_S if isinstance(store, MySQLStore) else LONE_RECHECK_S


def share_wakeups(
    store: Store, service: SchedulingService
) -> PostgresWakeups | MySQLWakeups | None:
    """On PostgreSQL and MySQL, wake-ups across the platform processes on one database: the
    service's committed job changes are announced to the others, and theirs wake its waiters
    (started and stopped by the app's lifespan). None on the other stores."""
    if not isinstance(store, PostgresStore | MySQLStore):
        return None
    wakeups = store.wakeups(service.waiters.peer_changed, service.waiters.peers_missed)
    service.listen(Announcer(wakeups))
    service.share_touches(wakeups)
    return wakeups


def channels_for(store: Store) -> Channels:
    """The request channels over `store`, with the default limits.

    Memory and file stores answer from memory, the page cache or one fsync: their work runs on
    the event loop, without thread hops (MySQL and PostgreSQL wait on the network). Over
    FileStore it goes through the store's loop flusher (`run_in_group`): the calls made while a
    COMMIT is on its way share the next one (peer bench: about 470 -> 575 jobs/s, p50 +0.5 ms;
    docs/benchmarks.md). It had waited for the noisy-neighbour test: every call through it
    waited for a task's turns on a loop an attacker's sockets keep busy (claims at up to 3x
    their quiet latency). A call made while nothing is in flight is now applied in place,
    and the test's ratios are those of inline work (0.94-1.02).
    """
    return Channels.with_limits(
        inline=isinstance(store, MemoryStore | FileStore),
        group=store.run_in_group if isinstance(store, FileStore) else None,
    )


def build_platform(config: PlatformConfig) -> Platform:
    """Open everything the platform needs; errors are `MoonrunError`s with one clear line."""
    store = open_store(config.store_url)
    try:
        secret = load_or_create_secret(config.secret_path)
        clock, tokens = SystemClock(), SystemTokenSource()
        waiting = WaitLimits(recheck_s=recheck_s(store))
        service = SchedulingService(store, clock, tokens, config.scheduling, waiting)
        peers = share_wakeups(store, service)
        directory = Directory(store, clock, tokens)
        if config.bootstrap_admin_token:
            admin, outcome = directory.bootstrap_admin(config.bootstrap_admin_token)
            # Never the token itself: the log goes where operators and collectors read it.
            fields = {"fields": {"user": admin.name, "user_id": admin.id}}
            if outcome is Bootstrap.ROTATED:
                logging.getLogger("moonrun.platform").warning(
                    f"bootstrap admin token rotated: {admin.name}'s API token is now "
                    "MOONRUN_BOOTSTRAP_ADMIN_TOKEN; its previous tokens no longer work",
                    extra=fields,
                )
            elif outcome is Bootstrap.CREATED:
                logging.getLogger("moonrun.platform").info(
                    f"bootstrap admin {admin.name} created, holding MOONRUN_BOOTSTRAP_ADMIN_TOKEN",
                    extra=fields,
                )
        return Platform(
            service=service,
            directory=directory,
            web=WebSessions(store, clock, secret),
            clock=clock,
            secret=secret,
            logs=log_store(config, store),
            artifacts=FileArtifactStore(
                config.artifacts_dir, attempt_bytes=config.artifacts.attempt_bytes
            ),
            channels=channels_for(store),
            http=HttpSettings(sweep_interval_s=config.sweep_interval_s),
            release=store.close,
            peers=peers,
            # Beside a database several processes share, they count failed sign-ins together.
            sign_in_ledger=(
                FileLedger(config.sign_in_dir)
                if isinstance(store, MySQLStore | PostgresStore)
                else None
            ),
        )
    except BaseException:
        store.close()
        raise
