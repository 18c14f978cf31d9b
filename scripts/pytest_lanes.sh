#!/usr/bin/env bash
# `make test`'s pytest in two lanes on this machine's cores (docs/testing.md, "How make test runs").
#
# The tests that drive real platform and Run processes (marker `processes`) time leases, acks
# and timeouts against the wall clock, at normal priority. They mostly wait on those clocks,
# so they run two at a time (two xdist workers, a module each), except those marked `alone`
# (they time something, or look at the whole machine), which run one at a time first: they
# leave the cores idle most of the time, which the parallel lane then fills.
# Everything else (in-process stores, the simulation, property tests) runs beside them on
# WORKERS pytest-xdist workers at a lower priority, so it soaks up idle cores without stealing
# a deadline from the real-process lane. The parallel lane's report prints after the
# real-process one's; the exit status is the worst of the three runs.
set -uo pipefail
BIN="${1:-.venv/bin}"
WORKERS="${2:-2}"
shift $(($# < 2 ? $# : 2))  # the rest goes to every pytest
report="$(mktemp)"
trap 'rm -f "$report"' EXIT

# pytest rewrites the asserts of every test module it imports, and keeps the result only where
# Python may write bytecode: without it, each of the lanes' five sessions (three of them xdist
# workers) would rewrite and compile every test module again (15 s of CPU each, 7 s cached).
unset PYTHONDONTWRITEBYTECODE
# The lanes are folders (tests/project/test_lanes.py): with no arguments, each session
# collects only its own, not the 5,000 tests it would deselect.
process_tests=() other_tests=()
if [ "$#" -eq 0 ]; then process_tests=(tests/process) other_tests=(--ignore=tests/process); fi

nice -n 10 "$BIN/pytest" -n "$WORKERS" -m "not processes" -p no:cacheprovider \
    "${other_tests[@]}" "$@" >"$report" 2>&1 &
parallel=$!
"$BIN/pytest" -m "processes and alone" "${process_tests[@]}" "$@"
alone=$?
echo
echo "==== the other real-process tests, two at a time ===="
"$BIN/pytest" -n 2 --dist loadfile -m "processes and not alone" "${process_tests[@]}" "$@"
together=$?
wait "$parallel"
rest=$?
echo
echo "==== the parallel lane (not processes, $WORKERS workers) ===="
cat "$report"
# 5 is "no tests collected": fine for one run when arguments select only another's tests.
if [ "$together" -eq 5 ] && [ "$alone" -eq 5 ] && [ "$rest" -eq 5 ]; then exit 5; fi
for status in "$together" "$alone" "$rest"; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
exit 0
