"""Repeated log notices appear once per process; different messages are never hidden."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

from nemo_gym_adapter.console.repeats import OncePerProcess, once
from nemo_gym_adapter.vllm import plugin

REPO = Path(__file__).resolve().parents[3]


def _emit(name: str, messages: list[str], caplog) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=name):
        for m in messages:
            logging.getLogger(name).warning("%s: Failed to load weights", m)
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_a_repeated_message_shows_once_and_a_different_one_still_shows(caplog):
    name = "ngv.test.console.once"
    assert _emit(name, ["RotaryEmbedding"] * 3, caplog) == ["RotaryEmbedding: Failed to load weights"] * 3  # control
    flt = once(name)
    assert once(name) is flt and sum(isinstance(f, OncePerProcess) for f in logging.getLogger(name).filters) == 1
    shown = _emit(name, ["RotaryEmbedding", "RotaryEmbedding", "Linear", "RotaryEmbedding", "Linear"], caplog)
    assert shown == ["RotaryEmbedding: Failed to load weights", "Linear: Failed to load weights"]
    logging.getLogger(name).removeFilter(flt)


def test_the_vllm_plugin_quiets_the_weight_reload_notice_and_is_declared_for_vllm(caplog):
    name = plugin.REPEATING_LOGGERS[0]
    plugin.install()
    plugin.install()  # vLLM may call it more than once per process
    try:
        assert _emit(name, ["RotaryEmbedding"] * 4, caplog) == ["RotaryEmbedding: Failed to load weights"]
    finally:
        for f in list(logging.getLogger(name).filters):
            logging.getLogger(name).removeFilter(f)
    entry_points = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert entry_points["vllm.general_plugins"] == {"nemo_gym_verl_console": "nemo_gym_adapter.vllm.plugin:install"}
