"""Unit tests of Gym JSONL loading/validation and the verl ``data.custom_cls`` dataset.

The bad-file corpus ``tests/fixtures/bad_jsonl/`` holds one file per failure, each with exactly one bad line
(after good ones, sometimes after blank lines, some with a byte-order mark, CRLF or no final newline); :data:`CORPUS`
says which line and what the message must say. The cache behind the loader is tested in ``test_dataset_store.py``.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym_adapter.data.dataset import MAX_REPORTED_ERRORS, load_gym_jsonl
from nemo_gym_adapter.data.rows import GymRow
from nemo_gym_adapter.errors import DatasetError

BAD = Path(__file__).resolve().parents[2] / "fixtures" / "bad_jsonl"
KNOWN = {"weather_agent", "math_agent"}

# file → (bad line, text the message must contain, needs known_agents)
CORPUS = {
    "bad_json.jsonl": (3, "invalid JSON: Expecting ',' delimiter", False),
    "not_object.jsonl": (2, "a row must be a JSON object, got list", False),
    "missing_params.jsonl": (2, "missing required key 'responses_create_params'", False),
    "typo_params.jsonl": (4, "missing required key 'responses_create_params' (found 'response_create_params'", False),
    "typo_params_field.jsonl": (2, "'tool' (did you mean 'tools'?)", False),
    "params_not_object.jsonl": (1, "responses_create_params must be an object, got str", False),
    "missing_input.jsonl": (2, "responses_create_params.input is required", False),
    "input_bad_type.jsonl": (1, "input must be a string or a list, got int", False),
    "input_item_not_object.jsonl": (2, "responses_create_params.input[0] must be an object, got str", False),
    "tools_not_list.jsonl": (2, "responses_create_params.tools: Input should be a valid list", False),
    "agent_ref_no_name.jsonl": (2, "agent_ref must have a 'name' key, got keys ['nmae']", False),
    "agent_ref_bad_type.jsonl": (1, "agent_ref must be {'name': <agent>} or a string, got int 5", False),
    "agent_ref_empty.jsonl": (2, "agent_ref.name must be a non-empty string, got ''", False),
    "agent_ref_whitespace.jsonl": (2, "agent_ref has leading/trailing whitespace: 'weather_agent '", False),
    "task_source_bad_type.jsonl": (2, "task_source must be a non-empty string, got int 7", False),
    "no_routing.jsonl": (2, "row has neither agent_ref nor task_source", False),
    "unknown_agent.jsonl": (2, "unknown agent 'weather_agnet' (did you mean 'weather_agent'?)", True),
    "not_utf8.jsonl": (2, "not UTF-8", False),
    "materialized_row.jsonl": (2, "materialized task rows (task_id + task_input", False),
    # what editors write: line numbers count CRLF and blank lines; columns count leading blanks, not the BOM
    "crlf_blank_lines_bad_json.jsonl": (5, "invalid JSON: Expecting ',' delimiter", False),
    "bom_crlf_missing_params.jsonl": (3, "missing required key 'responses_create_params'", False),
    "no_final_newline_bad_row.jsonl": (3, "input must be a string or a list, got int", False),
    "bom_bad_json_column.jsonl": (1, "invalid JSON: Expecting value (column 31)", False),
    "cr_only_line_ends.jsonl": (1, "bare carriage return: CR-only (classic Mac) line ends?", False),
    "utf16.jsonl": (1, "the file is UTF-16 LE (byte-order mark ff fe); Gym JSONL must be UTF-8", False),
}


def _row(agent_ref=None, task_source=None, **verifier):
    row = {"responses_create_params": {"input": [{"role": "user", "content": "2+2?"}], "temperature": 1.0}}
    if agent_ref is not None:
        row["agent_ref"] = agent_ref
    if task_source is not None:
        row["task_source"] = task_source
    return {**row, **verifier}


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_corpus_is_complete():
    assert sorted(p.name for p in BAD.glob("*.jsonl")) == sorted(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_bad_file_is_reported_with_file_and_line(name):
    line, text, needs_known = CORPUS[name]
    path = BAD / name
    with pytest.raises(DatasetError) as info:
        load_gym_jsonl(path, known_agents=KNOWN if needs_known else None)
    message = str(info.value)
    assert f"{path}:{line}: " in message, message
    assert text in message, message
    assert message.startswith("1 invalid row(s)"), message  # the good lines around it are not reported


def test_all_errors_of_all_files_are_collected_in_one_report():
    paths = [BAD / "bad_json.jsonl", BAD / "typo_params.jsonl", BAD / "no_routing.jsonl"]
    with pytest.raises(DatasetError) as info:
        load_gym_jsonl(paths)
    message = str(info.value)
    assert message.startswith("3 invalid")
    for p, line in zip(paths, (3, 4, 2), strict=True):
        assert f"{p}:{line}: " in message


def test_report_is_capped(tmp_path):
    path = _write(tmp_path / "many.jsonl", ["{oops"] * (MAX_REPORTED_ERRORS + 5))
    with pytest.raises(DatasetError, match=r"and 5 more") as info:
        load_gym_jsonl(path)
    assert f"{path}:{MAX_REPORTED_ERRORS}: " in str(info.value)
    assert f"{path}:{MAX_REPORTED_ERRORS + 1}: " not in str(info.value)


def test_missing_empty_and_no_files(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.jsonl: dataset file not found"):
        load_gym_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(DatasetError, match="no rows"):
        load_gym_jsonl(_write(tmp_path / "empty.jsonl", ["", "  "]))
    with pytest.raises(DatasetError, match="no dataset files"):
        load_gym_jsonl([])


def test_mixed_environments_over_several_files_keep_rows_unmodified(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_row({"name": "weather_agent", "type": "responses_api_agents"}, expected="x")])
    b = _write(
        tmp_path / "b.jsonl",
        ["", _row("math_agent", question="2+2?", expected_answer="4"), _row(task_source="math_with_judge")],
    )
    rows = load_gym_jsonl([a, b], task_source_map={"math_with_judge": "math_agent"})
    assert [r.env_name for r in rows] == ["weather_agent", "math_agent", "math_agent"]
    assert [r.where for r in rows] == [f"{a}:1", f"{b}:2", f"{b}:3"]
    raw = [json.loads(x) for x in a.read_text().splitlines() + b.read_text().splitlines() if x]
    assert [r.data for r in rows] == raw  # verifier fields, agent_ref extras, params: all as written
    copy_ = rows[1].to_dict()
    copy_["responses_create_params"]["input"].clear()
    assert rows[1].data == raw[1]  # to_dict is a private deep copy


def test_known_agents_check_applies_after_task_source_mapping(tmp_path):
    path = _write(tmp_path / "d.jsonl", [_row(task_source="math_with_judge")])
    with pytest.raises(DatasetError, match=r"task_source names unknown agent 'math_with_judge'.*task_source_map"):
        load_gym_jsonl(path, known_agents=KNOWN)
    rows = load_gym_jsonl(path, known_agents=KNOWN, task_source_map={"math_with_judge": "math_agent"})
    assert rows[0].env_name == "math_agent"


def test_default_agent_routes_rows_without_routing(tmp_path):
    path = _write(tmp_path / "d.jsonl", [_row()])
    assert load_gym_jsonl(path, default_agent="weather_agent")[0].env_name == "weather_agent"


def test_loader_does_not_import_torch(tmp_path):
    path = _write(tmp_path / "d.jsonl", [_row("weather_agent")])
    code = (
        "import sys; from nemo_gym_adapter.data.dataset import load_gym_jsonl; "
        f"load_gym_jsonl({str(path)!r}); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------------------------- verl dataset
@pytest.fixture()
def two_env_files(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_row("weather_agent", expected="cold"), _row("weather_agent", expected="hot")])
    b = _write(tmp_path / "b.jsonl", [_row(task_source="math_with_judge", expected_answer="4")])
    return [str(a), str(b)]


def _config(**nemo_gym):
    from omegaconf import OmegaConf

    return OmegaConf.create({"shuffle": False, "seed": 1, "nemo_gym": nemo_gym})


def test_dataset_rows_in_verls_shape(two_env_files):
    import torch

    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    config = _config(known_agents=sorted(KNOWN), task_source_map={"math_with_judge": "math_agent"})
    ds = GymJsonlDataset(data_files=two_env_files, tokenizer=None, processor=None, config=config, max_samples=-1)
    assert isinstance(ds, torch.utils.data.Dataset) and len(ds) == 3 and ds.env_names == ["math_agent", "weather_agent"]
    item = ds[2]
    assert item["dummy_tensor"].tolist() == [0]
    assert item["gym_env"] == item["data_source"] == "math_agent" and item["index"] == 2
    assert item["gym_row"] == json.loads(Path(two_env_files[1]).read_text())
    assert item["extra_info"] == {"index": 2, "gym_env": "math_agent", "source": f"{two_env_files[1]}:1"}
    assert item["raw_prompt"] == item["gym_row"]["responses_create_params"]["input"]  # verl v1 counts prompts by it
    item["gym_row"]["responses_create_params"].clear()
    assert ds[2]["gym_row"]["responses_create_params"]  # every access gets a fresh copy


def test_dataset_validates_with_config_known_agents(two_env_files):
    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    with pytest.raises(DatasetError, match=r"b\.jsonl:1: task_source names unknown agent 'math_with_judge'"):
        GymJsonlDataset(two_env_files, None, _config(known_agents=sorted(KNOWN)))


def test_dataset_max_samples(two_env_files):
    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    ds = GymJsonlDataset(two_env_files, None, _config(default_agent="x"), max_samples=2)
    assert [ds[i]["extra_info"]["source"] for i in range(2)] == [f"{two_env_files[0]}:1", f"{two_env_files[0]}:2"]
    from omegaconf import OmegaConf

    shuffled = GymJsonlDataset(two_env_files, None, OmegaConf.create({"shuffle": True, "seed": 3}), max_samples=2)
    assert len(shuffled) == 2


def test_dataset_pickles_for_dataloader_workers(two_env_files):
    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    ds = GymJsonlDataset(two_env_files, None, _config(task_source_map={"math_with_judge": "math_agent"}))
    clone = pickle.loads(pickle.dumps(ds))
    assert type(clone) is GymJsonlDataset and clone[0]["gym_row"] == ds[0]["gym_row"]
    assert isinstance(ds.rows[0], GymRow)


def test_verl_loads_collates_and_wraps_the_dataset(two_env_files):
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    data_config = OmegaConf.create(
        {
            "custom_cls": {"path": "pkg://nemo_gym_adapter.data.dataset", "name": "GymJsonlDataset"},
            "nemo_gym": {"task_source_map": {"math_with_judge": "math_agent"}},
        }
    )
    ds = create_rl_dataset(two_env_files, data_config, tokenizer=None, processor=None)
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]))
    assert batch.batch["dummy_tensor"].shape == (3, 1)
    assert batch.non_tensor_batch["gym_env"].tolist() == ["weather_agent", "weather_agent", "math_agent"]
    assert batch.non_tensor_batch["gym_row"][0]["expected"] == "cold"
    repeated = batch.repeat(repeat_times=2, interleave=True)  # what the trainer does for rollout.n
    assert repeated.non_tensor_batch["gym_env"].tolist()[:2] == ["weather_agent", "weather_agent"]


# ----------------------------------------------------------------------------------------------- exact round trip
# Rows whose types Arrow's schema inference would unify or fill in (ints vs floats vs strings vs null in one field,
# keys present in one row only, nested JSON strings, exotic number spellings): they must reach Gym exactly as written.
TRICKY_LINES = [
    '{"responses_create_params": {"input": "x", "temperature": 1, "top_p": 0.95, "metadata": {"extra_body": '
    '"{\\"chat_template_kwargs\\": {\\"enable_thinking\\": false}}"}}, "agent_ref": "a", "n": 1, "f": 1.0, '
    '"big": 1180591620717411303424, "neg0": -0.0, "tiny": 5e-324, "s": "1", "none": null, "t": true, '
    '"nested": {"x": [[], {}, [null, false, 0]]}, "uni": "é\u2028☕😀", "esc": "tab\\tnl\\n\\u00e9", "nan": NaN}',
    '{"responses_create_params": {"input": [{"role": "user", "content": "x"}]}, "task_source": "a", "n": "1", '
    '"f": null, "nested": "flat now"}',
    '{ "responses_create_params" : { "input" : "\\u00e9" } , "agent_ref":{"name":"a","type":"t"}, "x": 1E2, '
    '"y": 1.50, "dup": 1, "dup": 2}',
]


def test_rows_round_trip_exactly(tmp_path):
    import math

    path = tmp_path / "tricky.jsonl"
    path.write_text("\n".join(TRICKY_LINES) + "\n", encoding="utf-8")
    rows = load_gym_jsonl(path)
    expected = [json.loads(line) for line in TRICKY_LINES]
    # json.dumps tells 1 from 1.0 from true and keeps key order; == alone would not (1 == 1.0 == True)
    assert [json.dumps(r.data) for r in rows] == [json.dumps(e) for e in expected]
    assert [rows.store.record(i).text for i in range(3)] == TRICKY_LINES  # the stored text is the line itself
    first = rows[0].data
    assert type(first["n"]) is int and type(first["f"]) is float and first["big"] == 2**70 and math.isnan(first["nan"])
    assert rows[1].data["n"] == "1" and "big" not in rows[1].data and rows[2].data["dup"] == 2


def test_dataset_items_carry_rows_exactly_through_verls_collate(tmp_path):
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    path = tmp_path / "tricky.jsonl"
    path.write_text("\n".join(TRICKY_LINES) + "\n", encoding="utf-8")
    ds = GymJsonlDataset([str(path)], None, _config())
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]))
    got = [json.dumps(r) for r in batch.non_tensor_batch["gym_row"]]
    assert got == [json.dumps(json.loads(line)) for line in TRICKY_LINES]


def test_max_samples_picks_the_rows_verls_own_dataset_picks(tmp_path):
    import numpy as np
    from omegaconf import OmegaConf

    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    path = _write(tmp_path / "d.jsonl", [_row("a", i=i) for i in range(50)])
    config = OmegaConf.create({"shuffle": True, "seed": 7})
    ds = GymJsonlDataset(str(path), None, config, max_samples=5)
    expected = np.random.default_rng(7).choice(50, size=5, replace=False).tolist()  # RLHFDataset's selection
    assert [ds[i]["gym_row"]["i"] for i in range(5)] == expected
    assert [ds[i]["extra_info"]["source"] for i in range(5)] == [f"{path}:{n + 1}" for n in expected]


def test_verls_sampler_and_resumable_dataloader_with_workers_see_every_row_once(tmp_path):
    """verl's RandomSampler + StatefulDataLoader (2 forked workers): an epoch split by a checkpoint and a resume."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn

    from nemo_gym_adapter.data.dataset import GymJsonlDataset

    path = _write(tmp_path / "d.jsonl", [_row("a", i=i) for i in range(12)])
    config = OmegaConf.create({"shuffle": True, "seed": 3})

    def loader():
        ds = GymJsonlDataset(str(path), None, config)
        return StatefulDataLoader(
            ds, batch_size=3, sampler=create_rl_sampler(config, ds), collate_fn=collate_fn, num_workers=2
        )

    first = loader()
    it = iter(first)
    seen = [r["i"] for _ in range(2) for r in next(it)["gym_row"]]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    seen += [r["i"] for batch in resumed for r in batch["gym_row"]]
    assert sorted(seen) == list(range(12)) and seen != list(range(12))  # all rows once, shuffled


def test_empty_input_is_gyms_contract_too(tmp_path):
    # agents that build the dialogue from other row fields (Gym's scicode, toolsandbox examples) ship `input: []`
    rows = load_gym_jsonl(
        _write(tmp_path / "empty.jsonl", [{"responses_create_params": {"input": []}, "agent_ref": "scicode_agent"},
                                          {"responses_create_params": {"input": ""}, "agent_ref": "scicode_agent"}])
    )  # fmt: skip
    assert [r.env_name for r in rows] == ["scicode_agent", "scicode_agent"]
