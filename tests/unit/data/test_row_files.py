"""The row generators' shared writer and command line."""

from __future__ import annotations

import json

from nemo_gym_adapter.data.row_files import split_parser, write_jsonl
from nemo_gym_adapter.runtime import paths


def test_rows_are_written_one_json_object_per_line_unescaped(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl([{"q": "Zürich?"}, {"q": 2}], path)
    text = path.read_text(encoding="utf-8")
    assert text == '{"q": "Zürich?"}\n{"q": 2}\n'
    assert [json.loads(line) for line in text.splitlines()] == [{"q": "Zürich?"}, {"q": 2}]


def test_the_split_parser_defaults_and_description():
    p = split_parser("First paragraph.\n\nMore.", train=8, val=4, seed=7)
    args = p.parse_args([])
    assert (args.out, args.train, args.val, args.seed) == (paths.REPO_ROOT / "configs" / "data", 8, 4, 7)
    assert p.description == "First paragraph."
    assert p.parse_args(["--val", "2"]).val == 2
