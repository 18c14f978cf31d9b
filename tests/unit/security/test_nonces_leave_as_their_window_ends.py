"""The nonce cache forgets each nonce as its window ends, a few at every call, instead of
rebuilding itself every 10 s (which held its lock 0.8 s at a million nonces); what it refuses
is unchanged: a nonce seen again while its window lasts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moonrun.errors import Replayed
from moonrun.security.keys import NonceCache


def test_a_nonce_is_forgotten_at_the_first_call_after_its_window_ends() -> None:
    cache = NonceCache(window_s=1)
    cache.remember("session:s", "a", created=0.0, now_s=0.0)
    cache.remember("session:s", "b", created=2.0, now_s=2.0)
    assert len(cache) == 1


def test_nonces_created_out_of_order_each_leave_at_their_own_end() -> None:
    cache = NonceCache(window_s=10)
    cache.remember("session:s", "late", created=5.0, now_s=5.0)  # until 15
    cache.remember("session:s", "early", created=0.0, now_s=5.0)  # until 10
    cache.remember("session:s", "c", created=11.0, now_s=11.0)
    assert len(cache) == 2  # "early" left, "late" stays
    with pytest.raises(Replayed):
        cache.remember("session:s", "late", created=5.0, now_s=11.0)


@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.floats(0, 7), st.floats(0, 5)),
        max_size=60,
    )
)
def test_a_nonce_is_a_replay_exactly_while_its_window_lasts(
    calls: list[tuple[str, float, float]],
) -> None:
    """Against a model: a dict of every nonce's end, never purged. A signature is at most the
    window old when its nonce is remembered (`check_created` refuses older ones)."""
    cache, ends, now = NonceCache(window_s=7), dict[str, float](), 0.0
    for nonce, created_ago, step in calls:
        now += step
        created = max(0.0, now - created_ago)
        replay = nonce in ends and ends[nonce] >= now
        if replay:
            with pytest.raises(Replayed):
                cache.remember("session:s", nonce, created, now)
        else:
            cache.remember("session:s", nonce, created, now)
            ends[nonce] = created + 7
        assert len(cache) == sum(1 for end in ends.values() if end >= now)
