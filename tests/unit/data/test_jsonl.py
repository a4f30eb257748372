"""Unit tests of reading Gym JSONL as editors write it: UTF-8 byte-order marks, CRLF, blank/whitespace lines, no
final newline (``tests/fixtures/encodings_jsonl/``); the malformed variants live in ``tests/fixtures/bad_jsonl/``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym_adapter.data.dataset import load_gym_jsonl
from nemo_gym_adapter.data.jsonl import read_lines, read_objects
from nemo_gym_adapter.errors import DatasetError

GOOD = Path(__file__).resolve().parents[2] / "fixtures" / "encodings_jsonl"
BOM = b"\xef\xbb\xbf"

# file → (line number of each of the three rows, a byte pattern the file must contain for the test to mean anything)
ENCODINGS = {
    "lf.jsonl": ((1, 2, 3), b"}\n{"),
    "bom.jsonl": ((1, 2, 3), BOM + b"{"),
    "crlf.jsonl": ((1, 2, 3), b"}\r\n{"),
    "blank_lines.jsonl": ((2, 6, 8), b"\n\n   \n\t\n"),
    "no_final_newline.jsonl": ((1, 2, 3), b"}"),
    "windows_editor.jsonl": ((1, 3, 5), b"   \r\n  \t \r\n"),
    "concatenated_boms.jsonl": ((1, 2, 3), b"\r\n" + BOM + b"{"),
}


def test_fixtures_are_byte_exact():
    """A checkout that normalised line ends or dropped BOMs would make the tests below pass for nothing."""
    assert sorted(p.name for p in GOOD.glob("*.jsonl")) == sorted(ENCODINGS)
    for name, (_, pattern) in ENCODINGS.items():
        data = (GOOD / name).read_bytes()
        assert pattern in data, name
    assert not (GOOD / "no_final_newline.jsonl").read_bytes().endswith(b"\n")
    assert b"\r" not in (GOOD / "lf.jsonl").read_bytes()


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_editor_encodings_load_like_plain_utf8_lf(name):
    reference = load_gym_jsonl(GOOD / "lf.jsonl")
    rows = load_gym_jsonl(GOOD / name)
    lines, _ = ENCODINGS[name]
    assert [r.line for r in rows] == list(lines)
    assert [r.data for r in rows] == [r.data for r in reference]
    assert [json.dumps(r.data) for r in rows] == [json.dumps(r.data) for r in reference]  # 4 stays 4, 4.0 stays 4.0
    assert [r.env_name for r in rows] == ["weather_agent", "math_agent", "weather_agent"]


def test_read_lines_strips_line_ends_and_boms_and_counts_every_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(BOM + b'  {"a": 1}\r\n\r\n \t\r\n' + BOM + b'{"b": "\xe2\x80\xa8"}\n{"c": 2}')
    assert list(read_lines(str(path))) == [(1, '{"a": 1}', 2), (4, '{"b": "\u2028"}', 0), (5, '{"c": 2}', 0)]


def test_a_line_that_is_not_utf8_is_reported_and_the_rest_still_checked(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"responses_create_params": {"input": "caf\xe9"}}\n{"no_params": 1}\n')
    with pytest.raises(DatasetError) as info:
        load_gym_jsonl(path, default_agent="a")
    message = str(info.value)
    assert message.startswith("2 invalid") and f"{path}:1: not UTF-8" in message and f"{path}:2: missing" in message


def test_read_objects_names_the_first_line_that_is_not_an_object(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text('{"a": 1}\n\n[1, 2]\n{"b": 2}\n', encoding="utf-8")
    objects = read_objects(str(p))
    assert next(objects) == (1, '{"a": 1}', {"a": 1})
    with pytest.raises(DatasetError, match=rf"{p}:3: a JSON object expected, got list"):
        next(objects)
