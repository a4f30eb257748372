#!/usr/bin/env bash
# Lint and type checks, what CI runs after set-up and before the tests (seconds; the first failure stops it):
#   ruff check (rules in pyproject.toml), ruff format --check, mypy over nemo_gym_adapter/ and recipe/.
#   bash scripts/lint.sh          # from anywhere; needs the trainer venv (.venv) that scripts/setup.sh builds
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${NGV_LINT_PYTHON:-$REPO/.venv/bin/python}"
step() { printf '[lint] %s\n' "$*"; }
step "ruff check"
"$PY" -m ruff check .
step "ruff format --check"
"$PY" -m ruff format --check .
step "mypy (nemo_gym_adapter, recipe)"
"$PY" -m mypy
step "ok"
