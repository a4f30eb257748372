"""A load's rows read back from the cache (``nemo_gym_adapter.data.rows.GymRows``): indexing, slicing, selecting and
iterating agree. What makes a row valid is checked file by file, with its ``file:line``, in ``tests/unit/data/test_dataset.py``
(the bad-JSONL corpus), whose row helpers this reuses.
"""

from __future__ import annotations

import pytest

from nemo_gym_adapter.data.dataset import load_gym_jsonl
from tests.unit.data.test_dataset import _row, _write


def test_gym_rows_index_slice_select_and_iterate_alike(tmp_path):
    path = _write(tmp_path / "d.jsonl", [_row(f"agent_{i % 3}", i=i) for i in range(10)])
    rows = load_gym_jsonl(path)
    assert [r.data["i"] for r in rows] == list(range(10))  # batched iteration
    assert [rows[i].data["i"] for i in range(-10, 0)] == list(range(10))  # negative indices
    assert [r.data["i"] for r in rows[7:2:-2]] == [7, 5, 3]
    picked = rows.select([9, 0, 4])
    assert [r.where for r in picked] == [f"{path}:10", f"{path}:1", f"{path}:5"]
    assert [r.data["i"] for r in picked.select([2, 0])] == [4, 9]  # a selection of a selection
    assert [r.data["i"] for r in picked] == [9, 0, 4]
    assert picked.env_counts == {"agent_0": 2, "agent_1": 1} and rows.env_counts["agent_0"] == 4
    with pytest.raises(IndexError):
        rows[10]
