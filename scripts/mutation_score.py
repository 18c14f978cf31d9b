"""The mutation score of `make mutate`, per area, from mutmut's results in `mutants/`.

    python scripts/mutation_score.py [--survivors] [--min 90]

A mutant is killed when a test failed (or timed out) with it applied; it survived when every
test passed; "no tests" means no selected test ran its function at all (it counts against the
score: nothing would notice it). The score of an area is killed / (killed + survived + no
tests). With `--min`, the exit status is 1 when an area scores below it (docs/testing.md); an
area none of whose mutants ran (`make mutate MUTANTS=...` chose others) is "not run", not a
failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

MUTANTS = Path(__file__).resolve().parent.parent / "mutants"
FENCING_AREA = "service/scheduling.py fencing"
KILLED = {1, 3, 36, 24, -24, 152, 255, 37}
SURVIVED = {0}
NO_TESTS = {5, 33}
FENCING = (
    "check_transfer",
    "claim_now",
    "_session_and_endpoint",
    "_caller",
    "_apply_passed_deadlines",
    "_apply",
    "_apply_many",
    "_apply_deadline",
    "_deadline_decision",
    "sweep",
    "reconcile",
)
"""The service's fencing paths: the functions `make mutate` runs the mutants of."""
SCHEDULING = "moonrun.service.scheduling."
AREAS: dict[str, tuple[tuple[str, tuple[str, ...] | None], ...]] = {
    "scheduling/": (("moonrun.scheduling.", None),),
    "security/signing.py": (("moonrun.security.signing.", None),),
    FENCING_AREA: ((SCHEDULING, FENCING),),
    "store/group_commit.py": (("moonrun.store.group_commit.", None),),
    "store/file.py": (("moonrun.store.file.", None),),
    "store/sql.py claim, update": (
        # Not `_count`: FileStore counts by trigger; only MySQL, never mutated here, calls it.
        (
            "moonrun.store.sql.",
            ("_claim_order", "_cas", "replace_job", "update_jobs", "claim_jobs"),
        ),
    ),
    "run/journal.py": (("moonrun.run.journal.", None),),
    "waiting claims, reads": (
        ("moonrun.service.waiting.", None),
        (SCHEDULING, ("wait_for_claim", "_due_s", "wait_for_job")),
    ),
    "batch routes": (
        ("moonrun.http.run_api.", ("ack_batch", "result_batch", "_refusal")),
        (SCHEDULING, ("ack_many", "result_many", "_check_batch", "_check_messages")),
    ),
    "logs/": (("moonrun.logs.", None),),
    "artifacts/": (("moonrun.artifacts.", None),),
    "run/confinement.py": (("moonrun.run.confinement.", None),),
    "http/edge.py": (("moonrun.http.edge.", None),),
}
"""Each area: the modules (by prefix) it covers, whole (None) or only the functions named."""


def area_of(key: str) -> str | None:
    for area, parts in AREAS.items():
        for prefix, functions in parts:
            if key.startswith(prefix) and (functions is None or function_of(key) in functions):
                return area
    return None


def function_of(key: str) -> str:
    """The function (or method) a mutant changes: `a.b.xǁClassǁname__mutmut_3` -> `name`."""
    function = key.rsplit("__mutmut_", 1)[0].rsplit("ǁ", 1)[-1].rsplit(".", 1)[-1]
    return function.removeprefix("x_")


def is_fencing(key: str) -> bool:
    return function_of(key) in FENCING


def scored(count: Counter[str]) -> int:
    """How many of an area's mutants ran: killed, survived or reached by no test."""
    return count["killed"] + count["survived"] + count["no tests"]


def below(counts: dict[str, Counter[str]], minimum: float | None) -> list[str]:
    """The areas whose mutants ran and scored below `minimum` (%)."""
    if minimum is None:
        return []
    return [
        area
        for area, count in counts.items()
        if scored(count) and 100 * count["killed"] / scored(count) < minimum
    ]


def results() -> dict[str, int | None]:
    found: dict[str, int | None] = {}
    for meta in sorted(MUTANTS.rglob("*.meta")):
        found.update(json.loads(meta.read_text())["exit_code_by_key"])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--survivors", action="store_true", help="list surviving mutants")
    parser.add_argument("--min", type=float, default=None, help="fail below this score (%%)")
    options = parser.parse_args()
    if not MUTANTS.is_dir():
        print("no mutants/: run `make mutate` first", file=sys.stderr)
        return 2
    counts: dict[str, Counter[str]] = {area: Counter() for area in AREAS}
    survivors: list[str] = []
    for key, code in results().items():
        area = area_of(key)
        if area is None:
            continue
        if code in KILLED:
            counts[area]["killed"] += 1
        elif code in SURVIVED:
            counts[area]["survived"] += 1
            survivors.append(key)
        elif code in NO_TESTS:
            counts[area]["no tests"] += 1
            survivors.append(key)
        else:
            counts[area]["not checked" if code is None else f"other ({code})"] += 1
    failing = below(counts, options.min)
    for area, count in counts.items():
        ran = scored(count)
        rest = ", ".join(f"{v} {k}" for k, v in sorted(count.items()) if k != "killed")
        if not ran:
            print(f"{area:30} not run ({rest or 'no mutants'})")
            continue
        score = 100 * count["killed"] / ran
        print(f"{area:30} {score:5.1f}%  {count['killed']} of {ran} killed ({rest or 'none'})")
    if options.survivors:
        print("\nsurviving mutants (mutmut show NAME):")
        for key in sorted(survivors):
            print(f"  {key}")
    if failing:
        print(f"below {options.min}%: {', '.join(failing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
