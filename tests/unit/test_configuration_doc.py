"""docs/CONFIGURATION.md stays in step with configs/base/nemo_gym_recipe.yaml, the file that holds every default.

The page's key tables (header ``| key | default | ... |``, one row per dotted key, the key in one code span, the
default as the first code span of its cell) are read as data. :func:`check` compares them with the base file:

- every leaf key of ``nemo_gym:`` and of ``data.nemo_gym`` in the base file has its row;
- the page names no ``nemo_gym.*`` key the base file does not have (``data.nemo_gym.*`` options the dataset reads
  but the base file does not set are rows whose default says ``unset``);
- every key the base file sets (ours or verl's) states the base file's default (compared as parsed YAML values:
  ``120`` and ``120.0`` are the same default, ``true`` and ``1`` are not);
- a key the base file does not set says whose default it is: ``verl: ...`` or ``unset``.

The base file is in turn checked against the pydantic model of the section (``nemo_gym_adapter/config.py``): the
same keys, the same defaults (except ``config_paths``, which the model leaves empty: required unless ``head_url``),
and the page's ``data.nemo_gym`` rows against the options the dataset reads. The README's short keys table (same
format) states the same defaults as the page. Each check has a control: a copy of the page, the README or the base
file changed one way is caught.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from pydantic import BaseModel, SecretStr

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "CONFIGURATION.md"
README = REPO / "README.md"
BASE = REPO / "configs" / "base" / "nemo_gym_recipe.yaml"
OURS = ("nemo_gym", "data.nemo_gym")  # the sections every key of which the page must list
_CELL = re.compile(r"(?<!\\)\|")  # a table cell boundary (an escaped \| is text)
_CODE = re.compile(r"`([^`]*)`")
_KEY = re.compile(r"`([A-Za-z_][\w.]*)`")


@dataclass(frozen=True)
class Row:
    key: str
    default: str  # the default cell as written (escaped pipes unescaped)
    line: int


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in _CELL.split(line.strip())[1:-1]]


def key_rows(text: str) -> tuple[dict[str, Row], list[str]]:
    """The rows of every ``| key | default | ... |`` table: {dotted key: row}, and the rows that do not parse."""
    rows: dict[str, Row] = {}
    problems: list[str] = []
    in_table = False
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if cells[:2] == ["key", "default"]:
            in_table = True
            continue
        if not in_table or set("".join(cells)) <= set("-: "):
            continue
        match = _KEY.fullmatch(cells[0]) if len(cells) >= 3 else None
        if match is None:
            problems.append(f"line {number}: a key row needs `<dotted key>` | default | what: {line.strip()[:80]}")
        elif match.group(1) in rows:
            problems.append(f"line {number}: {match.group(1)} has a row already (line {rows[match.group(1)].line})")
        else:
            rows[match.group(1)] = Row(match.group(1), cells[1], number)
    return rows, problems


def leaves(node: Any, prefix: str) -> dict[str, Any]:
    """{dotted key: value} of a plain config tree; an empty mapping is a value (``config_overrides: {}``)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for name, child in node.items():
            out.update(leaves(child, f"{prefix}.{name}" if prefix else str(name)))
        return out
    return {prefix: node}


def load_base(text: str | None = None) -> dict[str, Any]:
    """The base file as a plain tree, interpolations as written (``${ngv_manager:...}``), hydra's defaults list out."""
    cfg = OmegaConf.create(text) if text is not None else OmegaConf.load(BASE)
    tree = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(tree, dict)
    tree.pop("defaults", None)
    return tree


def _yaml_value(text: str) -> Any:
    """A default as written on the page, read with the loader the base file is read with (OmegaConf's YAML)."""
    return OmegaConf.to_container(OmegaConf.create(f"v: {text}"))["v"]


