#!/usr/bin/env bash
# The README's main-job command on the embedded default (tiny model, bundled example environment).
# Sets everything up first (idempotent), then runs the job. Extra arguments go to the job.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/setup.sh
exec .venv/bin/python -m nemo_gym_adapter.collect "$@"
