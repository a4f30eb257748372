"""Unit tests of ``python -m nemo_gym_adapter.collect``: argument handling, the summary, and a whole run against a
fake Gym (a fake head server to attach to, a fake environment server answering Gym-shaped results)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym_adapter.collect import DEFAULT_ENVS, main, parse_args, summarize
from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory
from tests.support.fake_gym import FakeHeadServer, gym_config_for
from tests.support.gym_results import E0, G0, G1, P0, handmade_multiturn


def test_defaults_collect_the_bundled_example_with_the_demo_model():
    args = parse_args([])
    assert args.envs == list(DEFAULT_ENVS) and args.model is None and args.policy_base_url is None
    own = parse_args(["--config-path", "mine.yaml", "--data", __file__])
    assert own.envs == []  # own configs: no bundled environment unless asked


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--model", "/ckpt", "--policy-base-url", "http://h:1/v1"], "give one of them"),
        (["--gym-head-url", "http://h:1"], "needs --data"),
        (["--gym-head-url", "http://h:1", "--env", "x", "--data", __file__], "drop --env"),
        (["--gym-head-url", "http://h:1", "--no-gym-guard", "--data", __file__], "--no-gym-guard"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--response-length", "0"], "--response-length must be >= 1"),
        (["--data", "/nonexistent.jsonl"], "no such file"),
        (["--env", "x", "--agent", "a"], "--agent names the agent for --data rows"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_summary_is_the_training_metrics_by_environment():
    trajs = [
        Trajectory(env_name="a", reward=1.0, gym_reward=1.0, sampled_spans=((0, 1),), num_turns=2),
        Trajectory(env_name="b", masked_reason=MaskReason.TIMEOUT),
    ]
    summary = summarize({**compute_metrics(trajs), "gym/timing/rollout_s": 3.0})
    assert list(summary) == ["all", "a", "b"]
    assert summary["all"]["num_samples"] == 2 and summary["all"]["masked_rate/timeout"] == 0.5
    assert summary["a"]["reward_mean"] == 1.0 and "masked_rate/timeout" not in summary["a"]  # zero rates left out
    assert "reward_mean" not in summary["b"]  # no unmasked sample: no fake score


def test_a_run_against_an_attached_gym_writes_jsonl_and_the_summary(fake_server, tmp_path, capsys):
    result = handmade_multiturn(P0, [G0, G1], [E0], reward=1.0)
    row = {"responses_create_params": {"input": "q"}, "agent_ref": {"name": "agent_a"}, "fake": {"result": result}}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n" + json.dumps({**row, "agent_ref": {"name": "ghost"}}) + "\n")
    head = FakeHeadServer(gym_config_for(("agent_a", fake_server.url)), instances=[])
    try:
        argv = [
            "--gym-head-url",
            head.url,
            "--data",
            str(data),
            "--repeats",
            "2",
            "--output",
            str(tmp_path / "o.jsonl"),
        ]
        status = main([*argv, "--no-progress", "--json"])
    finally:
        head.stop()
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    # one line says what collect cannot protect: a Gym it did not start
    [note] = [line for line in captured.err.splitlines() if line.startswith("note:")]
    assert f"--gym-head-url {head.url}: a Gym collect did not start" in note, captured.err
    assert status == 1  # the unroutable row is a failure: not every rollout returned a result
    assert (summary["rollouts"], summary["results"], summary["failed_by_reason"]) == (4, 2, {"unknown_agent": 2})
    assert summary["by_env"]["agent_a"]["reward_mean"] == 1.0 and summary["by_env"]["all"]["masked_rate"] == 0.5
    lines = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in lines) == [0, 1, 2, 3]
    assert {r["env"]: r["masked_reason"] for r in lines} == {"agent_a": None, "ghost": "unroutable"}
    assert all(r["result"]["reward"] == 1.0 for r in lines if r["env"] == "agent_a")


def test_data_rows_without_routing_go_to_agent_else_to_the_one_envs_agent(tmp_path):
    from nemo_gym_adapter.collect import row_files
    from nemo_gym_adapter.gym.catalogue import BundledEnv

    env = BundledEnv("e", "resources_servers/e/configs/e.yaml", "e_agent", "simple_agent", tmp_path / "x.jsonl")
    assert row_files(parse_args(["--data", __file__]), [env], tmp_path) == [(Path(__file__), "e_agent")]
    mine = parse_args(["--data", __file__, "--agent", "mine"])
    assert row_files(mine, [env], tmp_path) == [(Path(__file__), "mine")]
    assert row_files(parse_args(["--data", __file__]), [env, env], tmp_path) == [(Path(__file__), None)]


def test_a_bad_row_stops_collect_before_anything_starts(tmp_path, monkeypatch, capsys):
    from nemo_gym_adapter import collect

    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"responses_create_params": {"input": "q"}, "agent_ref": "a"}\n{"responses_create_params": 1}\n')
    monkeypatch.setattr(collect, "start_gym", lambda *a: pytest.fail("Gym started before the rows were checked"))
    assert main(["--config-path", "mine.yaml", "--data", str(bad), "--no-progress"]) == 1
    assert f"{bad}:2" in capsys.readouterr().err


def test_an_external_policy_is_named_as_unprotected_and_the_gym_started_here_requires_this_runs_key(
    monkeypatch, capsys
):
    """``--policy-base-url``: one line says collect cannot make that server require a key (and what it sends it);
    the Gym started here still requires a key of this invocation's, on a Ray head of its own (both faked here; the
    real ones: tests/integration/test_collect.py). ``--no-gym-guard`` opens that Gym."""
    from contextlib import ExitStack
    from types import SimpleNamespace

    from nemo_gym_adapter import collect
    from nemo_gym_adapter.access.key import ENV
    from nemo_gym_adapter.gym import ray_head, servers
    from nemo_gym_adapter.wire import policy

    started, stopped = [], []

    class FakeGym:
        head_url, startup_seconds = "http://127.0.0.1:1", 0.1

        @classmethod
        def start(cls, spec, ray_head=None):
            started.append((spec, ray_head))
            return cls()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    head = SimpleNamespace(stop=lambda: stopped.append(head))
    monkeypatch.setattr(ray_head.GymRayHead, "start", classmethod(lambda cls, *a, **kw: head))
    monkeypatch.setattr(servers, "GymServers", FakeGym)
    monkeypatch.setattr(policy, "read_model_card", lambda urls, api_key=None: SimpleNamespace(name="m"))
    monkeypatch.delenv(ENV, raising=False)
    for extra, guarded in (([], True), (["--no-gym-guard"], False)):
        args = parse_args(
            ["--policy-base-url", "http://10.0.0.5:8000/v1", "--data", __file__, "--config-path", "m.yaml", *extra]
        )
        with ExitStack() as stack:
            collect.start_gym(args, stack, [])
        spec, used_head = started[-1]
        assert used_head is head and (spec.access_key is not None) is guarded
        assert spec.policy_api_key.get_secret_value() == "EMPTY"  # the external server's key is yours to give
        assert stopped[-1] is head  # Gym's Ray head stopped with the run
        err = capsys.readouterr().err
        [note] = [line for line in err.splitlines() if line.startswith("note:")]
        assert "--policy-base-url http://10.0.0.5:8000/v1: a server collect did not start" in note
        assert f"no key ({ENV} is unset)" in note
        assert ("every server requires this run's key" in err) is guarded, err
    monkeypatch.setenv(ENV, "mine-" + "k" * 30)
    with ExitStack() as stack:
        args = parse_args(
            ["--policy-base-url", "http://10.0.0.5:8000/v1", "--data", __file__, "--config-path", "m.yaml"]
        )
        collect.start_gym(args, stack, [])
    spec, _ = started[-1]
    assert spec.policy_api_key.get_secret_value() == "mine-" + "k" * 30 and spec.access_key is not None
    assert spec.access_key.get_secret_value() != spec.policy_api_key.get_secret_value()  # Gym's key is this run's
    assert f"{ENV} from your environment" in capsys.readouterr().err
