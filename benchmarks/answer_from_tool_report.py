"""Did the model answer from what its tools returned? Rollouts of Gym's tool-math environments read from ``collect
--output`` files or a training run's rollout dump (``<dir>/{train,val}/step_*.jsonl``), one table per file or step.
Each rollout is matched to its row (``--rows``: the JSONL the questions came from) for its family and answer:

* ``math_with_code`` rows (``expected_result``; one tool, ``execute_python``; the verifier reads the last
  ``\\boxed{}``): ``from_tool`` = solved rollouts whose boxed answer appears in one of their tool outputs;
* ``math_advanced_calculations`` rows (``ground_truth``; a tool per operation; the verifier looks for every value in
  the tool outputs): ``from_tool`` = solved rollouts of nested rows (depth >= 2) in which every call that returned an
  asked value took, among its arguments, a number an earlier call had returned (the chain used what the tool said).

And for both: ``success`` (reward > 0), ``with_call``, ``known_tool`` (calls naming an offered tool), ``schema_ok``
(arguments a JSON object with the tool's required keys), ``calls_per_rollout``, ``repeat_calls`` (a call identical to
an earlier one of the rollout), ``no_answer`` (the rollout ends without an answer: math_with_code, no final
``\\boxed{}``; calculations, a value asked for never returned), ``ended_on_call`` (its last model item is a call: it
ran into ``max_steps``), ``prose_program`` (a fenced program in the text and no call), ``unread_call`` (assistant text
that looks like a call the tool parser did not read), ``by_family`` (success per family).

    python benchmarks/answer_from_tool_report.py OUT.jsonl --rows configs/data/calc_val.jsonl [--json]
    python benchmarks/answer_from_tool_report.py logs/gym/<run>/rollouts --partition val --rows configs/data/calc_*.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_CALL_TEXT = re.compile(r'\{\s*"(?:name|code|arguments)"\s*:')
_FENCED_PY = re.compile(r"```(?:python|py)?\s*\n")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces balanced), as math_with_code's verifier reads it."""
    i = text.rfind("\\boxed{")
    if i < 0:
        return None
    depth = 1
    start = j = i + len("\\boxed{")
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return (text[start : j - 1].strip() or None) if depth == 0 else None


def _numbers(text: str) -> list[float]:
    return [float(m) for m in _NUMBER.findall(text.replace(",", ""))]


def _output_text(output: str) -> str:
    try:
        value = json.loads(output)
    except ValueError:
        return output
    if isinstance(value, Mapping):
        return " ".join(str(value.get(k) or "") for k in ("stdout", "result", "error_message", "stderr", "solution"))
    return output


def _solution(output: str) -> float | None:
    try:
        value = json.loads(output)
        return float(value["solution"])
    except (ValueError, TypeError, KeyError):
        return None


def in_output(answer: str, outputs: Iterable[str]) -> bool:
    """Does ``answer`` appear in a tool output: as text, or as a number equal to one printed (relative 1e-6)?"""
    norm = answer.replace(",", "").replace("$", "").strip()
    try:
        value: float | None = float(norm)
    except ValueError:
        value = None
    for out in outputs:
        text = _output_text(out).replace(",", "")
        if norm and norm in text:
            return True
        if value is not None and any(abs(n - value) <= 1e-6 * max(1.0, abs(value)) for n in _numbers(text)):
            return True
    return False


