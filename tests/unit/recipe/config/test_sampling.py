"""The trainer's sampling settings (``recipe.nemo_gym.config.sampling``): every verl sampling key read with verl's
default, and each one the adapter cannot send refused naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from recipe.nemo_gym.config.sampling import ROLLOUT, SamplingSettings, read_sampling


def select_from(rollout: dict[str, Any]):
    def select(key: str, default: Any) -> Any:
        node: Any = {"actor_rollout_ref": {"rollout": rollout}}
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    return select


def read(rollout: dict[str, Any]) -> tuple[SamplingSettings, SamplingSettings, list[str]]:
    problems: list[str] = []
    train, val = read_sampling(select_from(rollout), (rollout.get("val_kwargs") or {}).keys(), problems)
    return train, val, problems


def test_verls_defaults_when_the_config_has_none_of_the_keys():
    train, val, problems = read({"val_kwargs": {"temperature": 0}})
    assert not problems
    assert train == SamplingSettings(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, ignore_eos=False)
    assert val == train.model_copy(update={"temperature": 0.0})


def test_validation_has_its_own_temperature_top_p_and_top_k_and_shares_the_rest():
    rollout = {
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 50,
        "repetition_penalty": 1.1,
        "ignore_eos": True,
        "val_kwargs": {
            "_target_": "verl.workers.config.SamplingConfig",
            "temperature": 0.5,
            "top_k": 1,
            "do_sample": True,
            "n": 2,
        },
    }
    train, val, problems = read(rollout)
    assert not problems
    assert (train.temperature, train.top_p, train.top_k) == (0.7, 0.95, 50)
    assert (val.temperature, val.top_p, val.top_k) == (0.5, 1.0, 1)  # val's top_p: verl's default, not training's
    assert val.repetition_penalty == train.repetition_penalty == 1.1 and val.ignore_eos is True


@pytest.mark.parametrize(
    ("rollout", "key"),
    [
        ({"top_k": -2}, "rollout.top_k=-2"),
        ({"top_k": 1.5}, "rollout.top_k=1.5"),
        ({"val_kwargs": {"temperature": 0, "top_k": "all"}}, "val_kwargs.top_k='all'"),
        ({"top_p": 0}, "rollout.top_p=0"),
        ({"temperature": -1}, "rollout.temperature=-1"),
        ({"repetition_penalty": 0}, "rollout.repetition_penalty=0"),
        ({"ignore_eos": "yes"}, "rollout.ignore_eos='yes'"),
    ],
)
def test_bad_values_name_their_key(rollout, key):
    _, _, problems = read({"val_kwargs": {"temperature": 0}, **rollout})
    assert len(problems) == 1 and key in problems[0], problems


@pytest.mark.parametrize(
    ("rollout", "key"),
    [
        ({"do_sample": False, "temperature": 1.0}, f"{ROLLOUT}.do_sample=False with {ROLLOUT}.temperature=1.0"),
        ({"val_kwargs": {"temperature": 0.6}}, f"{ROLLOUT}.val_kwargs.do_sample=False"),  # verl's default do_sample
        ({"full_determinism": True}, f"{ROLLOUT}.full_determinism=True"),
        ({"over_sample_rate": 0.1}, f"{ROLLOUT}.over_sample_rate=0.1"),
        ({"val_kwargs": {"temperature": 0, "min_p": 0.1}}, "val_kwargs has ['min_p']"),
    ],
)
def test_settings_the_adapter_cannot_send_are_refused_naming_the_key(rollout, key):
    _, _, problems = read({"val_kwargs": {"temperature": 0}, **rollout} if "val_kwargs" not in rollout else rollout)
    assert len(problems) == 1 and key in problems[0], problems


def test_greedy_settings_with_do_sample_false_and_sampled_ones_with_true_are_fine():
    _, _, problems = read({"do_sample": False, "temperature": 0, "val_kwargs": {"temperature": 0.8, "do_sample": True}})
    assert not problems
