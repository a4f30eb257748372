"""The latency toy's committed rows are exactly what ``scripts/make_toy_latency_data.py`` generates, and every row's
``expected_code`` is what our Gym server (``gym_servers/resources_servers/toy_latency/app.py``, run in Gym's own
interpreter here, as Gym runs it) answers for its word and accepts as the right submission."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nemo_gym_adapter.runtime import paths
from tests.support.row_scripts import assert_regenerated, load_script

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "configs" / "gym" / "data"
SERVER = REPO / "gym_servers" / "resources_servers" / "toy_latency"


def _rows() -> list[dict]:
    return [json.loads(line) for f in ("toy_latency.jsonl", "toy_latency_val.jsonl") for line in (DATA / f).open()]


def test_the_committed_rows_are_the_generators_output(tmp_path):
    assert_regenerated(
        load_script("make_toy_latency_data"), tmp_path, ("toy_latency.jsonl", "toy_latency_val.jsonl"), DATA
    )


def test_every_reply_choice_is_a_tool_call_and_the_right_one_is_offered():
    rows = _rows()
    assert len(rows) == 40 and len({r["word"] for r in rows}) == 40
    for r in rows:
        choices = json.loads(r["responses_create_params"]["metadata"]["extra_body"])["structured_outputs"]["choice"]
        calls = [json.loads(c.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")) for c in choices]
        assert [c["name"] for c in calls] == ["lookup_code", "submit_code", "submit_code"]
        assert calls[1]["arguments"] == {"code": r["expected_code"]} and calls[2]["arguments"] == {"code": -1}


CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from types import SimpleNamespace as NS
import app
rows = json.load(sys.stdin)
bad = [r["word"] for r in rows if app.word_code(r["word"]) != r["expected_code"]]
call = lambda name, args: NS(type="function_call", name=name, arguments=json.dumps(args))
out = {
    "bad": bad,
    "last_right": app.last_submission([call("submit_code", {"code": -1}), call("submit_code", {"code": 7})]),
    "lookup_only": app.last_submission([call("lookup_code", {"word": "x"})]),
    "garbled": app.last_submission([call("submit_code", {"code": True})]),
}
print(json.dumps(out))
"""


def test_the_server_answers_the_rows_codes_in_gyms_interpreter():
    python = paths.gym_venv() / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no Gym venv at {python.parent.parent} (scripts/setup.sh builds it)")
    done = subprocess.run(
        [str(python), "-c", CHECK, str(SERVER)], input=json.dumps(_rows()), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"bad": [], "last_right": 7, "lookup_only": None, "garbled": None}
