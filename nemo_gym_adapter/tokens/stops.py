"""A token sequence and where its turn ends are: :class:`Stops`, found once per sequence and shared.

Every piece of the splice works on turn ends (stop ids): the turn count, the walk of the history check, the anchor's
turn end in the full render, the prefix render's ids reused segment by segment. Each request handles three long
sequences -- the model prefix (the anchor's ``prompt_token_ids`` + ``generation_token_ids``), the full render and
the history render -- and at agentic length (64 turns, 32k tokens) scanning them for stop ids was the splice's
largest cost, done four times over (the full render by the prefix reuse and the splice each, the history render
although the prefix reuse built it from the full render's segments). So a sequence's positions are found once,
carried with it as ``Stops``, and a history render built from the full render's segments gets its positions by
construction (:mod:`prefix_reuse`). Pure.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Sequence
from dataclasses import dataclass


def stop_positions(ids: Sequence[int], stops: Collection[int]) -> list[int]:
    """Sorted positions of every id in ``stops``: one C-level ``list.index`` scan per stop id (few), no Python loop
    per token (packing the ids into a C array and searching its bytes measured no faster at 32k tokens)."""
    found: list[int] = []
    seq = ids if isinstance(ids, list) else list(ids)
    for stop in stops:
        start = 0
        try:
            while True:
                start = seq.index(stop, start) + 1
                found.append(start - 1)
        except ValueError:
            pass
    found.sort()
    return found


@dataclass(frozen=True)
class Stops:
    """A token sequence ``ids`` with the sorted positions ``at`` of its stop ids; ``stop_ids``: which ids those are
    (empty when the maker did not say: then :meth:`for_stops` never reuses it)."""

    ids: list[int]
    at: list[int]
    stop_ids: frozenset[int] = frozenset()

    @classmethod
    def of(cls, ids: Sequence[int], stop_ids: Collection[int]) -> Stops:
        """``ids`` (a list is used as is, never modified; anything else copied) with its stop positions found."""
        seq = ids if isinstance(ids, list) else list(ids)
        stops = frozenset(stop_ids)
        return cls(seq, stop_positions(seq, stops), stops)

    @classmethod
    def for_stops(cls, ids: Sequence[int] | Stops, stop_ids: Collection[int]) -> Stops:
        """``ids`` as ``Stops`` of exactly ``stop_ids``: reused when it already is (positions found once per
        sequence), else found now."""
        if isinstance(ids, Stops) and ids.stop_ids == frozenset(stop_ids):
            return ids
        return cls.of(ids.ids if isinstance(ids, Stops) else ids, stop_ids)

    def first_from(self, pos: int) -> int:
        """Index into ``at`` of the first stop at or after ``pos``."""
        return bisect_left(self.at, pos)

    def last_before(self, pos: int, floor: int) -> int:
        """Position of the last stop in ``[floor, pos)``, or -1."""
        i = bisect_left(self.at, pos) - 1
        return self.at[i] if i >= 0 and self.at[i] >= floor else -1


def first_difference(a: list[int], i: int, b: list[int], j: int, n: int) -> int:
    """Smallest ``d <= n`` with ``a[i + d] != b[j + d]`` (``b`` may end first). Slice comparisons halve the range:
    O(n) element comparisons in C, no Python loop over tokens."""
    n = max(0, min(n, len(b) - j))
    lo, hi = 0, n
    if a[i : i + n] == b[j : j + n]:
        return n
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[i + lo : i + mid] == b[j + lo : j + mid]:
            lo = mid
        else:
            hi = mid
    return next((d for d in range(lo, hi) if a[i + d] != b[j + d]), hi)
