"""An endpoint is online while its Run's last heartbeat is at most the liveness bound old (the
heartbeat interval plus 5 s: 15 s with the defaults), not until its session would expire; and
once offline it still shows when it was last seen and what it offered (docs/protocol.md,
"Liveness")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moonrun.scheduling.records import Endpoint, Session
from moonrun.scheduling.views import endpoint_view
from moonrun.service.config import SchedulingSettings

T0 = 1_780_000_000_000
LAST_BEAT = T0 + 20_000
BOUND_MS = SchedulingSettings().liveness_bound_ms


def endpoint(current_session_id: str | None = "ses_1") -> Endpoint:
    return Endpoint(
        id="ep_1",
        name="host-a",
        created_at=T0,
        join_token_hash="h",
        join_token_expires_at=T0 + 1_000,
        joined_at=T0 + 10,
        generation=3,
        current_session_id=current_session_id,
    )


def session() -> Session:
    """Seen last at LAST_BEAT; its expiry (fencing) is 50 s after an extension at T0 + 10 s,
    so it outlives the liveness bound by far, as a killed Run's session does."""
    return Session(
        id="ses_1",
        endpoint_id="ep_1",
        generation=3,
        boot_id="boot",
        capacity=6,
        run_version="1.2.3",
        created_at=T0,
        last_seen_at=LAST_BEAT,
        expires_at=T0 + 60_000,
    )


def test_the_liveness_bound_is_the_heartbeat_interval_plus_five_seconds() -> None:
    assert (
        SchedulingSettings().liveness_bound_ms,
        SchedulingSettings(heartbeat_interval_s=1).liveness_bound_ms,
    ) == (15_000, 6_000)


def test_an_endpoint_is_online_until_the_bound_after_its_last_heartbeat_and_offline_after() -> None:
    """Online at exactly 15 s after the last beat, offline a millisecond later, while the
    session itself has not expired (today's session would keep it online for 40 s more)."""
    online = [
        endpoint_view(endpoint(), session(), at, liveness_bound_ms=BOUND_MS)["online"]
        for at in (LAST_BEAT, LAST_BEAT + 15_000, LAST_BEAT + 15_001, T0 + 59_999)
    ]
    assert online == [True, True, False, False]


@pytest.mark.parametrize(
    ("current", "now"),
    [("ses_1", LAST_BEAT + 15_001), ("ses_1", T0 + 60_000), (None, LAST_BEAT + 1)],
    ids=["silent-past-the-bound", "session-expired", "session-ended"],
)
def test_an_offline_endpoint_still_shows_when_it_was_last_seen_and_what_it_offered(
    current: str | None, now: int
) -> None:
    """Past the bound, once the session expired, or once its Run ended it cleanly (the view is
    given the session that was current last): offline, with the last beat, the capacity and
    the Run version of that session."""
    view = endpoint_view(endpoint(current), session(), now, liveness_bound_ms=BOUND_MS)
    shown = (view["online"], view["last_seen_at"], view["capacity"], view["run_version"])
    assert shown == (False, "2026-05-28T20:27:00.000Z", 6, "1.2.3")


def test_a_recent_heartbeat_does_not_make_an_expired_session_online() -> None:
    """Fencing stays on the session's expiry: a beat does not revive an expired session."""
    expired = replace(session(), last_seen_at=T0 + 59_000)
    view = endpoint_view(endpoint(), expired, T0 + 60_000, liveness_bound_ms=BOUND_MS)
    assert view["online"] is False
