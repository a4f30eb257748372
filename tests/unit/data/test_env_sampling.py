"""Per-environment sampling weights: every batch holds each environment's share; errors name the config key."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from nemo_gym_adapter.data.env_sampling import EnvWeightedSampler, batch_counts, normalized_shares
from nemo_gym_adapter.errors import AdapterConfigError

NAMES = ["big", "small"]


def _codes(big: int, small: int) -> np.ndarray:
    return np.array([0] * big + [1] * small, dtype=np.int32)


def _batches(sampler: EnvWeightedSampler) -> list[list[int]]:
    indices = list(sampler)
    b = sampler.batch_size
    return [indices[i : i + b] for i in range(0, len(indices), b)]


def test_each_batch_holds_each_environments_share_however_unbalanced_the_data():
    codes = _codes(90, 10)
    sampler = EnvWeightedSampler(NAMES, codes, {"big": 1, "small": 1}, batch_size=8, seed=0)
    batches = _batches(sampler)
    assert len(sampler) == 13 * 8 and len(batches) == 13  # ceil(100 / 8) batches
    for batch in batches:
        assert Counter(NAMES[codes[i]] for i in batch) == {"big": 4, "small": 4}


def test_uneven_shares_are_met_over_consecutive_batches_without_drift():
    shares = normalized_shares({"a": 1, "b": 2}, ["a", "b"])
    counts = [batch_counts(shares, 4, k) for k in range(30)]
    assert all(sum(c.values()) == 4 for c in counts)
    total_a = np.cumsum([c["a"] for c in counts])
    expected = np.arange(1, 31) * 4 / 3
    assert np.all(np.abs(total_a - expected) < 1)


def test_rows_within_an_environment_are_drawn_without_replacement_and_reshuffled():
    codes = _codes(6, 6)
    sampler = EnvWeightedSampler(NAMES, codes, {"big": 1, "small": 1}, batch_size=4, seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(12))  # 3 batches of 2+2: every row exactly once
    assert list(sampler) != first  # the next epoch has another order
    again = EnvWeightedSampler(NAMES, codes, {"big": 1, "small": 1}, batch_size=4, seed=3)
    assert list(again) == first  # seeded


def test_weight_zero_leaves_an_environment_out():
    codes = _codes(5, 5)
    sampler = EnvWeightedSampler(NAMES, codes, {"big": 0, "small": 2}, batch_size=4, seed=0)
    assert {NAMES[codes[i]] for i in sampler} == {"small"}


@pytest.mark.parametrize(
    ("weights", "fragment"),
    [
        ({"big": 1}, "nemo_gym.env_weights.small: the training data has rows for 'small' but it has no weight"),
        ({"big": 1, "small": 1, "typo": 1}, "nemo_gym.env_weights.typo: no row of the training data routes"),
        ({"big": 0, "small": 0}, "nemo_gym.env_weights: every weight is 0"),
    ],
)
def test_errors_name_the_key(weights, fragment):
    with pytest.raises(AdapterConfigError) as e:
        EnvWeightedSampler(NAMES, _codes(3, 3), weights, batch_size=2)
    assert fragment in str(e.value)


def test_works_as_a_torch_dataloader_sampler():
    from torch.utils.data import DataLoader

    codes = _codes(30, 3)
    sampler = EnvWeightedSampler(NAMES, codes, {"big": 3, "small": 1}, batch_size=4, seed=0)
    loader = DataLoader(list(range(33)), batch_size=4, sampler=sampler, drop_last=True)  # type: ignore[arg-type]
    for batch in loader:
        assert Counter(NAMES[codes[int(i)]] for i in batch) == {"big": 3, "small": 1}
