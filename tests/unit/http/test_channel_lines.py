"""Channel lines: a Run's request that finds its control or jobs channel full waits a moment
in line for a place instead of being refused; the line is bounded in length and in time, goes
first come first, and forgets a request whose client left."""

from __future__ import annotations

import asyncio

import pytest

from moonrun.errors import ChannelBusy
from moonrun.http import channels
from moonrun.http.channels import Admission, Channel, Channels


def full(limit: int = 1, line: int = 2) -> tuple[Channel, list[Admission]]:
    """A channel whose `limit` places are all held."""
    channel = Channel("control", limit, line=line)
    held = [channel.admit() for _ in range(limit)]
    for admission in held:
        admission.enter()
    return channel, held


async def settled() -> None:
    """Let every task that can run do so."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_request_that_finds_its_channel_full_is_admitted_when_a_place_frees() -> None:
    async def scenario() -> tuple[bool, int, int]:
        channel, (holder,) = full()
        waiter = channel.admit()
        entered = asyncio.create_task(waiter.enter_in_line())
        await settled()
        waited = not entered.done()
        holder.leave()
        await entered
        return waited, channel.in_flight, len(channel.waiting)

    assert asyncio.run(scenario()) == (True, 1, 0)


def test_places_go_to_the_line_first_come_first() -> None:
    async def scenario() -> list[int]:
        channel, (holder,) = full(line=3)
        order: list[int] = []

        async def wait(n: int) -> None:
            admission = channel.admit()
            await admission.enter_in_line()
            order.append(n)
            await settled()
            admission.leave()

        tasks = [asyncio.create_task(wait(n)) for n in range(3)]
        await settled()
        late = channel.admit()  # arrives while others wait: it may not pass them
        with pytest.raises(ChannelBusy):
            late.enter()
        holder.leave()
        await asyncio.gather(*tasks)
        assert channel.in_flight == 0
        return order

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_a_full_line_is_refused_at_once() -> None:
    async def scenario() -> None:
        channel, _ = full(line=1)
        first = asyncio.create_task(channel.admit().enter_in_line())
        await settled()
        with pytest.raises(ChannelBusy, match="at its limit of 1"):
            await channel.admit().enter_in_line()
        first.cancel()
        await settled()

    asyncio.run(scenario())


def test_a_channel_without_a_line_refuses_at_once() -> None:
    async def scenario() -> None:
        channel, _ = full(line=0)
        with pytest.raises(ChannelBusy):
            await channel.admit().enter_in_line()
        assert len(channel.waiting) == 0

    asyncio.run(scenario())


def test_a_request_whose_place_never_comes_is_refused_after_the_line_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(channels, "LINE_WAIT_S", 0.01)

    async def scenario() -> tuple[int, int]:
        channel, _ = full()
        with pytest.raises(ChannelBusy, match=r"stayed at its limit of 1 for 0\.01 s"):
            await channel.admit().enter_in_line()
        return channel.in_flight, len(channel.waiting)

    assert asyncio.run(scenario()) == (1, 0)


def test_a_request_whose_client_left_while_in_line_takes_no_place() -> None:
    async def scenario() -> tuple[int, int, bool]:
        channel, (holder,) = full()
        gone = asyncio.create_task(channel.admit().enter_in_line())
        await settled()
        gone.cancel()
        await settled()
        holder.leave()
        return channel.in_flight, len(channel.waiting), gone.cancelled()

    assert asyncio.run(scenario()) == (0, 0, True)


def test_a_place_handed_to_a_request_cancelled_meanwhile_passes_to_the_next() -> None:
    async def scenario() -> tuple[int, bool]:
        channel, (holder,) = full()
        first = channel.admit()
        first_task = asyncio.create_task(first.enter_in_line())
        second = channel.admit()
        second_task = asyncio.create_task(second.enter_in_line())
        await settled()
        holder.leave()  # the place is handed to the first...
        first_task.cancel()  # ...whose client leaves before it runs again
        await settled()
        await second_task
        return channel.in_flight, second.held

    assert asyncio.run(scenario()) == (1, True)


def test_only_the_runs_control_and_jobs_channels_have_lines() -> None:
    made = Channels.with_limits()
    lined = {
        name: getattr(made, name).line
        for name in ("control", "jobs", "sessions", "logs", "artifacts", "user", "ops", "anonymous")
    }
    assert {name for name, line in lined.items() if line} == {"control", "jobs"}
