"""What a person watching a step sees: a progress bar of rollouts with throughput and per-agent counts.

tqdm's own rate (rollouts/s) plus ``<agent>=<done>`` for every agent and ``failed=<n>`` once a row failed. Shown
only when stderr is a TTY unless asked for (``enabled=True``/``False``): trainers log to files, where a bar is noise.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol


class _Done(Protocol):
    """What the bar needs of a finished row (``client.RolloutOutcome``)."""

    @property
    def agent(self) -> str | None: ...

    @property
    def ok(self) -> bool: ...


class RolloutProgress:
    """A tqdm bar with rollouts/s and per-agent done counts; a no-op when disabled. Use as a context manager."""

    def __init__(self, total: int, enabled: bool | None, desc: str) -> None:
        from tqdm.auto import tqdm

        # tqdm's disable=None means "off when not a TTY", which is the default we want.
        self._bar = tqdm(total=total, desc=desc, unit="rollout", disable=None if enabled is None else not enabled)
        self._done: Counter[str] = Counter()
        self._failed = 0

    def update(self, outcome: _Done) -> None:
        """Count one finished row (in completion order); nothing to do when the bar is not shown."""
        if self._bar.disable:
            return
        self._done[outcome.agent or "?"] += 1
        self._failed += 0 if outcome.ok else 1
        parts = [f"{name}={n}" for name, n in sorted(self._done.items())]
        if self._failed:
            parts.append(f"failed={self._failed}")
        self._bar.set_postfix_str(" ".join(parts), refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> RolloutProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
