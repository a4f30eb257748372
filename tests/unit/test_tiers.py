"""The test tiers (``tests/conftest.py``): the default run leaves the slow tier out, ``--slow`` runs only it,
``--with-slow`` everything; each test's tier for the time per tier. With fake pytest items and config (named fakes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import _select_tier, tier


class FakeItem:
    def __init__(self, name: str, *markers: str) -> None:
        self.nodeid, self.markers = name, set(markers)

    def get_closest_marker(self, name: str):
        return SimpleNamespace(name=name) if name in self.markers else None


class FakeConfig:
    def __init__(self, **options: bool) -> None:
        self.options, self.deselected = options, []
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))

    def getoption(self, name: str) -> bool:
        return self.options.get(name.lstrip("-").replace("-", "_"), False)


ITEMS = [FakeItem("u"), FakeItem("i", "integration"), FakeItem("e", "e2e"), FakeItem("s", "e2e", "slow")]


@pytest.mark.parametrize(
    ("options", "kept"),
    [({}, ["u", "i", "e"]), ({"slow": True}, ["s"]), ({"with_slow": True}, ["u", "i", "e", "s"])],
)
def test_the_slow_tier_is_deselected_by_default_and_selected_alone_or_with_the_rest(options, kept):
    items, config = list(ITEMS), FakeConfig(**options)
    _select_tier(config, items)
    assert [i.nodeid for i in items] == kept
    assert sorted(i.nodeid for i in config.deselected) == sorted(set("uies") - set(kept))  # deselected, not lost


def test_each_test_counts_in_one_tier_slow_first():
    assert [tier(i) for i in ITEMS] == ["unit", "integration", "e2e", "slow"]
