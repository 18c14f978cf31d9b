"""`scripts/mutation_score.py` scores each area issue 22 added on its own functions, and every
area is held to the bound."""

from __future__ import annotations

from collections import Counter

import pytest
from scripts import mutation_score as score

SERVICE = "moonrun.service.scheduling.xǁSchedulingServiceǁ"


@pytest.mark.parametrize(
    ("key", "area"),
    [
        ("moonrun.store.sql.xǁSqlStoreǁclaim_jobs__mutmut_7", "store/sql.py claim, update"),
        ("moonrun.store.sql.x__claim_order__mutmut_1", "store/sql.py claim, update"),
        ("moonrun.store.sql.xǁSqlStoreǁlist_users__mutmut_1", None),
        (SERVICE + "wait_for_claim__mutmut_2", "waiting claims, reads"),
        ("moonrun.service.waiting.xǁWatchǁunregister__mutmut_1", "waiting claims, reads"),
        (SERVICE + "result_many__mutmut_4", "batch routes"),
        ("moonrun.http.run_api.x_ack_batch__mutmut_1", "batch routes"),
        ("moonrun.http.run_api.x_claim__mutmut_1", None),
        (SERVICE + "check_transfer__mutmut_3", score.FENCING_AREA),
        ("moonrun.logs.file.xǁFileLogStoreǁ_dropped_for_total__mutmut_2", "logs/"),
        ("moonrun.http.edge.xǁGuardedProtocolǁ_settle__mutmut_9", "http/edge.py"),
    ],
)
def test_a_mutant_counts_for_the_area_of_its_function(key: str, area: str | None) -> None:
    assert score.area_of(key) == area


def test_every_area_that_ran_is_held_to_the_bound() -> None:
    counts = {
        "scheduling/": Counter({"killed": 95, "survived": 5}),
        "http/edge.py": Counter({"killed": 89, "survived": 11}),
        "logs/": Counter({"not checked": 40}),
    }
    assert score.below(counts, 90.0) == ["http/edge.py"]