def items_of(record: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A rollout's items as ``("text", str)``, ``("call", (name, arguments))``, ``("output", str)``: from a collect
    record's Gym result (``result.response.output``) or a dump line's ``turns``."""
    out: list[tuple[str, Any]] = []
    turns = record.get("turns")
    if isinstance(turns, list):
        for t in turns:
            kind = t.get("type")
            if kind == "message" and t.get("role") == "assistant":
                out.append(("text", t.get("text") or ""))
            elif kind == "tool_call":
                out.append(("call", (t.get("name"), t.get("arguments"))))
            elif kind == "tool_output":
                out.append(("output", str(t.get("output") or "")))
        return out
    result = record.get("result")
    response = result.get("response") if isinstance(result, Mapping) else None
    for item in (response or {}).get("output") or ():
        kind = item.get("type")
        if kind == "message" and item.get("role") == "assistant":
            out.append(("text", "".join(c.get("text") or "" for c in item.get("content") or ())))
        elif kind == "function_call":
            out.append(("call", (item.get("name"), item.get("arguments"))))
        elif kind == "function_call_output":
            out.append(("output", str(item.get("output") or "")))
    return out


def question_of(record: Mapping[str, Any]) -> str | None:
    result = record.get("result")
    params = result.get("responses_create_params") if isinstance(result, Mapping) else None
    for msg in (params or {}).get("input") or ():
        if isinstance(msg, Mapping) and msg.get("role") == "user":
            return str(msg.get("content"))
    prompt = record.get("prompt")  # a dump line: the decoded first prompt holds the question
    return prompt if isinstance(prompt, str) else None


def load_rows(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """Each row's user question -> the row."""
    out = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                user = [m for m in row["responses_create_params"]["input"] if m.get("role") == "user"]
                out[str(user[-1]["content"])] = row
    return out


def row_of(question: str | None, rows: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
    if question is None:
        return None
    if question in rows:
        return rows[question]
    return next((r for q, r in rows.items() if q in question), None)


def _args(arguments: Any) -> Any:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return None


def _tools_of(row: Mapping[str, Any] | None) -> dict[str, list[str]]:
    tools = (row or {}).get("responses_create_params", {}).get("tools") or []
    return {t["name"]: list(t.get("parameters", {}).get("required") or []) for t in tools if "name" in t}


def _chained_from_tool(items: list[tuple[str, Any]], values: list[float]) -> bool:
    """Every call whose output is an asked value took a number an earlier call returned (calculations rows)."""
    returned: list[float] = []
    pending: list[float] = []  # the current call's argument numbers
    answered = {v: False for v in values}
    for kind, payload in items:
        if kind == "call":
            args = _args(payload[1])
            pending = [float(v) for v in (args.values() if isinstance(args, dict) else []) if _is_number(v)]
        elif kind == "output":
            value = _solution(payload)
            if value is not None:
                if value in answered and not answered[value]:
                    answered[value] = any(a in returned for a in pending)
                returned.append(value)
    return bool(answered) and all(answered.values())


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rollout(record: Mapping[str, Any], rows: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    items = items_of(record)
    row = row_of(question_of(record), rows)
    reward = record.get("gym_reward", record.get("reward"))
    solved = bool(reward) and reward > 0
    calls = [p for k, p in items if k == "call"]
    outputs = [p for k, p in items if k == "output"]
    texts = [p for k, p in items if k == "text"]
    tools = _tools_of(row)
    known = [c for c in calls if not tools or c[0] in tools]
    schema_ok = sum(
        isinstance(a := _args(args), dict) and all(k in a for k in tools.get(name, [])) for name, args in known
    )
    seen: set[str] = set()
    repeats = 0
    for name, args in calls:
        key = f"{name}:{json.dumps(_args(args), sort_keys=True)}"
        repeats += key in seen
        seen.add(key)
    from_tool: bool | None = None
    if row is not None and "ground_truth" in row:
        values = [float(v) for v in json.loads(row["ground_truth"])]
        returned = [v for v in (_solution(o) for o in outputs) if v is not None]
        no_answer = not all(v in returned for v in values)
        if solved and int(row.get("depth", 1)) >= 2:
            from_tool = _chained_from_tool(items, values)
    else:
        answer = next((b for t in reversed(texts) if (b := boxed(t)) is not None), None)
        no_answer = answer is None
        if answer is None:
            answer = next((b for o in reversed(outputs) if (b := boxed(_output_text(o))) is not None), None)
        if solved:
            from_tool = answer is not None and in_output(answer, outputs)
    last_model = next((k for k, _ in reversed(items) if k in ("text", "call")), None)
    return {
        "family": str((row or {}).get("family", "?")),
        "masked": record.get("masked_reason") is not None,
        "solved": solved,
        "calls": len(calls),
        "known_calls": len(known),
        "schema_ok_calls": schema_ok,
        "repeat_calls": repeats,
        "from_tool": from_tool,
        "no_answer": no_answer,
        "ended_on_call": last_model == "call",
        "prose_program": not calls and any(_FENCED_PY.search(t) for t in texts),
        "unread_call": any(_CALL_TEXT.search(t) for t in texts),
    }


def _rate(n: float, d: float) -> float | None:
    return round(n / d, 3) if d else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    solved = [r for r in rows if r["solved"]]
    judged = [r for r in solved if r["from_tool"] is not None]
    calls = sum(r["calls"] for r in rows)
    fam_n: Counter[str] = Counter(r["family"] for r in rows)
    fam_ok: Counter[str] = Counter(r["family"] for r in solved)
    return {
        "rollouts": n,
        "masked": sum(r["masked"] for r in rows),
        "success": _rate(len(solved), n),
        "with_call": _rate(sum(r["calls"] > 0 for r in rows), n),
        "calls_per_rollout": round(statistics.fmean(r["calls"] for r in rows), 2) if rows else None,
        "known_tool": _rate(sum(r["known_calls"] for r in rows), calls),
        "schema_ok": _rate(sum(r["schema_ok_calls"] for r in rows), calls),
        "repeat_calls": _rate(sum(r["repeat_calls"] for r in rows), calls),
        "from_tool": _rate(sum(bool(r["from_tool"]) for r in judged), len(judged)),
        "from_tool_of": len(judged),
        "no_answer": _rate(sum(r["no_answer"] for r in rows), n),
        "ended_on_call": _rate(sum(r["ended_on_call"] for r in rows), n),
        "prose_program": _rate(sum(r["prose_program"] for r in rows), n),
        "unread_call": _rate(sum(r["unread_call"] for r in rows), n),
        "by_family": {f: f"{fam_ok[f]}/{fam_n[f]}" for f in sorted(fam_n)},
    }


def sources(path: Path, partition: str) -> list[tuple[str, Path]]:
    """(label, JSONL file) pairs: the file itself, or a dump dir's step files of ``partition``."""
    if path.is_file():
        return [(path.name, path)]
    return [(f"{partition}/{p.stem}", p) for p in sorted((path / partition).glob("step_*.jsonl"))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("paths", nargs="+", type=Path, help="collect --output files or rollout dump dirs")
    p.add_argument("--rows", nargs="*", type=Path, default=[], help="the row files the questions came from")
    p.add_argument("--partition", default="val", choices=("train", "val"), help="dump dirs: which partition")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = load_rows(args.rows)
    table: dict[str, Any] = {}
    for path in args.paths:
        for label, file in sources(path, args.partition):
            recs = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
            table[label] = summarize([rollout(r, rows) for r in recs])
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    for label, s in table.items():
        fams = s.pop("by_family")
        print(label, " ".join(f"{k}={v}" for k, v in s.items()))
        print("   by family:", " ".join(f"{k}={v}" for k, v in fams.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
