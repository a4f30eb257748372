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


@pytest.mark.parametrize(("saved_after", "workers"), [(2, 0), (5, 0), (7, 0), (12, 0), (7, 2)])
def test_a_relaunch_continues_the_data_order_from_a_checkpoint_in_any_epoch(saved_after, workers):
    """verl's ``StatefulDataLoader`` saves the sampler's state in each checkpoint; a relaunch builds a fresh sampler
    and loader, loads that state, and must draw exactly the batches the uninterrupted run drew -- also after the first
    epoch (batches 7 and 12 of 5-batch epochs: a sampler without its own state replays epoch 0's order there), and
    with worker processes prefetching batches (the GPU configs' ``data.dataloader_num_workers``)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    codes = _codes(12, 8)  # 20 rows, batches of 4: 5 batches per epoch

    def loader() -> StatefulDataLoader:
        sampler = EnvWeightedSampler(NAMES, codes, {"big": 1, "small": 1}, 4, seed=1)
        return StatefulDataLoader(
            list(range(20)), batch_size=4, sampler=sampler, drop_last=True, collate_fn=list, num_workers=workers
        )

    def draw(dl: StatefulDataLoader, total: int, save_at: int | None = None) -> tuple[list, dict | None]:
        out, state, it = [], None, iter(dl)
        while len(out) < total:  # a new iter() per epoch, as verl's trainers do
            try:
                out.append(next(it))
            except StopIteration:
                it = iter(dl)
                out.append(next(it))
            if len(out) == save_at:
                state = dl.state_dict()
        return out, state

    reference, _ = draw(loader(), 14)
    assert reference[5:10] != reference[:5]  # epochs differ: the check below can tell them apart
    _, state = draw(loader(), saved_after, save_at=saved_after)
    relaunched = loader()
    relaunched.load_state_dict(state)
    assert draw(relaunched, 14 - saved_after)[0] == reference[saved_after:]


def test_a_checkpoint_of_another_seed_is_refused_naming_the_key():
    sampler = EnvWeightedSampler(NAMES, _codes(4, 4), {"big": 1, "small": 1}, 2, seed=1)
    state = sampler.state_dict()
    with pytest.raises(AdapterConfigError, match="data.seed=2: .*seeded 1"):
        EnvWeightedSampler(NAMES, _codes(4, 4), {"big": 1, "small": 1}, 2, seed=2).load_state_dict(state)
