"""``recipe.nemo_gym.cpu.dtype``: ``actor_rollout_ref.rollout.dtype: auto`` chosen from fake ``/proc/cpuinfo`` and
``/proc/meminfo`` texts and a fake checkpoint (safetensors headers only, written in ``tmp_path``); the notice on a
dtype the config sets; the driver's step that puts the choice into the config (``recipe.nemo_gym.main``)."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_gym_adapter.console.notices import known_notice
from recipe.nemo_gym.cpu.dtype import (
    CALIBRATION_PARAMS,
    bf16_notice,
    checkpoint_params,
    choose_rollout_dtype,
    cpu_flags,
    float32_extra_gib,
    mem_total_gib,
)

XEON = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16\n"
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n"
NODE_24 = (
    "MemTotal:       24683772 kB\nMemFree:         1000000 kB\nMemAvailable:   18111148 kB\n"  # this machine: 23.5 GiB
)
NODE_32 = "MemTotal:       32780000 kB\nMemAvailable:   30000000 kB\n"  # 31.3 GiB
WEATHER_PEAK = 19.8  # configs/nemo_gym_cpu_qwen_weather.yaml's nemo_gym.auto_dtype.bf16_peak_gib


def fake_checkpoint(root: Path, *shapes_per_file: list[list[int]]) -> Path:
    """A checkpoint directory of safetensors files holding headers only (the reader never reads past them)."""
    root.mkdir(parents=True, exist_ok=True)
    for i, shapes in enumerate(shapes_per_file):
        header = {"__metadata__": {"format": "pt"}}
        header.update({f"t{j}": {"dtype": "F32", "shape": s, "data_offsets": [0, 0]} for j, s in enumerate(shapes)})
        raw = json.dumps(header).encode()
        (root / f"model-{i}.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    (root / "config.json").write_text("{}")
    return root


def qwen_05b(tmp_path: Path) -> Path:
    """A fake checkpoint with the 0.5B tool model's 630,167,424 parameters, in two files."""
    return fake_checkpoint(
        tmp_path / "qwen", [[151936, 896], [151936, 896]], [[CALIBRATION_PARAMS - 2 * 151936 * 896], [0]]
    )


def never_counted() -> int:
    raise AssertionError("the parameter count was read where memory does not decide")


def choose(cpuinfo: str, meminfo: str, peak: float | None, model: Path | str | None = None):
    return choose_rollout_dtype(
        cpu_flags(cpuinfo),
        bf16_peak_gib=peak,
        mem_total_gib=mem_total_gib(meminfo),
        count_params=never_counted if model is None else (lambda: checkpoint_params(str(model))),
    )


# ---------------------------------------------------------------------------------------------------- reading


def test_a_checkpoints_parameters_are_its_headers_element_counts_over_every_file(tmp_path):
    assert checkpoint_params(str(qwen_05b(tmp_path))) == 630_167_424
    assert checkpoint_params(str(fake_checkpoint(tmp_path / "small", [[2, 3], [4]]))) == 10


def test_no_parameter_count_for_a_hub_id_an_empty_directory_or_a_broken_header(tmp_path):
    assert checkpoint_params("Qwen/Qwen2.5-1.5B-Instruct") is None
    assert checkpoint_params(str(tmp_path)) is None
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 100) + b"{not json")
    assert checkpoint_params(str(tmp_path)) is None


def test_memtotal_is_read_in_gib():
    assert mem_total_gib(NODE_24) == pytest.approx(23.54, abs=0.01)
    assert mem_total_gib("MemFree: 5 kB\n") is None


def test_float32s_extra_is_calibrated_on_the_measured_27_gib_of_the_05b():
    assert float32_extra_gib(CALIBRATION_PARAMS) == pytest.approx(2.7)
    assert float32_extra_gib(2 * CALIBRATION_PARAMS) == pytest.approx(5.4)


# ---------------------------------------------------------------------------------------------------- the rule


