#!/usr/bin/env python
"""Gym JSONL dataset load: time and resident memory, before (rows as Python objects) vs after (Arrow cache).

Generates synthetic Gym JSONL (~1 kB rows, a mix of four environments: tool-calling message lists, collated
``task_source`` rows with string input and ``metadata.extra_body`` JSON strings, code rows with nested verifier
metadata and nulls, multi-turn rows with function-call items; ints and floats mixed, some non-ASCII text), then
measures, each in a fresh subprocess so nothing is shared between measurements:

* ``before``: the loader as of commit 2c066bc (every row parsed, validated and kept as a ``GymRow`` of Python
  objects in a list), reimplemented here faithfully on top of the same ``validate_row``;
* ``cold``: :func:`load_gym_jsonl` with an empty cache (hash, parse, validate, write the Arrow table);
* ``cached``: :func:`load_gym_jsonl` again (hash the files, memory-map the validated table).

For each: wall time of the load, resident memory growth (RSS after minus before, and its anonymous part, which
is what cannot be shared or dropped), peak RSS growth, and the cost of one ``__getitem__``-equivalent row access
(before: the deep copy the old dataset returned; after: read the row's text and ``json.loads`` it). Heavy modules
are imported before the first RSS reading in every variant. The JSONL files stay in the OS page cache between
measurements (nobody drops caches on a shared machine), for every variant alike.

    flock /work/wt/heavy.lock .venv/bin/python benchmarks/bench_dataset.py --rows 200000 2000000 --cached-rows 5000000

Prints per size and variant the median and spread (min-max) over ``--rounds``, the ratios before/after side by
side, and the load average during the run. Needs disk for the files and the cache (~2.2x the JSONL size per size)
and, for ``before``, ~3x the file size in RAM (``--before-max-rows`` caps it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASK_SOURCE_MAP = {"math_with_judge": "math_agent"}
_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an have not which but all were when "
    "there can more if will one so about what some out into them do would up weather city résumé naïve 天气 温度"
).split()
_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def synthetic_row(i: int, rng: random.Random) -> dict:
    """One Gym row of one of four shapes (i % 4); ~1 kB on average."""
    kind = i % 4
    if kind == 0:
        params = {
            "input": [
                {"role": "system", "content": _text(rng, 25)},
                {"role": "user", "content": _text(rng, rng.randint(60, 200))},
            ],
            "tools": [_TOOL],
            "temperature": 1.0,
        }
        return {
            "responses_create_params": params,
            "agent_ref": {"type": "responses_api_agents", "name": "weather_agent"},
            "expected_answer": rng.choice(["cold", "hot"]),
        }
    if kind == 1:
        extra_body = json.dumps({"chat_template_kwargs": {"enable_thinking": False}})
        params = {"input": _text(rng, rng.randint(80, 240)), "temperature": 1, "metadata": {"extra_body": extra_body}}
        return {
            "responses_create_params": params,
            "task_source": "math_with_judge",
            "question": _text(rng, 12),
            "expected_answer": rng.choice([42, "42", 4.5, None]),
        }
    if kind == 2:
        params = {
            "input": [{"role": "user", "content": _text(rng, rng.randint(80, 240))}],
            "max_output_tokens": 1024,
            "top_p": 0.95,
        }
        tests = [_text(rng, 8) for _ in range(rng.randint(1, 4))]
        return {
            "responses_create_params": params,
            "agent_ref": "code_agent",
            "verifier_metadata": {"unit_tests": tests, "timeout": 10, "memory_mb": None},
            "difficulty": 3.5,
        }
    call = f"call_{i}"
    params = {
        "input": [
            {"role": "user", "content": _text(rng, 50)},
            {"type": "function_call", "call_id": call, "name": "get_weather", "arguments": '{"city": "sf"}'},
            {"type": "function_call_output", "call_id": call, "output": _text(rng, 40)},
        ],
        "tools": [_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    }
    return {
        "responses_create_params": params,
        "agent_ref": {"name": "weather_agent"},
        "expected_answer": None,
        "tags": ["multi", "turn"],
        "id": i,
    }


def write_jsonl(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            f.write(json.dumps(synthetic_row(i, rng), ensure_ascii=False) + "\n")


def copy_head(src: Path, dst: Path, rows: int) -> None:
    """The first ``rows`` lines of ``src`` (smaller sizes are prefixes of the largest file)."""
    with src.open("rb") as f, dst.open("wb") as out:
        for n, line in enumerate(f):
            if n == rows:
                break
            out.write(line)


# --------------------------------------------------------------------------------------- one measurement (child)
def _rss() -> tuple[int, int]:
    """(RSS, anonymous RSS) in bytes, from /proc."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["RssAnon"]


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load_before(path: str) -> list:
    """The loader of commit 2c066bc: every row parsed, validated and kept as a GymRow (Python objects)."""
    from nemo_gym_adapter.data.rows import GymRow, validate_row

    rows = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            text = raw.decode("utf-8")
            if not text.strip():
                continue
            where = f"{path}:{number}"
            row = json.loads(text)
            env = validate_row(row, where, task_source_map=TASK_SOURCE_MAP)
            rows.append(GymRow(data=row, env_name=env, path=path, line=number))
    return rows


