"""A registration applied after a later-asked one of its endpoint is refused, on every store
(docs/protocol.md, "Joining and sessions").

A Run whose registration is slow to answer gives up and registers again; the first one may
still be applied afterwards. It must not rotate away the session the Run was answered with.
"""

from __future__ import annotations

from typing import Any

import pytest

from moonrun.errors import RegistrationSuperseded
from moonrun.service.scheduling import SchedulingService
from moonrun.store.protocol import Store
from tests.support.harness import World

SECOND = 1000


def register(service: SchedulingService, world: World, **fields: Any) -> str:
    registration = service.register_session(
        world.endpoint.id, boot_id="boot-1", run_version="1.0", capacity=4, **fields
    )
    return registration.session.id


def test_a_registration_asked_before_the_current_session_was_made_is_refused(
    world: World,
) -> None:
    """Asked first, applied last: refused, and the later one's session stays current."""
    first_asked = world.clock.now()
    world.clock.advance(5 * SECOND)
    later = register(world.service, world)
    world.clock.advance(SECOND)

    with pytest.raises(RegistrationSuperseded):
        register(world.service, world, asked_at=first_asked)

    assert world.service.authenticate_session(later).id == later
    endpoint = world.store.get_endpoint(world.endpoint.id)
    assert endpoint is not None
    assert endpoint.current_session_id == later


def test_a_registration_asked_after_the_current_session_rotates_it(world: World) -> None:
    """The usual case is untouched: a Run registering again replaces its session."""
    first = register(world.service, world)
    world.clock.advance(SECOND)
    second = register(world.service, world)
    assert second != first
    endpoint = world.store.get_endpoint(world.endpoint.id)
    assert endpoint is not None
    assert endpoint.current_session_id == second


class LosesTheFirstSwap:
    """A store where a later registration of the same endpoint lands just before the first
    registration's compare-and-swap (two platform threads applying a Run's two asks)."""

    def __init__(self, store: Store, meanwhile: Any) -> None:
        self.inner = store
        self.meanwhile = meanwhile
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def replace_endpoint(self, endpoint: Any, expected_version: int) -> bool:
        if not self.raced:
            self.raced = True
            self.meanwhile()
        return bool(self.inner.replace_endpoint(endpoint, expected_version))


def test_a_registration_that_loses_its_swap_to_a_later_one_does_not_try_again(
    world: World,
) -> None:
    """The first registration reads the endpoint, a later one is applied meanwhile, the
    first's swap fails: it is refused rather than applied again over the later session."""
    later: list[str] = []

    def later_registration() -> None:
        world.clock.advance(5 * SECOND)
        later.append(register(world.service, world))

    racing = LosesTheFirstSwap(world.store, later_registration)
    service = SchedulingService(racing, world.clock, world.tokens, world.settings)

    with pytest.raises(RegistrationSuperseded):
        register(service, world)

    endpoint = world.store.get_endpoint(world.endpoint.id)
    assert endpoint is not None
    assert endpoint.current_session_id == later[0]
    assert world.service.authenticate_session(later[0]).id == later[0]