def _plain(value: Any) -> Any:
    """Comparable form: numbers as floats (``120`` == ``120.0``), booleans apart from numbers, containers deep."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def same(a: Any, b: Any) -> bool:
    return json.dumps(_plain(a), sort_keys=True) == json.dumps(_plain(b), sort_keys=True)


def _in_ours(key: str) -> bool:
    return any(key == s or key.startswith(s + ".") for s in OURS)


def check(doc_text: str, base: dict[str, Any]) -> list[str]:
    """Every way the page and the base file disagree (empty when they are in step)."""
    rows, problems = key_rows(doc_text)
    flat = leaves(base, "")
    for key, value in flat.items():
        if _in_ours(key) and key not in rows:
            problems.append(f"{key} (default {value!r} in the base file) has no row in docs/CONFIGURATION.md")
    for key, row in rows.items():
        if key in flat:
            code = _CODE.search(row.default)
            if code is None:
                problems.append(f"line {row.line}: {key}'s default must be a `value` (the base file: {flat[key]!r})")
                continue
            try:
                stated = _yaml_value(code.group(1))
            except Exception as e:  # not YAML: name the row instead of failing on it
                problems.append(f"line {row.line}: {key}'s default `{code.group(1)}` is not a YAML value ({e})")
                continue
            if not same(stated, flat[key]):
                problems.append(
                    f"line {row.line}: {key}'s default is `{code.group(1)}` on the page, {flat[key]!r} in the base file"
                )
        elif key.startswith("nemo_gym."):
            problems.append(f"line {row.line}: {key} is not a key of the base file's nemo_gym section")
        elif key.startswith("data.nemo_gym.") and not row.default.startswith("unset"):
            problems.append(f"line {row.line}: {key} is not in the base file: its default must say `unset`")
        elif not row.default.startswith(("verl", "unset")):
            problems.append(
                f"line {row.line}: {key} is not in the base file: its default must say whose it is (verl: ... or unset), "
                f"not {row.default!r}"
            )
    return problems


def test_the_page_and_the_base_file_are_in_step():
    rows, _ = key_rows(DOC.read_text(encoding="utf-8"))
    assert len([k for k in rows if k.startswith("nemo_gym.")]) > 50, "the key tables are no longer found"
    assert check(DOC.read_text(encoding="utf-8"), load_base()) == []


def _without_row(text: str, key: str) -> str:
    lines = [line for line in text.splitlines() if not line.startswith(f"| `{key}` |")]
    assert len(lines) == len(text.splitlines()) - 1, key
    return "\n".join(lines)


def _with_default(text: str, key: str, old: str, new: str) -> str:
    start = f"| `{key}` | {old} |"
    assert start in text, start
    return text.replace(start, f"| `{key}` | {new} |")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda t: _without_row(t, "nemo_gym.client.timeout_s"), "nemo_gym.client.timeout_s (default 900"),
        (lambda t: _without_row(t, "nemo_gym.access.guard_gym"), "nemo_gym.access.guard_gym (default None"),
        (lambda t: _without_row(t, "data.nemo_gym.default_agent"), "data.nemo_gym.default_agent (default"),
        (
            lambda t: _with_default(t, "nemo_gym.liveness.busy_grace_s", "`120.0`", "`60`"),
            "busy_grace_s's default is `60` on the page, 120.0",
        ),
        (
            lambda t: _with_default(t, "nemo_gym.patch_vllm", "`true`", "`1`"),
            "patch_vllm's default is `1` on the page, True",
        ),
        (
            lambda t: _with_default(t, "algorithm.adv_estimator", "`masked_grpo`", "`grpo`"),
            "adv_estimator's default is `grpo`",
        ),
        (
            lambda t: _with_default(t, "nemo_gym.on_server_down", "`restart`", "restart"),
            "on_server_down's default must be a `value`",
        ),
        (
            lambda t: t.replace("| `nemo_gym.client.max_body_mb` |", "| `nemo_gym.client.max_body_kb` |", 1),
            "nemo_gym.client.max_body_kb is not a key of the base file",
        ),
        (
            lambda t: _with_default(t, "trainer.v1.trainer_mode", "verl: `sync`", "`sync`"),
            "trainer.v1.trainer_mode is not in the base file: its default must say whose",
        ),
        (
            lambda t: t + "\n| key | default | what |\n|---|---|---|\n| `nemo_gym.patch_vllm` | `true` | twice |\n",
            "nemo_gym.patch_vllm has a row already",
        ),
    ],
    ids=[
        "row-removed",
        "nested-null-row-removed",
        "data-row-removed",
        "number-changed",
        "bool-is-not-1",
        "verl-key-default-changed",
        "default-not-code",
        "key-renamed",
        "verl-default-unlabelled",
        "duplicate-row",
    ],
)
def test_control_a_page_out_of_step_is_caught(change, expected):
    problems = check(change(DOC.read_text(encoding="utf-8")), load_base())
    assert any(expected in p for p in problems), problems


def test_control_a_new_key_in_the_base_file_is_caught():
    base = load_base()
    base["nemo_gym"]["client"]["new_knob"] = 5
    base["data"]["nemo_gym"]["other"] = "x"
    problems = check(DOC.read_text(encoding="utf-8"), base)
    assert [p.split(" ")[0] for p in problems] == ["nemo_gym.client.new_knob", "data.nemo_gym.other"], problems


def test_control_a_changed_default_in_the_base_file_is_caught():
    text = BASE.read_text(encoding="utf-8").replace("    timeout_s: 900\n", "    timeout_s: 1800\n")
    problems = check(DOC.read_text(encoding="utf-8"), load_base(text))
    assert len(problems) == 1 and "nemo_gym.client.timeout_s's default is `900`" in problems[0], problems


def _stated(row: Row) -> tuple[bool, str]:
    """Whose default a cell states (verl's or not) and its first `value` (the whole cell when it has none)."""
    code = _CODE.search(row.default)
    return row.default.startswith("verl"), code.group(1) if code else row.default


def readme_problems(readme_text: str, doc_text: str) -> list[str]:
    """The README's short keys table against the reference: each of its keys has a row there, with the same default."""
    rows, problems = key_rows(readme_text)
    reference, _ = key_rows(doc_text)
    for key, row in rows.items():
        if key not in reference:
            problems.append(f"README line {row.line}: {key} has no row in docs/CONFIGURATION.md")
        elif _stated(row) != _stated(reference[key]):
            problems.append(
                f"README line {row.line}: {key}'s default is {row.default!r}, "
                f"in docs/CONFIGURATION.md {reference[key].default!r}"
            )
    return problems


def test_the_readme_keys_are_the_references():
    readme = README.read_text(encoding="utf-8")
    assert len(key_rows(readme)[0]) >= 10, "the README's keys table is no longer found"
    assert readme_problems(readme, DOC.read_text(encoding="utf-8")) == []


def test_control_a_readme_default_out_of_step_is_caught():
    readme = _with_default(README.read_text(encoding="utf-8"), "nemo_gym.on_server_down", "`restart`", "`mask`")
    readme = _with_default(readme, "trainer.v1.trainer_mode", "verl: `sync`", "`sync`")
    readme += "\n| key | default | what |\n|---|---|---|\n| `nemo_gym.no_such_key` | `1` | x |\n"
    problems = readme_problems(readme, DOC.read_text(encoding="utf-8"))
    assert len(problems) == 3, problems
    for expected in (
        "trainer.v1.trainer_mode's default is '`sync`'",  # verl's default stated as if it were the base file's
        "nemo_gym.on_server_down's default is '`mask`'",
        "nemo_gym.no_such_key has no row",
    ):
        assert any(expected in p for p in problems), (expected, problems)


def _model_leaves(model: type[BaseModel], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.update(_model_leaves(annotation, f"{prefix}.{name}"))
        else:
            out[f"{prefix}.{name}"] = field.get_default(call_default_factory=True)
    return out


def test_the_base_file_holds_every_key_of_the_model_with_its_default():
    """The pydantic model (what is validated) and the base file (what the page documents) have the same keys and
    defaults; only ``config_paths`` differs on purpose (the model has none: required unless ``head_url``)."""
    from nemo_gym_adapter.config import NemoGymConfig

    model = _model_leaves(NemoGymConfig, "nemo_gym")
    base = leaves(load_base()["nemo_gym"], "nemo_gym")
    assert sorted(model) == sorted(base)
    differ = {k: (model[k], base[k]) for k in model if not same(model[k], base[k])}
    assert list(differ) == ["nemo_gym.config_paths"], differ
    assert model["nemo_gym.config_paths"] == []


def test_the_page_lists_the_dataset_options():
    """``data.nemo_gym`` rows are the options ``GymJsonlDataset`` reads (``load_for_config``'s keywords)."""
    from nemo_gym_adapter.data.dataset import load_for_config

    params = inspect.signature(load_for_config).parameters.values()
    options = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY} - {"check_only"}
    rows, _ = key_rows(DOC.read_text(encoding="utf-8"))
    assert {k.removeprefix("data.nemo_gym.") for k in rows if k.startswith("data.nemo_gym.")} == options
