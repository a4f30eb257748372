#!/usr/bin/env bash
# The SGLang 0.5.12 test venv: SGLang's serving layer (verl 0.9.1's `verl[sglang]` pin) on a CPU machine, so
# tests/integration/sglang/test_sglang_hook.py executes the SGLang token-ID patch against SGLang's real classes inside
# verl's own SGLangHttpServer, only the model forward scripted. Idempotent and cached (a second run takes well under a
# second); scripts/setup_tests.sh calls it (test-only: the main job never needs it). Git-ignored, under .cache/.
#
#   .cache/sglang-venv   Python of the trainer venv, layered on it: a .pth adds .venv's site-packages (CPU torch, verl,
#                        Ray, fastapi, ...) behind the venv's own, which holds only what differs:
#                          sglang==0.5.12 --no-deps   the wheel's Python code; its CUDA kernels are never loaded
#                          transformers==5.9.0        what verl[sglang] pins (the trainer has 5.10.4)
#                          gguf, soundfile            imported at module level by SGLang / mistral_common
#                        and the import stubs (tests/sglang/ngv_sglang_stubs.py, installed by a .pth) for torchvision
#                        (the PyPI wheel is a CUDA build whose ops fail to register on CPU torch), IPython and
#                        sgl_kernel (CUDA only). docs/SGLANG.md says why each.
#
# Layered, not a copy: the trainer venv is ~4 GB, this one adds ~200 MB. Made --without-pip (the trainer's pip installs
# into it with --python), and checked with a cheap import: the full server import is what the test itself does first.
# Rebuilt when the pins, the stub module or the trainer venv's stamp change.
# Knobs: NGV_CACHE_DIR (default .cache), NGV_SETUP_NO_INSTALL=1 (check only). NGV_SKIP_SGLANG=1 is read by the callers.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
# shellcheck source=scripts/layered_venv.sh
source "$REPO/scripts/layered_venv.sh"
CACHE="${NGV_CACHE_DIR:-$REPO/.cache}"
VENV="$CACHE/sglang-venv"
TRAINER="$REPO/.venv"
STUBS="$REPO/tests/sglang/ngv_sglang_stubs.py"
export PIP_CACHE_DIR="$CACHE/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1

SGLANG_VERSION="0.5.12"        # verl 0.9.1: verl[sglang] -> sglang==0.5.12
TRANSFORMERS_VERSION="5.9.0"   # verl 0.9.1: verl[sglang] -> transformers==5.9.0 (sglang pins 5.6.0, which verl excludes)
PKGS=("sglang==$SGLANG_VERSION" "transformers==$TRANSFORMERS_VERSION" "gguf==0.19.0" "soundfile==0.13.1")

say() { printf '[setup-sglang] %s\n' "$*"; }
die() { printf '[setup-sglang] ERROR: %s\n' "$*" >&2; exit 1; }

[ -f "$TRAINER/.ngv-stamp" ] || die "the trainer venv ($TRAINER) is not set up: run scripts/setup.sh first"
[ -f "$STUBS" ] || die "stub module $STUBS missing"
SPEC="${PKGS[*]}|stubs:$(sha1sum "$STUBS" | cut -c1-12)|trainer:$(sha1sum "$TRAINER/.ngv-stamp" | cut -c1-12)"

if [ -f "$VENV/.ngv-stamp" ] && [ "$(cat "$VENV/.ngv-stamp")" = "$SPEC" ]; then
  say "SGLang $SGLANG_VERSION test venv up to date ($VENV)"
  exit 0
fi
[ -z "${NGV_SETUP_NO_INSTALL:-}" ] ||
  die "the SGLang $SGLANG_VERSION test venv ($VENV) is not set up for this checkout and NGV_SETUP_NO_INSTALL is set: run scripts/setup_tests.sh"

t0=$SECONDS
mkdir -p "$PIP_CACHE_DIR"
say "creating $VENV on the trainer venv's Python, layered on its site-packages"
layered_venv "$VENV" "$TRAINER"
say "installing ${PKGS[*]} without dependencies (the rest comes from the trainer venv)"
"$TRAINER/bin/python" -m pip --python "$VENV/bin/python" install -q --no-deps "${PKGS[@]}" \
  2> >(grep -v "is ignored: it is neither" >&2)
cp "$STUBS" "$SITE/ngv_sglang_stubs.py"
echo "import ngv_sglang_stubs; ngv_sglang_stubs.install()" > "$SITE/zzz_ngv_sglang_stubs.pth"
"$VENV/bin/python" -c "
import importlib.metadata as m, sys
import transformers
got = (m.version('sglang'), transformers.__version__)
sys.exit(0 if got == ('$SGLANG_VERSION', '$TRANSFORMERS_VERSION') else f'versions {got}')" ||
  die "the SGLang $SGLANG_VERSION test venv ($VENV) does not see its own packages first (see the error above)"
echo "$SPEC" > "$VENV/.ngv-stamp"
say "SGLang $SGLANG_VERSION test venv ready in $((SECONDS - t0)) s ($(du -sh "$VENV" | cut -f1))"
