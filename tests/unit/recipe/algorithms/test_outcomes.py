"""What a finished rollout tells the legacy trainer per sample (``recipe.nemo_gym.algorithms.outcomes.legacy_extras``): the
columns verl's GDPO (``algorithm.gdpo_reward_keys``), dump and ``gdpo/*`` metrics read."""

from __future__ import annotations

import numpy as np
import pytest

from nemo_gym_adapter.errors import AdapterConfigError, AdapterError
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory
from recipe.nemo_gym.algorithms.outcomes import batch_group_metrics, carried_components, check_gdpo_keys, legacy_extras


def sample(reward, components=None, env="multi", masked=MaskReason.TIMEOUT):
    numeric = {f"reward_components/{k}": v for k, v in (components or {}).items()}
    if reward is None:
        return Trajectory(env_name=env, masked_reason=masked, numeric=numeric)
    return Trajectory(env_name=env, reward=reward, gym_reward=reward, numeric=numeric)


def test_each_component_is_a_column_and_masked_samples_carry_their_groups_valid_values():
    trajs = [
        sample(2.0, {"correctness": 1.0, "format": 1.0}),
        sample(None),
        sample(1.0, {"correctness": 0.0, "format": 1.0}),
        sample(1.0, {"correctness": 1.0, "format": 0.0}),
        sample(0.0, env="quiz"),  # another environment, no components: not a number in their columns
        sample(1.0, env="quiz"),
    ]
    cols = legacy_extras(trajs, ["a", "a", "b", "b", "c", "c"], taken={"uid", "gym_env"}, fill_keys=["accuracy"])
    assert sorted(cols) == ["accuracy", "correctness", "format", "gym_outcome"]
    assert all(c.dtype == np.float32 and c.shape == (6,) for c in cols.values())
    assert cols["gym_outcome"].tolist() == [2.0, 2.0, 1.0, 1.0, 0.0, 1.0]  # the masked one: its group's valid 2.0
    np.testing.assert_array_equal(cols["correctness"], [1.0, 1.0, 0.0, 1.0, np.nan, np.nan])
    np.testing.assert_array_equal(cols["format"], [1.0, 1.0, 1.0, 0.0, np.nan, np.nan])
    # a configured key nothing carries: a masked sample's fill has it at 0; valid samples did not return it
    np.testing.assert_array_equal(cols["accuracy"], [np.nan, 0.0, np.nan, np.nan, np.nan, np.nan])


def test_a_valid_sample_never_gets_a_group_mates_component():
    """The fault of issue 26 item 4: the group fill meant for masked samples went to every member, so a valid sample
    that lacked a component got its group-mate's value and GDPO trained on a score it never returned."""
    trajs = [
        sample(2.0, {"correctness": 1.0, "format": 1.0}),
        sample(1.0, {"format": 1.0}),  # valid, but its result has no correctness
        sample(None),  # masked: carries the group's fill
    ]
    cols = legacy_extras(trajs, ["a", "a", "a"], taken=set(), fill_keys=["correctness"])
    assert cols["correctness"][0] == 1.0 and np.isnan(cols["correctness"][1])  # not 1.0, not 0.0
    assert cols["correctness"][2] == 1.0 and cols["format"][2] == 1.0  # the masked sample's fill


def test_a_component_named_like_a_batch_column_is_an_error_naming_both():
    with pytest.raises(AdapterError, match=r"\['uid'\] of environment\(s\) \['multi'\]"):
        legacy_extras([sample(1.0, {"uid": 1.0})], ["a"], taken={"uid"})


def test_batch_group_metrics_classify_each_uid():
    m = batch_group_metrics([sample(1.0), sample(1.0), sample(0.0), sample(1.0)], ["a", "a", "b", "b"])
    assert m["gym/all/groups/same_outcome"] == 1 and m["gym/multi/groups/signal"] == 1


def test_a_gdpo_key_no_result_carries_is_an_error_naming_the_key_and_the_components_present():
    checked: set[str] = set()
    step = [sample(None), sample(2.0, {"correctness": 1.0, "format": 1.0}), sample(0.0, env="quiz")]
    with pytest.raises(AdapterConfigError) as e:
        check_gdpo_keys(step, ["correctness", "schema_valid"], checked)
    message = str(e.value)
    assert "algorithm.gdpo_reward_keys[1]='schema_valid'" in message and "'multi'" in message, message
    assert "['correctness', 'format']" in message, message  # what the environment's results do carry
    assert "environment 'quiz'" in message and "no reward_components" in message, message
    assert "[0]='correctness': no result of environment 'multi'" not in message, message  # multi carries it
    assert not checked


def test_gdpo_keys_are_checked_once_per_environment_with_a_valid_result():
    checked: set[str] = set()
    check_gdpo_keys([sample(None, env="quiz")], ["correctness"], checked)  # all masked: checked later
    assert not checked
    check_gdpo_keys([sample(1.0, {"correctness": 1.0}), sample(0.0, {"format": 0.0})], ["correctness"], checked)
    assert checked == {"multi"}
    check_gdpo_keys([sample(0.0, {"format": 0.0})], ["correctness"], checked)  # multi already checked
    with pytest.raises(AdapterConfigError, match="environment 'quiz'"):
        check_gdpo_keys([sample(1.0, env="quiz")], ["correctness"], checked)


def test_results_masked_for_a_missing_component_still_say_what_their_environment_returns():
    """Every result of an environment lacks a GDPO key: each is masked missing_reward_component, and the first step
    still stops naming the key and what the results do carry (the check would otherwise wait forever)."""
    step = [sample(None, {"format": 1.0}, masked=MaskReason.MISSING_REWARD_COMPONENT) for _ in range(3)]
    step.append(sample(None, {"correctness": 1.0}))  # a timeout: says nothing about what the environment returns
    assert carried_components(step) == {"multi": {"format"}}
    with pytest.raises(AdapterConfigError, match=r"\[0\]='correctness'.*carry \['format'\]"):
        check_gdpo_keys(step, ["correctness"], set())
