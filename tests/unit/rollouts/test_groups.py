"""Prompt groups' verdicts, the masked samples' fill, and that verl's group-filter rule on what the managers put keeps a
group exactly when its valid samples' outcomes differ (masked samples never decide)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.rollouts.groups import (
    OUTCOME_KEY,
    GroupVerdict,
    batch_signal,
    classify,
    group_metrics,
    masked_fill,
    reward_extra_info,
)
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory


def sample(reward: float | None, components: dict[str, float] | None = None, env: str = "e") -> Trajectory:
    """A valid sample with Gym reward ``reward``, or (None) a masked one."""
    numeric = {f"reward_components/{k}": v for k, v in (components or {}).items()}
    if reward is None:
        return Trajectory(env_name=env, masked_reason=MaskReason.TIMEOUT, numeric=numeric)
    return Trajectory(env_name=env, reward=reward, gym_reward=reward, numeric=numeric)


def verl_drops(values: list[float]) -> bool:
    """verl 0.9.1 ``ReplayBuffer._dapo_filtered_keys``: a finished group is filtered iff it has more than one
    trajectory and the metric's standard deviation is zero."""
    return len(values) > 1 and float(np.std(values)) == 0.0


def put_values(members: list[Trajectory], metric: str = OUTCOME_KEY) -> list[float]:
    """What the managers put per sample: a valid one its own reward_extra_info, a masked one its group's fill."""
    fill = masked_fill(members, [metric])
    return [(fill if t.masked else reward_extra_info(t))[metric] for t in members]


@pytest.mark.parametrize(
    ("rewards", "verdict"),
    [
        ([1.0, 0.0, 1.0], GroupVerdict.SIGNAL),
        ([1.0, 1.0, None], GroupVerdict.SAME_OUTCOME),
        ([0.0, 0.0], GroupVerdict.SAME_OUTCOME),
        ([1.0, None, None], GroupVerdict.TOO_FEW_VALID),
        ([None, None], GroupVerdict.ALL_MASKED),
    ],
)
def test_verdicts(rewards, verdict):
    assert classify([sample(r) for r in rewards]) is verdict


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0])), min_size=2, max_size=8))
def test_verls_filter_on_what_is_put_keeps_exactly_the_groups_with_signal(rewards):
    members = [sample(r) for r in rewards]
    assert verl_drops(put_values(members)) == (classify(members) is not GroupVerdict.SIGNAL)


def test_masked_samples_decided_groups_before_the_fill():
    """The fault this fixes: put with their own 0, a masked sample keeps a group of valid 1s (zero advantage)."""
    members = [sample(1.0), sample(1.0), sample(None)]
    assert not verl_drops([1.0, 1.0, 0.0]) and verl_drops(put_values(members))


def test_fill_covers_the_components_and_the_configured_metric():
    members = [sample(1.0, {"correct": 1.0, "format": 0.0}), sample(None), sample(0.0, {"correct": 0.0})]
    assert masked_fill(members, ["format", "other"]) == {OUTCOME_KEY: 1.0, "correct": 1.0, "format": 0.0, "other": 0.0}
    assert masked_fill([sample(None)], ["correct"]) == {OUTCOME_KEY: 0.0, "correct": 0.0}
    assert reward_extra_info(members[0]) == {OUTCOME_KEY: 1.0, "correct": 1.0, "format": 0.0}


def test_group_metrics_count_verdicts_overall_and_per_environment():
    m = group_metrics(
        [("a", GroupVerdict.SIGNAL), ("a", GroupVerdict.SAME_OUTCOME), ("b/x", GroupVerdict.ALL_MASKED)], "gym"
    )
    assert m["gym/all/groups/finished"] == 3 and m["gym/all/groups/signal"] == 1
    assert m["gym/a/groups/same_outcome"] == 1 and m["gym/a/groups/no_signal_rate"] == 0.5
    assert m["gym/b_x/groups/all_masked"] == 1 and m["gym/b_x/groups/too_few_valid"] == 0


def test_batch_signal_is_the_share_of_groups_without_a_non_zero_advantage():
    uids = ["a", "a", "b", "b", "c", "c"]
    m = batch_signal(uids, [1.0, 0.0, 1.0, 1.0, 1.0, 0.0], [True, True, True, True, True, False])
    assert m == {"gym/train/groups": 3.0, "gym/train/groups_without_signal_rate": pytest.approx(2 / 3)}
    assert batch_signal([], [], []) == {}
