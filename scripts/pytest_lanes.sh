#!/usr/bin/env bash
# `make test`'s pytest in two lanes on this machine's cores (docs/testing.md, "How make test runs").
#
# The tests that drive real platform and Run processes (marker `processes`) time leases, acks
# and timeouts against the wall clock, so they run one at a time at normal priority. Everything
# else (in-process stores, the simulation, property tests) runs beside them on WORKERS
# pytest-xdist workers at a lower priority, so it soaks up idle cores without stealing a
# deadline from the serial lane. The parallel lane's report prints after the serial one's;
# the exit status is the worse of the two.
set -uo pipefail
BIN="${1:-.venv/bin}"
WORKERS="${2:-2}"
shift $(($# < 2 ? $# : 2))  # the rest goes to both pytests
report="$(mktemp)"
trap 'rm -f "$report"' EXIT

nice -n 10 "$BIN/pytest" -n "$WORKERS" -m "not processes" -p no:cacheprovider "$@" >"$report" 2>&1 &
parallel=$!
"$BIN/pytest" -m processes "$@"
serial=$?
wait "$parallel"
rest=$?
echo
echo "==== the parallel lane (not processes, $WORKERS workers) ===="
cat "$report"
# 5 is "no tests collected": fine for one lane when arguments select only the other's tests.
if [ "$serial" -eq 5 ] && [ "$rest" -eq 5 ]; then exit 5; fi
for status in "$serial" "$rest"; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
exit 0
