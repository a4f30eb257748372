#!/usr/bin/env bash
# The README's test command: set up what the tests need (scripts/setup_tests.sh: idempotent, seconds when done) and
# run every test tier.
#   bash scripts/test.sh                 # unit + integration + e2e (what CI runs)
#   bash scripts/test.sh -m "not integration and not e2e"   # unit only, seconds
# Extra arguments go to pytest.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/setup_tests.sh
# --durations: the slowest tests, printed at the end of every run (the CI budget is ~45 min; see docs/BENCHMARKS.md).
exec .venv/bin/python -m pytest tests --timeout=900 --durations=25 "$@"
