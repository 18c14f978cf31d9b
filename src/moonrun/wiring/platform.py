"""The Platform bundle: everything the HTTP service and the console are given, built once
(`settings.py`, or a test with a manual clock) and passed in.

It is what `http/` asks for (`http.platform.HttpPlatform`) and what `web/` asks for
(`web.pages.ConsolePlatform`): each room says what it needs, in its own terms, and this
bundle has it all (mypy checks both where `app.py` hands it over).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from moonrun.artifacts.protocol import ArtifactStore
from moonrun.clock import Clock
from moonrun.http.channels import Channels
from moonrun.http.load import LoopLag
from moonrun.http.metrics import Metrics
from moonrun.http.platform import HttpSettings
from moonrun.logs.protocol import LogStore
from moonrun.security.keys import NonceCache
from moonrun.security.sign_in_ledger import Ledger
from moonrun.security.signing import WINDOW_S
from moonrun.service.directory import Directory
from moonrun.service.scheduling import SchedulingService
from moonrun.service.waiting import Watch
from moonrun.service.websessions import SignInThrottle, WebSessions
from moonrun.store.mysql_wakeups import MySQLWakeups
from moonrun.store.pg_wakeups import PostgresWakeups


@dataclass
class Platform:
    """The platform's parts. It holds the use cases, never the store: the HTTP and console
    rooms reach the store only through them (docs/architecture.md). `release` closes the store
    for whoever opened it."""

    service: SchedulingService
    directory: Directory
    web: WebSessions
    clock: Clock
    secret: bytes
    logs: LogStore
    artifacts: ArtifactStore
    release: Callable[[], None] = lambda: None
    peers: PostgresWakeups | MySQLWakeups | None = None
    """Wake-ups across the platform processes on one PostgreSQL or MySQL database (None on
    the other stores): the app's lifespan starts and stops them."""
    sign_in_ledger: Ledger | None = None
    """Where failed sign-ins are counted: this process's memory unless given (several platform
    processes share files in their data directory)."""
    channels: Channels = field(default_factory=Channels.with_limits)
    http: HttpSettings = field(default_factory=HttpSettings)
    metrics: Metrics = field(init=False)
    lag: LoopLag = field(default_factory=LoopLag)
    """How far behind the event loop runs (measured while the app runs)."""
    nonces: NonceCache = field(default_factory=lambda: NonceCache(WINDOW_S))
    started_at_s: float = field(init=False)
    throttle: SignInThrottle = field(init=False)
    watch: Watch = field(init=False)
    """The service's waiters (`service.waiters`): who waits for which job or endpoint."""

    def close(self) -> None:
        """Release the channels' threads (the store is closed by `release`, for whoever opened
        it)."""
        self.channels.close()

    def __post_init__(self) -> None:
        self.metrics = Metrics(
            self.service.job_counts,
            self.service.waiters.held,
            lag_s=lambda: self.lag.lag_s,
            connected=self.service.connected_runs,
            heartbeat_interval_s=self.service.told_heartbeat_interval_s,
        )
        self.started_at_s = self.clock.now() / 1000
        self.throttle = SignInThrottle(self.clock, ledger=self.sign_in_ledger)
        self.watch = self.service.waiters
