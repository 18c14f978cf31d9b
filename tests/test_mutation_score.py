"""`scripts/mutation_score.py`: which mutants count for which area, and what fails the gate."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType


def load_script() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "scripts" / "mutation_score.py"
    spec = importlib.util.spec_from_file_location("mutation_score", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


score = load_script()


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
