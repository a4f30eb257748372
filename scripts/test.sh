#!/usr/bin/env bash
# The README's test command: set up what the tests need (scripts/setup_tests.sh: idempotent, seconds when done) and
# run the test tiers.
#   bash scripts/test.sh                 # unit + integration + e2e, the slow tier left out (what CI runs)
#   bash scripts/test.sh --slow          # only the slow tier (tests marked slow; docs/CI.md lists them)
#   bash scripts/test.sh --with-slow     # everything
#   bash scripts/test.sh -m "not integration and not e2e"   # unit only, minutes
# Extra arguments go to pytest (--slow and --with-slow are options of tests/conftest.py) in one session.
#
# With no arguments (CI) it runs two sessions: the unit tier on two pytest-xdist workers (its tests wait on
# subprocesses and sockets as much as they compute: 345 s in one process on a fresh clone, CPU time ~160 s), then the
# integration and e2e tiers in one process, one at a time (each starts vLLM, Gym and Ray: two at once do not fit the
# machine). Both always run; the exit status is the first failure's.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/setup_tests.sh
PYTEST=(.venv/bin/python -m pytest tests --timeout=900)
# --durations: the slowest tests, and the time per tier (tests/conftest.py), printed at the end of every session
# (the CI budget is 45 min in all; docs/CI.md).
if [ $# -gt 0 ]; then
  exec "${PYTEST[@]}" --durations=25 "$@"
fi
status=0
"${PYTEST[@]}" -m "not integration and not e2e" -n 2 --durations=10 -v || status=$?
"${PYTEST[@]}" -m "integration or e2e" --durations=25 -v || { rc=$?; [ "$status" != 0 ] || status=$rc; }
exit "$status"
