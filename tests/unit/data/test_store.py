"""Unit tests of the validated-rows cache behind the Gym dataset: keyed by content, settings and validator code;
hit = no validation; memory-mapped; safe against damage, races, changing files and unwritable disks."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from nemo_gym_adapter.data import dataset as dataset_mod
from nemo_gym_adapter.data import store as dataset_store
from nemo_gym_adapter.data.dataset import check_gym_jsonl, load_gym_jsonl
from nemo_gym_adapter.errors import DatasetError


def _write(path: Path, n: int = 5, agent: str = "weather_agent", bad_line: int | None = None) -> Path:
    lines = [json.dumps({"responses_create_params": {"input": f"q{i}"}, "agent_ref": agent, "i": i}) for i in range(n)]
    if bad_line is not None:
        lines[bad_line - 1] = '{"responses_create_params": {"input": 7}, "agent_ref": "weather_agent"}'
    path.write_text("\n".join(lines) + "\n")
    return path


def _entries(root: Path) -> list[str]:
    base = root / dataset_store.CACHE_SUBDIR
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def test_a_second_load_of_the_same_contents_skips_validation(tmp_path, monkeypatch):
    path = _write(tmp_path / "d.jsonl")
    first = load_gym_jsonl(path, cache_dir=tmp_path / "c")
    monkeypatch.setattr(dataset_mod, "validate_row", lambda *a, **k: pytest.fail("validated again"))
    second = load_gym_jsonl(path, cache_dir=tmp_path / "c")
    assert [r.data for r in second] == [r.data for r in first] and len(_entries(tmp_path / "c")) == 1


def test_validation_settings_are_part_of_the_key(tmp_path):
    path = _write(tmp_path / "d.jsonl")
    load_gym_jsonl(path, cache_dir=tmp_path / "c")
    with pytest.raises(DatasetError, match=r"d\.jsonl:1: agent_ref names unknown agent 'weather_agent'"):
        load_gym_jsonl(path, known_agents={"math_agent"}, cache_dir=tmp_path / "c")
    load_gym_jsonl(path, known_agents={"weather_agent"}, cache_dir=tmp_path / "c")
    load_gym_jsonl(path, default_agent="x", cache_dir=tmp_path / "c")
    assert len(_entries(tmp_path / "c")) == 3


def test_validator_code_is_part_of_the_key(tmp_path, monkeypatch):
    path = _write(tmp_path / "d.jsonl")
    load_gym_jsonl(path, cache_dir=tmp_path / "c")
    monkeypatch.setattr(dataset_mod, "_validator_fingerprint", lambda: "a changed validator")
    load_gym_jsonl(path, cache_dir=tmp_path / "c")
    assert len(_entries(tmp_path / "c")) == 2


def test_changed_contents_are_validated_again(tmp_path):
    path = _write(tmp_path / "d.jsonl")
    load_gym_jsonl(path, cache_dir=tmp_path / "c")
    _write(path, bad_line=4)  # same path, same size class: only the contents tell
    with pytest.raises(
        DatasetError, match=r"d\.jsonl:4: responses_create_params\.input must be a string or a list, got int"
    ):
        load_gym_jsonl(path, cache_dir=tmp_path / "c")
    assert len(_entries(tmp_path / "c")) == 1  # a failed validation leaves nothing behind, not even a temp dir


def test_copied_file_is_served_from_the_cache_with_its_own_path(tmp_path, monkeypatch):
    original = _write(tmp_path / "a.jsonl")
    load_gym_jsonl(original, cache_dir=tmp_path / "c")
    copy = tmp_path / "elsewhere" / "b.jsonl"
    copy.parent.mkdir()
    shutil.copy(original, copy)
    monkeypatch.setattr(dataset_mod, "validate_row", lambda *a, **k: pytest.fail("validated again"))
    rows = load_gym_jsonl(copy, cache_dir=tmp_path / "c")
    assert rows[2].where == f"{copy}:3"


def test_rows_are_memory_mapped_and_the_dataset_pickles_without_them(tmp_path):
    from datasets.table import MemoryMappedTable

    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    path = _write(tmp_path / "d.jsonl", n=3000)
    ds = GymJsonlDataset(str(path), None, None, cache_dir=str(tmp_path / "c"))
    assert isinstance(ds.rows.dataset.data, MemoryMappedTable)
    blob = pickle.dumps(ds)
    assert path.stat().st_size > 150_000 and len(blob) < 5000  # paths and settings, not rows
    clone = pickle.loads(blob)
    assert clone[2999]["gym_row"] == ds[2999]["gym_row"] == json.loads(path.read_text().splitlines()[-1])


def test_a_damaged_entry_is_rebuilt(tmp_path, caplog):
    path = _write(tmp_path / "d.jsonl", n=50)
    load_gym_jsonl(path, cache_dir=tmp_path / "c")
    (entry,) = _entries(tmp_path / "c")
    table = tmp_path / "c" / dataset_store.CACHE_SUBDIR / entry / "rows.arrow"
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    rows = load_gym_jsonl(path, cache_dir=tmp_path / "c")
    assert [r.data["i"] for r in rows] == list(range(50)) and "unreadable" in caplog.text


def test_a_concurrent_builder_of_the_same_key_keeps_the_first_entry(tmp_path):
    path = _write(tmp_path / "d.jsonl")
    load_gym_jsonl(path, cache_dir=tmp_path / "c")
    (key,) = _entries(tmp_path / "c")
    late = dataset_store.EntryBuilder(tmp_path / "c", key)  # another node that validated the same files
    late.add('{"responses_create_params": {"input": "late"}}', "weather_agent", 0, 1)
    entry = late.commit({})
    assert entry.name == key and _entries(tmp_path / "c") == [key]
    assert len(load_gym_jsonl(path, cache_dir=tmp_path / "c")) == 5


def test_a_file_changing_while_it_loads_is_reported(tmp_path, monkeypatch):
    path = _write(tmp_path / "d.jsonl")
    monkeypatch.setattr(dataset_store, "content_hash", lambda p: "contents hashed before a writer changed them")
    with pytest.raises(DatasetError, match=r"d\.jsonl: the file changed while it was being loaded"):
        load_gym_jsonl(path, cache_dir=tmp_path / "c")
    assert _entries(tmp_path / "c") == []


def test_an_unwritable_cache_is_reported_with_the_way_out(tmp_path):
    path = _write(tmp_path / "d.jsonl")
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    with pytest.raises(DatasetError, match=r"cannot write the dataset cache under .*not_a_dir.*HF_DATASETS_CACHE"):
        load_gym_jsonl(path, cache_dir=blocker)


def test_the_cache_lives_under_hf_datasets_cache_unless_configured(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    path = _write(tmp_path / "d.jsonl")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    load_gym_jsonl(path)
    assert len(_entries(tmp_path / "hf")) == 1
    GymJsonlDataset(str(path), None, OmegaConf.create({"nemo_gym": {"cache_dir": str(tmp_path / "mine")}}))
    assert len(_entries(tmp_path / "mine")) == 1


def test_records_in_batches_match_records_one_by_one(tmp_path):
    path = _write(tmp_path / "d.jsonl", n=300)
    store = load_gym_jsonl(path, cache_dir=tmp_path / "c").store
    picked = store.select(list(range(299, -1, -3)))
    for view in (store, picked):
        assert list(view.records(batch_rows=7)) == [view.record(i) for i in range(len(view))]
    assert os.fspath(picked.entry) == os.fspath(store.entry)  # a view, not a copy


def test_a_check_validates_into_the_entry_a_load_then_maps(tmp_path):
    path = _write(tmp_path / "d.jsonl")
    entry = check_gym_jsonl(path, cache_dir=tmp_path / "c")  # validated, committed, not mapped
    assert load_gym_jsonl(path, cache_dir=tmp_path / "c").store.entry == entry  # a cache hit: the same entry
    assert check_gym_jsonl(path, cache_dir=tmp_path / "c") == entry and len(_entries(tmp_path / "c")) == 1
    _write(path, bad_line=2)
    with pytest.raises(DatasetError, match=r"d\.jsonl:2: "):
        check_gym_jsonl(path, cache_dir=tmp_path / "c")
