#!/usr/bin/env bash
# The unit tier N times (as scripts/test.sh runs it: two pytest-xdist workers) with both cores kept busy beside it by
# two CPU hogs (`python3 -c "while 1: pass"`), to find tests that decide on a wall-clock tie (issue 36 item 7;
# docs/CI.md's rule). Not a test: a measurement; each run's result, wall time and load average are printed, and any
# failing test is listed. One heavy job: run it alone (e.g. under `flock` of your own).
#
#   bash benchmarks/unit_tier_under_load.sh [N=5] [OUT_DIR=.cache-own/unit-under-load]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N="${1:-5}"
OUT="${2:-.cache-own/unit-under-load}"
mkdir -p "$OUT"
hogs=()
for _ in 1 2; do python3 -c "while 1: pass" & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
echo "hogs: ${hogs[*]} (both cores busy); $(nproc) cores; $(git rev-parse --short HEAD)"
passed_runs=0
for i in $(seq 1 "$N"); do
  l0="$(cut -d' ' -f1-3 /proc/loadavg)"
  t0=$SECONDS
  .venv/bin/python -m pytest tests -m "not integration and not e2e" -n 2 --timeout=900 -p no:cacheprovider -q \
    > "$OUT/run$i.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] && passed_runs=$((passed_runs + 1))
  summary="$(grep -E '[0-9]+ (passed|failed)' "$OUT/run$i.log" | tail -1)"
  echo "run $i: rc=$rc $((SECONDS - t0)) s; load $l0 -> $(cut -d' ' -f1-3 /proc/loadavg); $summary"
  grep -E '^FAILED|^ERROR' "$OUT/run$i.log"
done
echo "passed $passed_runs of $N runs"
[ "$passed_runs" = "$N" ]
