"""``recipe.nemo_gym.cpu.dtype``: a bfloat16 rollout engine is called native or emulated from ``/proc/cpuinfo``'s flags."""

from __future__ import annotations

from recipe.nemo_gym.cpu.dtype import bf16_notice, cpu_flags

XEON = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16\n"
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n"


def test_bfloat16_is_native_where_the_cpu_has_its_instructions():
    slow, message = bf16_notice("bfloat16", cpu_flags(XEON))
    assert not slow and "avx512_bf16" in message and "amx_bf16" in message


def test_bfloat16_on_an_avx2_only_cpu_is_flagged_slow():
    slow, message = bf16_notice("bf16", cpu_flags(EPYC))
    assert slow and "emulates" in message and "actor_rollout_ref.rollout.dtype" in message


def test_other_dtypes_and_unreadable_flags_say_nothing():
    assert bf16_notice("float32", cpu_flags(EPYC)) is None
    assert bf16_notice(None, cpu_flags(XEON)) is None
    assert bf16_notice("bfloat16", cpu_flags("no flags line here")) is None
