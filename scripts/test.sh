#!/usr/bin/env bash
# The README's test command: set up what the tests need (scripts/setup_tests.sh: idempotent, seconds when done) and
# run the test tiers.
#   bash scripts/test.sh                 # unit + integration + e2e, the slow tier left out (what CI runs)
#   bash scripts/test.sh --slow          # only the slow tier (tests marked slow; docs/CI.md lists them)
#   bash scripts/test.sh --with-slow     # everything
#   bash scripts/test.sh -m "not integration and not e2e"   # unit only, minutes
# Extra arguments go to pytest (--slow and --with-slow are options of tests/conftest.py).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/setup_tests.sh
# --durations: the slowest tests, and the time per tier (tests/conftest.py), printed at the end of every run (the CI
# budget is 45 min in all; docs/CI.md).
exec .venv/bin/python -m pytest tests --timeout=900 --durations=25 "$@"
