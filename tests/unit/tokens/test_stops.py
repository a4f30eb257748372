"""``tokens.stops``: stop positions found once per sequence, and the first difference of two token spans."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.tokens.stops import Stops, first_difference, stop_positions

STOPS = frozenset({2, 3})


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 6), max_size=120), stops=st.frozensets(st.integers(0, 6), max_size=3))
def test_stop_positions_match_a_plain_scan(ids, stops):
    assert stop_positions(ids, stops) == [i for i, t in enumerate(ids) if t in stops]
    assert stop_positions(tuple(ids), stops) == stop_positions(ids, stops)


def test_stop_positions_of_ids_beyond_32_bits_and_huge_stop_ids():
    ids = [2**40, 2, 2**64 - 1, 3, 2]
    assert stop_positions(ids, {2, 2**64 - 1}) == [1, 2, 4]


def test_stops_are_reused_only_for_the_same_stop_ids():
    found = Stops.of([1, 2, 3, 2], STOPS)
    assert (found.at, found.stop_ids) == ([1, 2, 3], STOPS)
    assert Stops.for_stops(found, {2, 3}) is found  # found once per sequence
    other = Stops.for_stops(found, {3})
    assert other is not found and other.at == [2] and other.ids is found.ids
    assert Stops.for_stops([3, 1], STOPS).at == [0]
    # Stops made without saying which ids they are never pass for any set's.
    assert Stops.for_stops(Stops([2, 2], [0]), STOPS).at == [0, 1]


def test_stops_of_a_list_uses_it_and_of_anything_else_copies():
    ids = [1, 2]
    assert Stops.of(ids, STOPS).ids is ids
    assert Stops.of((1, 2), STOPS).ids == [1, 2]


def test_first_and_last_stop_lookups():
    s = Stops.of([0, 2, 0, 3, 0, 2], STOPS)
    assert [s.first_from(p) for p in (0, 1, 2, 4, 6)] == [0, 0, 1, 2, 3]
    assert s.last_before(5, 0) == 3 and s.last_before(5, 4) == -1 and s.last_before(1, 0) == -1


@settings(max_examples=200, deadline=None)
@given(
    a=st.lists(st.integers(0, 3), max_size=80),
    b=st.lists(st.integers(0, 3), max_size=80),
    i=st.integers(0, 5),
    j=st.integers(0, 5),
)
def test_first_difference_matches_a_plain_scan(a, b, i, j):
    n = max(0, len(a) - i)
    plain = next((d for d in range(n) if j + d >= len(b) or a[i + d] != b[j + d]), n)
    assert first_difference(a, i, b, j, n) == plain