def test_auto_is_bfloat16_where_the_cpu_has_its_instructions_whatever_the_memory():
    choice = choose(XEON, NODE_24, WEATHER_PEAK)  # never_counted: memory is not asked
    assert choice.dtype == "bfloat16" and not choice.warn
    assert "native on this CPU (avx512_bf16, amx_bf16)" in choice.line
    assert choice.line.startswith("actor_rollout_ref.rollout.dtype=auto -> bfloat16")


def test_auto_is_float32_on_an_avx2_only_cpu_when_the_memory_fits(tmp_path):
    choice = choose(EPYC, NODE_32, WEATHER_PEAK, qwen_05b(tmp_path))
    assert choice.dtype == "float32" and not choice.warn, choice.line
    # the numbers: peak + extra = need, within 95% of the node
    for said in ("19.8 GiB", "2.7 GiB more", "630M parameters", "= 22.5 GiB", "95% of this node's 31.3 GiB = 29.7 GiB"):
        assert said in choice.line, (said, choice.line)
    assert "no avx512_bf16 or amx_bf16" in choice.line


def test_auto_stays_bfloat16_with_a_warning_naming_the_numbers_when_float32_does_not_fit(tmp_path):
    choice = choose(EPYC, NODE_24, WEATHER_PEAK, qwen_05b(tmp_path))
    assert choice.dtype == "bfloat16" and choice.warn, choice.line
    for said in (
        "emulated",
        "measured bfloat16 peak 19.8 GiB (nemo_gym.auto_dtype.bf16_peak_gib)",
        "estimated 2.7 GiB more",
        "= 22.5 GiB",
        "Ray's memory line, 95% of this node's 23.5 GiB = 22.4 GiB",
        "a node with >= 23.7 GiB",  # 22.5 / 0.95
        "set actor_rollout_ref.rollout.dtype=float32 explicitly",
    ):
        assert said in choice.line, (said, choice.line)


def test_the_fit_is_decided_at_rays_line_not_at_the_nodes_total(tmp_path):
    """22.5 GiB needed: a 24.0 GiB node (line 22.8) fits, a 23.6 GiB one (line 22.4) does not -- though 22.5 < 23.6."""
    model = qwen_05b(tmp_path)
    assert choose(EPYC, f"MemTotal: {int(24.0 * 1024**2)} kB\n", WEATHER_PEAK, model).dtype == "float32"
    assert choose(EPYC, f"MemTotal: {int(23.6 * 1024**2)} kB\n", WEATHER_PEAK, model).dtype == "bfloat16"


def test_without_a_declared_peak_the_cpu_alone_decides_and_says_so():
    choice = choose(EPYC, NODE_24, None)  # never_counted: no peak, no memory question
    assert choice.dtype == "float32" and not choice.warn
    assert "by the CPU alone" in choice.line and "declares no measured bfloat16 peak" in choice.line
    assert choose(XEON, NODE_24, None).dtype == "bfloat16"


def test_a_peak_without_a_parameter_count_or_memtotal_keeps_bfloat16_and_says_what_is_missing(tmp_path):
    no_count = choose(EPYC, NODE_24, WEATHER_PEAK, "Qwen/Qwen2.5-0.5B-Instruct")
    assert no_count.dtype == "bfloat16" and no_count.warn and "parameter count" in no_count.line
    no_mem = choose(EPYC, "", WEATHER_PEAK, qwen_05b(tmp_path))
    assert no_mem.dtype == "bfloat16" and no_mem.warn and "MemTotal" in no_mem.line


def test_no_flags_to_read_keeps_the_configs_tested_bfloat16_with_a_warning():
    choice = choose("", NODE_24, WEATHER_PEAK)
    assert choice.dtype == "bfloat16" and choice.warn and "no CPU flags" in choice.line


