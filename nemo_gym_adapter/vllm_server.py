"""``python -m nemo_gym_adapter.vllm_server <vLLM api_server args>``: vLLM's OpenAI server with the token-ID patch.

For people who run vLLM outside verl (NeMo Gym pointing at a separate inference server). It applies
``vllm_patch.apply_patch()`` in this process, then runs vLLM's own OpenAI api_server entry point in-process with the
same arguments, e.g.::

    python -m nemo_gym_adapter.vllm_server --model Qwen/Qwen2.5-1.5B-Instruct --port 8000 \\
        --enable-auto-tool-choice --tool-call-parser hermes

``--ngv-assistant-edits keep_ids|refuse`` (ours; removed before vLLM parses the rest) sets what the patch does with an
assistant message edited while its token ids were kept (``nemo_gym.assistant_edits``; default ``keep_ids``).

Requests are rendered in this (the API server) process, also when the engine core runs in its own process, so one
patched process is enough. Several API server processes (``--api-server-count`` > 1) would each need the patch and
are refused. Inside verl use ``vllm_patch.apply_patch_to_actors`` on its server actors instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import runpy
import sys
from collections.abc import Sequence

from nemo_gym_adapter.errors import AdapterConfigError

logger = logging.getLogger(__name__)

# Where vLLM keeps its OpenAI server's main(): newest first. The legacy module runs its __main__ block.
_ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"  # vLLM >= 0.25
_LEGACY_MODULE = "vllm.entrypoints.openai.api_server"  # vLLM 0.20 - 0.24 (and a deprecated alias later)
ASSISTANT_EDITS_FLAG = "--ngv-assistant-edits"


def api_server_count(argv: Sequence[str]) -> int | None:
    """The value of ``--api-server-count``/``-asc`` in ``argv`` (``--x=v`` or ``--x v``), None if absent."""
    for i, arg in enumerate(argv):
        for flag in ("--api-server-count", "-asc"):
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            else:
                continue
            try:
                return int(value)
            except ValueError:
                raise AdapterConfigError(f"{flag} must be an integer, got {value!r}") from None
    return None


def pop_assistant_edits(argv: Sequence[str]) -> tuple[str, list[str]]:
    """The value of ``--ngv-assistant-edits`` (``--x=v`` or ``--x v``; default ``keep_ids``) and ``argv`` without it."""
    from nemo_gym_adapter.splice import ASSISTANT_EDITS

    value, rest, args = "keep_ids", [], list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == ASSISTANT_EDITS_FLAG or arg.startswith(ASSISTANT_EDITS_FLAG + "="):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(args):
                value, i = args[i + 1], i + 1
            else:
                value = ""
            if value not in ASSISTANT_EDITS:
                raise AdapterConfigError(f"{ASSISTANT_EDITS_FLAG} must be one of {ASSISTANT_EDITS}, got {value!r}")
        else:
            rest.append(arg)
        i += 1
    return value, rest


def main(argv: Sequence[str] | None = None) -> None:
    """Patch, then hand over to vLLM's server main (which parses ``argv`` itself and serves until stopped)."""
    assistant_edits, args = pop_assistant_edits(sys.argv[1:] if argv is None else argv)
    count = api_server_count(args)
    if count is not None and count > 1:
        raise AdapterConfigError(
            f"--api-server-count={count}: extra API server processes would render chat requests without the token-ID "
            "patch; run one API server per nemo_gym_adapter.vllm_server process"
        )
    from nemo_gym_adapter.vllm_patch import apply_patch

    logging.basicConfig(level=logging.INFO)
    report = apply_patch(assistant_edits)
    logger.info(
        "token-ID patch: %s on vLLM %s (assistant_edits=%s); starting vLLM's OpenAI server",
        report.hook,
        report.vllm_version,
        assistant_edits,
    )
    sys.argv = [sys.argv[0], *args]  # vLLM's main() parses sys.argv
    if _module_exists(_ENTRY_MODULE):
        importlib.import_module(_ENTRY_MODULE).main()
    else:
        runpy.run_module(_LEGACY_MODULE, run_name="__main__", alter_sys=True)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing (older vLLM)
        return False


if __name__ == "__main__":
    main()
