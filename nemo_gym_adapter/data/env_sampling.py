"""Per-environment sampling weights: every training batch holds each environment's share of rows.

``nemo_gym.env_weights: {<env>: <weight>, ...}`` (validated in :mod:`config`; weights are relative, normalised here)
makes the trainer's sampler compose each batch of ``data.train_batch_size`` rows from the environments in those
shares, instead of whatever mix a shuffled mixed dataset happens to give (a large environment would otherwise
crowd out a small one). Shares that do not divide the batch evenly are met over consecutive batches: batch ``k``
takes, per environment, the rows that bring its running total closest to ``k * batch_size * share`` (largest
remainder), so no environment drifts by a row or more. Within an environment rows are drawn without replacement
in a seeded random order (a fresh permutation each time an environment's rows are used up); an environment with
weight 0 is never sampled.

:class:`EnvWeightedSampler` is a plain iterable of row indices in batch-sized runs (what
``torch.utils.data.DataLoader(sampler=..., batch_size=B, drop_last=True)`` needs); one epoch is
``ceil(len(dataset) / B)`` batches. Errors name ``nemo_gym.env_weights.<env>``.

Resume: the order of epoch ``e`` is a pure function of ``(seed, e)``, so the sampler's state is where the pass in
progress stands -- ``{epoch, yielded, seed}`` (:meth:`EnvWeightedSampler.state_dict`) -- which verl's
``StatefulDataLoader`` saves in each checkpoint's ``data.pt`` and a relaunch loads into a fresh sampler
(:meth:`EnvWeightedSampler.load_state_dict`): the next pass regenerates that epoch's order and skips what was already
drawn. Without it ``StatefulDataLoader`` fast-forwards a fresh sampler by the rows drawn in the current pass, i.e.
through epoch 0's order: a relaunch from a checkpoint taken after the first epoch drew other rows than the run it
continues.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from nemo_gym_adapter.errors import AdapterConfigError

KEY = "nemo_gym.env_weights"


def normalized_shares(weights: Mapping[str, float], envs: Sequence[str], *, key: str = KEY) -> dict[str, float]:
    """``{env: share}`` summing to 1 over the dataset's environments ``envs``.

    Raises:
        AdapterConfigError: a weighted environment is not in the data, a data environment has no weight (every
            environment of the data must be listed: 0 leaves it out), or every weight is 0. Names ``key.<env>``.
    """
    problems = []
    for env in sorted(set(weights) - set(envs)):
        problems.append(f"{key}.{env}: no row of the training data routes to {env!r} (environments: {sorted(envs)})")
    for env in sorted(set(envs) - set(weights)):
        problems.append(
            f"{key}.{env}: the training data has rows for {env!r} but it has no weight; add {key}.{env}=<w>"
        )
    if problems:
        raise AdapterConfigError("invalid recipe config:\n  " + "\n  ".join(problems))
    total = float(sum(weights[e] for e in envs))
    if total <= 0:
        raise AdapterConfigError(f"{key}: every weight is 0; at least one environment must be sampled")
    return {env: weights[env] / total for env in envs}


def batch_counts(shares: Mapping[str, float], batch_size: int, batch_index: int) -> dict[str, int]:
    """Rows per environment in batch ``batch_index`` (0-based): running totals follow ``share * batch_size`` per batch
    (largest remainder), so the counts sum to ``batch_size`` and never drift from the shares by a row or more."""

    def totals(k: int) -> dict[str, int]:
        exact = {env: share * batch_size * k for env, share in shares.items()}
        floor = {env: math.floor(v + 1e-9) for env, v in exact.items()}
        left = batch_size * k - sum(floor.values())
        # Ties go to the environment listed first (stable), so the sequence is deterministic.
        by_remainder = sorted(shares, key=lambda env: -(exact[env] - floor[env]))
        for env in by_remainder[:left]:
            floor[env] += 1
        return floor

    before, after = totals(batch_index), totals(batch_index + 1)
    return {env: after[env] - before[env] for env in shares}


class EnvWeightedSampler:
    """Row indices in batches of ``batch_size`` with each environment's share (see the module docstring).

    Args:
        env_names: the distinct environment names; ``env_codes[i]`` indexes them for dataset row ``i``.
        weights: ``nemo_gym.env_weights`` (relative, >= 0).
        batch_size: ``data.train_batch_size``.
        seed: row order within each environment (``data.seed``; None: 0).
    """

    def __init__(
        self,
        env_names: Sequence[str],
        env_codes: Any,
        weights: Mapping[str, float],
        batch_size: int,
        seed: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise AdapterConfigError(f"data.train_batch_size={batch_size}: must be >= 1")
        codes = np.asarray(env_codes)
        present = sorted({env_names[c] for c in np.unique(codes)}) if codes.size else []
        self.shares = normalized_shares(weights, present)
        self.rows = {env: np.flatnonzero(codes == env_names.index(env)) for env in present}
        self.batch_size = batch_size
        self.num_batches = max(1, math.ceil(len(codes) / batch_size))
        self.seed = 0 if seed is None else int(seed)
        self.epoch = 0  # the epoch the next pass draws
        self._position = (0, 0)  # (epoch being drawn, rows of it handed out): state_dict()
        self._resume: tuple[int, int] | None = None  # load_state_dict(): where the next pass starts

    def __len__(self) -> int:
        return self.num_batches * self.batch_size

    def state_dict(self) -> dict[str, int]:
        """Where the pass in progress stands: its epoch and how many of its rows were handed out (torchdata's
        ``Stateful``: ``StatefulDataLoader`` saves it in each checkpoint's ``data.pt``)."""
        epoch, yielded = self._position
        return {"epoch": epoch, "yielded": yielded, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume: the next pass continues epoch ``state["epoch"]`` after its first ``state["yielded"]`` rows."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise AdapterConfigError(
                f"data.seed={self.seed}: the checkpoint's environment-weighted sampler was seeded {state['seed']}; "
                "resume with the seed it was saved with (or trainer.resume_mode=disable to start over)"
            )
        self._resume = (int(state["epoch"]), int(state["yielded"]))

    def __iter__(self) -> Iterator[int]:
        # A generator: nothing below runs (no epoch is taken, no resume point used) until the first row is drawn, so
        # the extra iter() calls StatefulDataLoader makes while it builds and restores its iterators cost nothing.
        epoch, skip = self._resume if self._resume is not None else (self.epoch, 0)
        self._resume = None
        self.epoch = epoch + 1
        rng = np.random.default_rng([self.seed, epoch])
        queues: dict[str, list[int]] = {env: [] for env in self.shares}
        drawn = 0
        for b in range(self.num_batches):
            for env, count in batch_counts(self.shares, self.batch_size, b).items():
                for _ in range(count):
                    if not queues[env]:
                        queues[env] = rng.permutation(self.rows[env]).tolist()
                    row = int(queues[env].pop())
                    drawn += 1
                    if drawn <= skip:
                        continue
                    self._position = (epoch, drawn)
                    yield row