def test_the_console_filter_passes_every_line_the_choice_prints(tmp_path):
    lines = [
        choose(XEON, NODE_24, WEATHER_PEAK).line,
        choose(EPYC, NODE_32, WEATHER_PEAK, qwen_05b(tmp_path)).line,
        choose(EPYC, NODE_24, WEATHER_PEAK, qwen_05b(tmp_path)).line,
        choose(EPYC, NODE_24, None).line,
    ]
    assert [known_notice(f"[2026-12-07][recipe.nemo_gym.main][INFO] - {line}") for line in lines] == [None] * 4


# ---------------------------------------------------------------------------------------------------- a set dtype


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


# ---------------------------------------------------------------------------------------------------- the driver


@pytest.fixture
def cpu_node(monkeypatch):
    """The driver on the CPU platform, reading the fake ``/proc`` texts set in the returned dict."""
    from recipe.nemo_gym import main

    proc = {"cpuinfo": EPYC, "meminfo": NODE_24}
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    monkeypatch.setattr(main, "_read_proc", lambda name: proc[name])
    return proc


def _cfg(dtype: str, model: Path | str) -> object:
    return OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(model)}, "rollout": {"dtype": dtype}}})


@pytest.mark.parametrize(
    ("cpuinfo", "meminfo", "chosen", "level"),
    [
        (XEON, NODE_24, "bfloat16", logging.INFO),
        (EPYC, NODE_32, "float32", logging.INFO),
        (EPYC, NODE_24, "bfloat16", logging.WARNING),
    ],
    ids=["native", "fits", "does-not-fit"],
)
def test_the_driver_puts_a_concrete_dtype_into_the_config_and_prints_why(
    tmp_path, cpu_node, caplog, cpuinfo, meminfo, chosen, level
):
    from recipe.nemo_gym.main import _rollout_dtype

    cpu_node.update(cpuinfo=cpuinfo, meminfo=meminfo)
    cfg = _cfg("auto", qwen_05b(tmp_path))
    with caplog.at_level(logging.INFO, logger="recipe.nemo_gym.main"):
        _rollout_dtype(cfg, WEATHER_PEAK)
    assert cfg.actor_rollout_ref.rollout.dtype == chosen  # what verl's workers get: never "auto"
    [record] = [r for r in caplog.records if "dtype=auto -> " in r.getMessage()]
    assert record.levelno == level and f"-> {chosen}" in record.getMessage()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_driver_never_changes_a_dtype_the_config_sets(tmp_path, cpu_node, caplog, dtype):
    from recipe.nemo_gym.main import _rollout_dtype

    cfg = _cfg(dtype, qwen_05b(tmp_path))
    with caplog.at_level(logging.INFO, logger="recipe.nemo_gym.main"):
        _rollout_dtype(cfg, WEATHER_PEAK)  # on the AVX2-only node where auto would say float32 or warn
    assert cfg.actor_rollout_ref.rollout.dtype == dtype
    assert not [r for r in caplog.records if "dtype=auto -> " in r.getMessage()]
    slow = [r for r in caplog.records if "emulates it" in r.getMessage()]  # the notice on a set bfloat16 still applies
    assert len(slow) == (dtype == "bfloat16") and all(r.levelno == logging.WARNING for r in slow)


def test_auto_outside_the_cpu_platform_is_a_config_error_naming_the_key(tmp_path, monkeypatch):
    from recipe.nemo_gym.config.load import load_config
    from tests.support.recipe_config import config_error, minimal_recipe_config

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    cfg = minimal_recipe_config(tmp_path)
    cfg["actor_rollout_ref"]["rollout"]["dtype"] = "auto"
    message = config_error(cfg)
    assert "actor_rollout_ref.rollout.dtype=auto" in message and "CPU platform only" in message
    cfg["ray_kwargs"] = {"ray_init": {"runtime_env": {"env_vars": {"VERL_PLATFORM": "cpu"}}}}
    load_config(cfg)  # the CPU configs' platform: accepted
    cfg["actor_rollout_ref"]["rollout"]["dtype"] = "bfloat16"
    del cfg["ray_kwargs"]
    load_config(cfg)  # a set dtype anywhere: accepted
