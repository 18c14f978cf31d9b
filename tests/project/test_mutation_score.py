"""`scripts/mutation_score.py`: which mutants count for which area, and what fails the gate."""

from __future__ import annotations

from collections import Counter

from scripts import mutation_score as score


def test_only_the_fencing_paths_of_the_service_count_for_its_area() -> None:
    """A mutant of `check_transfer` counts; one of `create_job` (not a fencing path) does not."""
    prefix = "moonrun.service.scheduling.xǁSchedulingServiceǁ"
    expected = (score.FENCING_AREA, None, "scheduling/")
    actual = (
        score.area_of(prefix + "check_transfer__mutmut_3"),
        score.area_of(prefix + "create_job__mutmut_3"),
        score.area_of("moonrun.scheduling.retry.x_backoff_s__mutmut_1"),
    )
    assert expected == actual


def test_an_area_whose_mutants_did_not_run_is_not_below_the_bound() -> None:
    """`make mutate MUTANTS=...` over one function leaves the other areas unscored, not failed."""
    counts = {
        "scheduling/": Counter({"not checked": 2349}),
        "security/signing.py": Counter({"killed": 8, "survived": 2}),
        score.FENCING_AREA: Counter({"killed": 33, "survived": 3}),
    }
    expected = ["security/signing.py"]
    assert expected == score.below(counts, 90.0)