def measure(variant: str, path: str, cache: str, samples: int) -> dict:
    import datasets  # noqa: F401 -- imported up front in every variant: not counted as load time or memory
    import pyarrow  # noqa: F401
    import xxhash  # noqa: F401
    from datasets.arrow_writer import ArrowWriter  # noqa: F401

    from nemo_gym_adapter.data.dataset import load_gym_jsonl

    rss0, anon0 = _rss()
    started = time.perf_counter()
    if variant == "before":
        rows = load_before(path)
    else:
        rows = load_gym_jsonl(path, task_source_map=TASK_SOURCE_MAP, cache_dir=cache)
    seconds = time.perf_counter() - started
    rss1, anon1 = _rss()
    peak = _peak_rss()
    rng = random.Random(1)
    picks = [rng.randrange(len(rows)) for _ in range(samples)]
    started = time.perf_counter()
    if variant == "before":
        for i in picks:
            rows[i].to_dict()
    else:
        for i in picks:
            json.loads(rows.store.record(i).text)
    item_us = (time.perf_counter() - started) / samples * 1e6
    return {
        "rows": len(rows),
        "seconds": seconds,
        "rss_mb": (rss1 - rss0) / 1e6,
        "anon_mb": (anon1 - anon0) / 1e6,
        "peak_mb": (peak - rss0) / 1e6,
        "item_us": item_us,
    }


# --------------------------------------------------------------------------------------------- driver (parent)
def run_child(variant: str, path: Path, cache: Path, samples: int, timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--measure", variant, "--file", str(path), "--cache", str(cache)]
    cmd += ["--samples", str(samples)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} on {path} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load_avg"] = os.getloadavg()[0]
    return result


def _stat(values: list[float], fmt: str = "{:.2f}") -> str:
    med = statistics.median(values)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="*", default=[200_000, 2_000_000], help="sizes: all variants")
    parser.add_argument("--cached-rows", type=int, nargs="*", default=[], help="sizes: cold once, cached rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before-max-rows", type=int, default=2_000_000, help="skip 'before' above this size")
    parser.add_argument("--samples", type=int, default=20_000, help="random row accesses timed per measurement")
    parser.add_argument("--workdir", type=Path, default=None, help="files and caches (default: a temp dir, removed)")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--measure", choices=["before", "cold", "cached"], help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.file, args.cache, args.samples)))
        return

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_dataset_"))
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = sorted(set(args.rows) | set(args.cached_rows))
    loads = [os.getloadavg()[0]]
    try:
        largest = workdir / f"rows_{sizes[-1]}.jsonl"
        if not largest.is_file():
            started = time.perf_counter()
            write_jsonl(largest, sizes[-1])
            print(f"generated {largest} in {time.perf_counter() - started:.0f} s", flush=True)
        files = {n: workdir / f"rows_{n}.jsonl" for n in sizes}
        for n, path in files.items():
            if not path.is_file():
                copy_head(largest, path, n)
        table = []
        for n in sizes:
            path, cache = files[n], workdir / f"cache_{n}"
            file_mb = path.stat().st_size / 1e6
            variants = ["before", "cold", "cached"] if n in args.rows else ["cold", "cached"]
            if "before" in variants and (n > args.before_max_rows or 5 * path.stat().st_size > _mem_available()):
                print(f"  {n} rows: 'before' skipped (over --before-max-rows, or ~4.5x the file is not free RAM)")
                variants.remove("before")
            results: dict[str, list[dict]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in variants:
                    if v == "cold":
                        if n not in args.rows and r > 0:
                            continue  # cached-only sizes: one cold build
                        shutil.rmtree(cache, ignore_errors=True)
                    res = run_child(v, path, cache, args.samples, args.timeout)
                    results[v].append(res)
                    loads.append(res["load_avg"])
                    print(
                        f"  {n} rows round {r + 1} {v:<6} {res['seconds']:7.2f} s  RSS +{res['rss_mb']:7.1f} MB "
                        f"(anon +{res['anon_mb']:7.1f})  peak +{res['peak_mb']:7.1f} MB  item {res['item_us']:.1f} µs"
                        f"  load {res['load_avg']:.2f}",
                        flush=True,
                    )
            table.append((n, file_mb, results))
        print_table(table)
    finally:
        print(f"\nload average (1 min) during the run: {_stat(loads)}; uptime: {_uptime()}")
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def print_table(table: list) -> None:
    print("\nvariant: median [min-max] over rounds; RSS = resident growth after the load (anon = not file-backed)")
    header = f"{'rows':>9} {'file MB':>8} {'variant':<7} {'load s':>20} {'RSS MB':>22} {'% file':>7}"
    header += f" {'anon MB':>20} {'peak MB':>22} {'item µs':>8}"
    print(header)
    for n, file_mb, results in table:
        for v, rs in results.items():
            rss = [r["rss_mb"] for r in rs]
            print(
                f"{n:>9} {file_mb:>8.0f} {v:<7} {_stat([r['seconds'] for r in rs]):>20} {_stat(rss, '{:.0f}'):>22} "
                f"{100 * statistics.median(rss) / file_mb:>6.1f}% {_stat([r['anon_mb'] for r in rs], '{:.0f}'):>20} "
                f"{_stat([r['peak_mb'] for r in rs], '{:.0f}'):>22} {statistics.median(r['item_us'] for r in rs):>8.1f}"
            )
        if "before" in results:
            before = results["before"]
            for v in ("cold", "cached"):
                ratios_t = [b["seconds"] / a["seconds"] for b, a in zip(before, results[v], strict=False)]
                ratios_m = [b["rss_mb"] / max(a["rss_mb"], 0.1) for b, a in zip(before, results[v], strict=False)]
                print(
                    f"{'':>9} {'':>8} before/{v}: load time x{_stat(ratios_t)}, RSS growth x{_stat(ratios_m, '{:.1f}')}"
                )


if __name__ == "__main__":
    main()
