#!/usr/bin/env bash
# The vLLM 0.24 test venv: the released GPU wheel's Python code (verl 0.9.1's `verl[vllm]` pin), runnable on a CPU
# machine, so tests/integration/vllm/test_vllm024_hook.py executes our 0.20-0.24 hook against vLLM 0.24's real classes.
# Idempotent and cached (a second run takes a second); scripts/setup_tests.sh calls it. Git-ignored, under .cache/.
#
#   .cache/vllm024-venv   Python 3.11; vllm==0.24.0 installed --no-deps (the CUDA wheel: its compiled kernels are
#                         never loaded, nothing here runs a model), the pure-Python dependencies its serving, render
#                         and chat modules import, transformers as verl[vllm] pins it, and CPU torch.
#
# torch: vLLM 0.24 pins torch==2.11.0, whose PyPI wheel is the CUDA build (`import torch` then needs the nvidia-* libs,
# gigabytes); the CPU build of 2.11 is only on download.pytorch.org. We use the trainer's CPU torch instead: the render
# path uses torch only through imports and configs, never a kernel (see docs/VLLM024_HOOK.md).
#
# Knobs: NGV_CACHE_DIR (default .cache), NGV_VLLM024_PYTHON (default python3.11), NGV_SETUP_NO_INSTALL=1 (check only).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
CACHE="${NGV_CACHE_DIR:-$REPO/.cache}"
VENV="$CACHE/vllm024-venv"
export PIP_CACHE_DIR="$CACHE/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1

VLLM_VERSION="0.24.0"           # verl 0.9.1: verl[vllm] -> vllm==0.24.0
TRANSFORMERS_VERSION="5.9.0"    # verl 0.9.1: verl[vllm] -> transformers==5.9.0
TORCH_VERSION="2.13.0"          # the trainer venv's CPU torch (scripts/setup.sh); see above for why not 2.11
# What `import vllm.entrypoints.serve.render.serving` (and the chat / tokenize serving modules) needs, pinned where
# vLLM 0.24 pins it; nothing CUDA-only. Found by importing until it worked (docs/VLLM024_HOOK.md).
DEPS=(
  "transformers==$TRANSFORMERS_VERSION" "tokenizers>=0.21.1" "numpy" "regex" "cachetools" "psutil" "sentencepiece"
  "requests>=2.26.0" "tqdm" "blake3" "py-cpuinfo" "safetensors>=0.6.2" "protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*"
  "fastapi>=0.133.0,<0.137.0" "starlette>=1.0.1" "aiohttp>=3.13.3" "openai>=2.0.0" "pydantic>=2.12.0"
  "prometheus_client>=0.18.0" "prometheus-fastapi-instrumentator>=8.0.0" "pillow" "tiktoken>=0.6.0"
  "partial-json-parser" "jsonschema>=4.23.0" "pyzmq>=25.0.0" "msgspec" "pyyaml" "einops" "cloudpickle" "cbor2"
  "pybase64" "ijson" "setproctitle" "openai-harmony>=0.0.3" "mistral_common>=1.11.3" "jinja2" "uvicorn" "uvloop"
  "watchfiles" "llguidance>=1.7.0,<1.8.0" "model-hosting-container-standards>=0.1.14,<1.0.0" "apache-tvm-ffi>=0.1.11"
  "httpx" "pytest>=8" "pytest-asyncio>=0.23"
)
# xgrammar (imported by vLLM's tool-parser registry) without its dependencies: they add triton (1 GB, GPU kernels).
XGRAMMAR="xgrammar>=0.2.1,<1.0.0"
SPEC="vllm==$VLLM_VERSION|torch==$TORCH_VERSION|$XGRAMMAR|${DEPS[*]}"

say() { printf '[setup-vllm024] %s\n' "$*"; }
die() { printf '[setup-vllm024] ERROR: %s\n' "$*" >&2; exit 1; }

if [ -f "$VENV/.ngv-stamp" ] && [ "$(cat "$VENV/.ngv-stamp")" = "$SPEC" ]; then
  say "vLLM $VLLM_VERSION test venv up to date ($VENV)"
  exit 0
fi
[ -z "${NGV_SETUP_NO_INSTALL:-}" ] ||
  die "the vLLM $VLLM_VERSION test venv ($VENV) is not set up for this checkout's pins and NGV_SETUP_NO_INSTALL is set: run scripts/setup_tests.sh"
PY="${NGV_VLLM024_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || die "no $PY found for the vLLM $VLLM_VERSION test venv: install Python 3.11 or set NGV_VLLM024_PYTHON"

t0=$SECONDS
mkdir -p "$PIP_CACHE_DIR"
rm -rf "$VENV"
say "creating $VENV with $PY"
"$PY" -m venv "$VENV"
# pip's resolver lists vLLM's CUDA requirements we leave out (flashinfer, torch==2.11, ...) as conflicts: expected,
# filtered (with the machine's noisy "Location ... is ignored" warnings); pip's exit status is kept.
pip_() {
  "$VENV/bin/python" -m pip "$@" 2> >(grep -v -E "is ignored: it is neither|^(vllm|xgrammar) [0-9.]+ requires|resolver does not currently" >&2)
}
say "installing torch $TORCH_VERSION (CPU) first, so no resolver can pick a CUDA build"
pip_ install -q "torch==$TORCH_VERSION"
say "installing vllm==$VLLM_VERSION without its dependencies (its CUDA stack is not needed to render chat prompts)"
pip_ install -q --no-deps "vllm==$VLLM_VERSION" "$XGRAMMAR"
say "installing the pure-Python dependencies of vLLM's serving/render modules"
pip_ install -q "torch==$TORCH_VERSION" "${DEPS[@]}"
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, vllm.entrypoints.serve.render.serving" ||
  die "vLLM $VLLM_VERSION's render module does not import in $VENV (see the error above)"
echo "$SPEC" > "$VENV/.ngv-stamp"
say "vLLM $VLLM_VERSION test venv ready in $((SECONDS - t0)) s ($(du -sh "$VENV" | cut -f1))"
