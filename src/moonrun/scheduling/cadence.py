"""How often Runs heartbeat: stretched as the fleet grows, so that one platform process answers
at most a bounded number of heartbeats a second, whatever the fleet's size.

Nomad sizes its clients' heartbeat TTL the same way (`max_heartbeats_per_second`): an idle
fleet's cost is its heartbeats, and a fixed interval makes that cost grow with every host.
"""

from __future__ import annotations

import math

STRETCH_STEP = 0.5
"""Stretches are whole multiples of this, so that the timings told to Runs do not change with
every Run that comes or goes."""


def heartbeat_stretch(runs: int, interval_s: float, max_per_s: float) -> float:
    """The factor (at least 1) by which the heartbeat interval and the session TTL are
    stretched for `runs` Runs heartbeating to one platform process every `interval_s`, so that
    they send at most about `max_per_s` heartbeats a second. 1 when `max_per_s` is 0 (never
    stretched)."""
    if max_per_s <= 0 or interval_s <= 0:
        return 1.0
    wanted = runs / (max_per_s * interval_s)
    return max(1.0, math.ceil(wanted / STRETCH_STEP) * STRETCH_STEP)
