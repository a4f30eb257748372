"""A training run's console without the start-up notices nobody can act on.

A CPU demo of the recipe printed ~240-270 lines, ~50 of them with "warn": every process that imported vLLM announced
that Triton has no CPU backend, that an optional DeepSelect extension is missing, that torchvision is not installed;
vLLM's engine, that tcmalloc is not preloaded, that eager mode disables torch.compile...; verl printed its progress
as INFO lines, the vLLM command line one argument per line, and an ``update_weights done`` line every step. Between
them, verl's progress bar, the metrics of each step and a real warning were hard to find.

What a setting turns off is turned off where it is printed (``recipe.nemo_gym.trainer.console``: verl's log level,
Python's warning filters; the CPU replica: the command line; ``recipe.nemo_gym.cpu.registry``: vLLM imported only
where it is used). The rest is left out here: :class:`QuietStream` wraps the driver's ``sys.stdout``/``sys.stderr``,
where Ray prints every worker's output too (``ray._private.worker.print_to_stdstream`` looks them up at each call),
and drops the lines that contain one of :data:`KNOWN` -- each with who prints it and why it is harmless on this path.
Everything else passes unchanged: an unknown warning, an error, a traceback, verl's progress bar and metrics, our own
lines. Nothing is lost: Ray keeps every worker's full output in its session's ``logs/`` directory, and
``NGV_CONSOLE=full`` turns the filter off (:func:`quiet_console`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

CONSOLE_ENV = "NGV_CONSOLE"  # "full": no filter


@dataclass(frozen=True)
class Notice:
    """A console line left out when it contains ``text``: ``source`` prints it, ``why`` it says nothing to act on."""

    text: str
    source: str
    why: str


_VLLM_CPU = "vLLM on CPU"
KNOWN: tuple[Notice, ...] = (
    # vLLM's imports, in every process that imports it
    Notice("Triton is installed, but doesn't include CPU backend", _VLLM_CPU, "Triton is a GPU compiler here"),
    Notice("Triton is installed but 0 active driver(s) found", _VLLM_CPU, "as above"),
    Notice("Triton not installed or not compatible", _VLLM_CPU, "as above"),
    Notice("Triton is not installed. triton-cpu is expected", _VLLM_CPU, "as above"),
    Notice("Model Runner V2 requires Triton", _VLLM_CPU, "the V1 runner is the one tested here"),
    Notice("Failed to import the DeepSelect extension", _VLLM_CPU, "a GPU kernel for sparse-attention models"),
    Notice("`Qwen2VLImageProcessor` requires torchvision", "transformers, imported by vLLM", "no image models here"),
    # vLLM's engine start on CPU, with the CPU replica's settings (recipe/nemo_gym/cpu/rollout.py)
    Notice("is not found in LD_PRELOAD", _VLLM_CPU, "tcmalloc/iomp are optional speed-ups, not installed"),
    Notice("Enforce eager set, disabling torch.compile", _VLLM_CPU, "eager mode is the CPU replica's choice"),
    Notice("Inductor compilation was disabled by user settings", _VLLM_CPU, "as above"),
    Notice("Reset SSM cache type to float32", _VLLM_CPU, "no SSM layers in these models"),
    Notice("Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False", _VLLM_CPU, "the uni executor is the choice"),
    Notice("is set; leaving Torch threads at", _VLLM_CPU, "OMP_NUM_THREADS is set on purpose (ngv_cpu_threads)"),
    Notice("LoRA dynamic loading & unloading is enabled in the API server", "vLLM", "verl sets it; local servers"),
    Notice("Default vLLM sampling parameters have been overridden by the model", "vLLM", "every request sets them"),
    Notice("Warning: NUMA binding: Using MEMBIND policy", "torch (C++)", "one NUMA node here"),
    Notice("Loading safetensors checkpoint shards:", "vLLM", "a progress bar of a sub-second load"),
    Notice("Initializing a V1 LLM engine with config", "vLLM", "the configuration the run was given"),
    Notice("RotaryEmbedding: Failed to load weights", "vLLM's layerwise reload", "vllm/plugin.py says why"),
    # verl
    Notice("Failed to set NUMA affinity", "verl", "libnuma.so (the dev link) is absent; one NUMA node"),
    Notice("IPC is not supported on your devices. Falling back to shared memory", "verl", "CPU: shared memory"),
    Notice("agent loop only support torch and npu profiler", "verl", "no profiler configured"),
    Notice("Using blocking ray.get inside async actor", "Ray, in verl's worker", "verl's weight sync"),
    Notice("is_fx_tracing will return true for both", "torch (once per process)", "a deprecation inside torch"),
    Notice("Using dataset class:", "verl", "the config names it"),
    Notice("colocated worker base class", "verl", "start-up progress"),
    Notice("Skipping monkey patch for", "verl", "fused kernels are off on CPU"),
    Notice("ForCausalLM contains ", "verl", "the model's size"),
    Notice("Before FSDP, memory allocated", "verl", "start-up progress"),
    Notice("After FSDP, memory allocated", "verl", "start-up progress"),
    Notice("num_warmup_steps:", "verl", "the optimizer's schedule"),
    Notice("LLMServerManager: [", "verl", "the replicas' addresses"),
    Notice("'Final validation metrics: None'", "verl", "no final validation configured"),
    Notice("ray init kwargs:", "verl", "the config's ray_kwargs, printed in full"),
    Notice("[validate_config] All configuration checks passed successfully", "verl", "checks passed"),
    Notice("val_batch_size is deprecated", "verl", "the configs size validation batches with it on purpose"),
    Notice("Loading weights:", "transformers", "a progress bar of a sub-second load"),
    Notice("override_generation_config: {", "verl's vLLM server", "the sampling defaults of the config"),
    Notice("enable_sleep_mode: ", "verl's vLLM server", "verl's setting; the CPU replica turns it off"),
    Notice("data_parallel_rpc_port: ", "verl's vLLM server", "the server's ports"),
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_PREFIX = re.compile(r"^\((?P<who>[^()]*(?:pid=\d+|, ip=[^)]*)[^()]*)\)\s?")
_PY_WARNING = re.compile(r"\w+Warning: ")


def message_of(line: str) -> tuple[str, str]:
    """``(who, message)`` of a console line: Ray's ``(Actor pid=N)`` prefix (or ``""``) and the rest, colours
    removed."""
    plain = _ANSI.sub("", line)
    match = _RAY_PREFIX.match(plain)
    if match is None:
        return "", plain
    return match.group("who"), plain[match.end() :]


def known_notice(line: str, notices: tuple[Notice, ...] = KNOWN) -> Notice | None:
    """The :class:`Notice` ``line`` contains, or None (a line to show)."""
    _, message = message_of(line)
    return next((n for n in notices if n.text in message), None)


class QuietStream(io.TextIOBase):
    """A text stream that passes whole lines on to ``stream`` except those of a known notice (:func:`known_notice`),
    the source line Python prints under a left-out warning, and a Ray worker's empty lines. Thread-safe (Ray's log
    thread and the main thread both write); a line is passed on once its newline arrives (:meth:`close` passes on
    what is left). ``dropped`` counts what was left out, by notice text."""

    def __init__(self, stream: TextIO, notices: tuple[Notice, ...] = KNOWN) -> None:
        super().__init__()
        self._stream = stream
        self._notices = notices
        self._pending = ""
        self._skip_source_of: str | None = None  # the worker whose left-out Python warning's source line comes next
        self._lock = threading.Lock()
        self.dropped: Counter[str] = Counter()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._pending + text).split("\n")
            self._pending = lines.pop()
            out = [line + "\n" for line in lines if self._keep(line)]
        if out:
            self._stream.write("".join(out))
        return len(text)

    def _keep(self, line: str) -> bool:
        who, message = message_of(line)
        if self._skip_source_of is not None:
            skip, self._skip_source_of = self._skip_source_of == who and message.startswith("  "), None
            if skip:
                return False
        if who and not message.strip():
            return False
        notice = next((n for n in self._notices if n.text in message), None)
        if notice is None:
            return True
        self.dropped[notice.text] += 1
        if _PY_WARNING.search(message):
            self._skip_source_of = who
        return False

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        with self._lock:
            rest, self._pending = self._pending, ""
        if rest:
            self._stream.write(rest)
        self.flush()

    def isatty(self) -> bool:
        return bool(getattr(self._stream, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._stream, "encoding", "utf-8"))


@contextlib.contextmanager
def quiet_console(environ: dict[str, str] | None = None) -> Iterator[list[QuietStream]]:
    """``sys.stdout`` and ``sys.stderr`` through :class:`QuietStream` inside the block (unless ``NGV_CONSOLE=full``);
    yields the wrappers (none when off)."""
    env = os.environ if environ is None else environ
    if env.get(CONSOLE_ENV, "").lower() == "full":
        yield []
        return
    saved = sys.stdout, sys.stderr
    wrappers = [QuietStream(saved[0]), QuietStream(saved[1])]
    sys.stdout, sys.stderr = wrappers
    try:
        yield wrappers
    finally:
        sys.stdout, sys.stderr = saved
        for wrapper in wrappers:
            wrapper.close()
