#!/usr/bin/env bash
# The README's main-job command on the embedded default: GRPO of the tiny model on the bundled toy Gym environment
# (configs/nemo_gym_cpu_toy.yaml), CPU only; writes a reward-curve PNG next to its metrics at the end.
# Sets everything up first (idempotent), then runs the job. Extra arguments go to the job.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/setup.sh
# the launch starts here, not with this shell: exec keeps its process (and its start time) for the driver
NGV_LAUNCH_T0="$(date +%s.%N)" exec .venv/bin/python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_toy "$@"
