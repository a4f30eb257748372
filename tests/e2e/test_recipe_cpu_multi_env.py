"""Multi-environment GRPO, hydra-launched end to end: ``python -m recipe.nemo_gym.main --config-name
nemo_gym_cpu_multi_env`` (both bundled toy environments in one Gym: toy_choice, one model call; toy_lookup, two
tool calls), three steps, validation before training and after the last step, on verl's v1 trainer (the configs'
default; the legacy trainer runs the same code for these features: ``env_sampling``, ``validation``).

Checked from the console logger: each step carries both environments' metrics under plain names (``gym/<env>/...``,
nothing under ``timing_s/gym/``), each environment got its weighted half of the batch, toy_lookup made two model
calls per rollout and toy_choice one; the validation passes log per-environment validation reward under verl's
naming (``val-core/<env>/reward/mean@1``) and ours (``val-core/<env>/gym/reward_mean``) plus each environment's own
Gym ``/aggregate_metrics``; the run's reward-curve PNG has one series per environment and each one's validation
success; no process is left behind.
With ``trainer.rollout_data_dir`` set, the readable dump (``nemo_gym.rollout_dump``) has a line per rollout of every
training step and validation pass: toy_lookup's two tool calls with their names and arguments, the tool's output in
between, each call's decoded generation; toy_choice's letter. Lean on purpose (CI budget): 4 rows x 2 samples per
step, 8 greedy validation rows.

Who may reach the run (issues 27 and 37), with the run's default access settings, taken while it trains: every TCP
listener of the run's process tree (Ray, verl's workers, the vLLM replica and its engine core, TransferQueue, Gym and
its Ray) is on loopback, the one-host plan (``nemo_gym.access.local_only: auto``), and none gives a stranger a 2xx.
As step 1 begins (the validation before training is in the metrics file) every listener gets
``tests.support.listeners.KNOCKS`` without any key, all at once; as step 2 begins, every listener that came up since
gets them too. The replica and Gym's servers answer the guard's 401, Ray's HTTP servers their token's 401, the binary
sockets (gRPC, ZMQ) no HTTP, and Ray's metrics exporters are not there (``nemo_gym.access.ray_dashboard: false``).
Meanwhile the run trains on: the steps after the knocks are logged, every rollout of theirs came back (nothing
masked), and the run ends with exit 0. The knocks' control (a knock sees an open door) is
tests/unit/access/test_knock.py.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from recipe.nemo_gym.reporting.curve import load_reward_curve
from tests.e2e.test_recipe_cpu_smoke import _parse_steps, _run_recipe, batch_overrides, reaped_children  # noqa: F401
from tests.support.listeners import TreeListeners, knock_table, table

pytestmark = pytest.mark.e2e

ENVS = ("toy_choice_simple_agent", "toy_lookup_simple_agent")
STEPS = 3  # steps of ~2 s here: the knocks (about one knock timeout) end before the last one begins
BATCH, N = 4, 2


def test_three_steps_on_two_environments_with_validation_through_gym(tmp_path, reaped_children):  # noqa: F811
    watches: list[TreeListeners] = []
    metrics = tmp_path / "gym" / "metrics.jsonl"  # verl's file logger: a line per step as it ends, unbuffered

    def watch(pid: int, log: Path) -> TreeListeners:  # the run's listeners as steps 1 and 2 begin (module docstring)
        begins = [lambda step=step: step - 1 in _logged_steps(metrics) for step in (1, 2)]
        watches.append(TreeListeners(pid, log, begins, knock=True, progress=lambda: _logged_steps(metrics)))
        return watches[-1]

    text, wall = _run_recipe(
        tmp_path,
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        *batch_overrides(BATCH, N),  # micro batches of BATCH x N samples (the config's 64 fits 8 x 8 only)
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",  # verl's dump, and ours next to it (rollouts/gym/)
        # Off in this config: toy_lookup's grammar renormalises the rollout log-probs. On here, the guard must see that
        # at its first check and fall back to recomputing (below).
        "nemo_gym.trusted_logprobs.enable=true",
        config_name="nemo_gym_cpu_multi_env",
        watch=watch,
    )
    steps = _parse_steps(text)
    assert sorted(steps) == [0, *range(1, STEPS + 1)], f"steps logged: {sorted(steps)}\n{text[-3000:]}"
    _check_doors(watches[0], _logged_steps(metrics))
    turns = {"toy_choice_simple_agent": 1.0, "toy_lookup_simple_agent": 2.0}
    for step in range(1, STEPS + 1):
        m = steps[step]
        assert not [k for k in m if k.startswith("timing_s/gym/")], sorted(m)
        for env in ENVS:
            for name in (
                "reward_mean",
                "success_rate",
                "masked_rate",
                "masked_rate/non_contiguous",
                "generated_tokens_mean",
            ):
                assert math.isfinite(m[f"gym/{env}/{name}"]), (step, env, name)
            assert m[f"gym/{env}/num_samples"] == BATCH // 2 * N  # nemo_gym.env_weights: half of the batch each
            assert m[f"gym/{env}/num_turns_mean"] == turns[env]
        assert m["gym/all/masked_rate"] == 0.0 and m["gym/all/contiguity_rate"] == 1.0
        assert math.isfinite(m["actor/pg_loss"])
    _guard_falls_back_on_renormalised_logprobs(text, steps)
    for step in (0, STEPS):  # val_before_train, then trainer.test_freq (= the last step)
        m = steps[step]
        for env in ENVS:
            assert math.isfinite(m[f"val-core/{env}/reward/mean@1"]), (step, sorted(m))  # verl's own
            assert math.isfinite(m[f"val-core/{env}/gym/reward_mean"]), (step, sorted(m))
            assert m[f"val-aux/{env}/gym/num_samples"] == 4.0
            assert [k for k in m if k.startswith(f"val-core/{env}/gym_aggregate/")], (step, env, sorted(m))
            assert f"val-aux/{env}/gym_aggregate/failed" not in m
    _check_readable_rollouts(tmp_path / "rollouts" / "gym", steps)
    curve = load_reward_curve(tmp_path / "gym" / "metrics.jsonl")
    assert set(curve.reward) == {"all", *ENVS}
    assert curve.val_steps == [0, STEPS] and set(curve.val_success) == {"all", *ENVS}  # on the PNG too
    assert (tmp_path / "gym" / "reward_curve.png").is_file()
    print(
        f"multi-env recipe: {wall:.0f}s wall; validation reward "
        + ", ".join(f"{env}: {steps[0][f'val-core/{env}/gym/reward_mean']:.2f}" for env in ENVS)
    )
    assert not (tmp_path / "gym" / "gym.pid").exists()
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"


def _logged_steps(metrics: Path) -> list[int]:
    """The steps verl's file logger has written so far (step 0: the validation before training); [] before its first."""
    steps = []
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line still being written
    return steps


def _check_doors(watch: TreeListeners, logged: list[int]) -> None:
    """Every listener on loopback and none serving a stranger, taken as steps 1 and 2 began, and the run trained on."""
    assert len(watch.rounds) == 2, (
        f"listed {len(watch.rounds)} times (the run never began step 1 or 2?): {watch.error!r}"
    )
    found, knocks = watch.found or [], watch.knocks or []
    print(f"listeners of the run at steps 1 and 2:\n{table(found)}\nwhat each answered without a key:")
    print(knock_table(sorted(knocks, key=lambda k: (k.listener.process, k.listener.port))))
    for number, r in enumerate(watch.rounds, 1):
        slowest = max((k.seconds for k in r.knocks or []), default=0.0)
        print(
            f"round {number} (step {number} begins): {len(r.found)} new listeners of "
            f"{len({i.pid for i in r.found})} pids, listed and knocked in {r.seconds:.1f} s (slowest socket "
            f"{slowest:.1f} s); steps logged before {r.before}, after {r.after}; load average {os.getloadavg()}"
        )
    exposed = [item for item in found if item.scope != "loopback"]
    assert not exposed, f"listening beyond loopback on one host:\n{table(exposed)}"
    assert len({item.pid for item in found}) > 10  # the control: Ray, workers, vLLM, Gym were all seen
    opened = [k for k in knocks if k.opened]
    assert not opened, f"listeners that served a request without the key:\n{knock_table(opened)}"
    # The controls: the knocks reached HTTP servers -- the replica and Gym's servers (head, two agents, two resources
    # servers, the model server) answered the guard's 401
    guarded = {(k.listener.host, k.listener.port) for k in knocks if k.ours}
    assert len(guarded) >= 7, knock_table(knocks)
    # ... and the run trained on after them: the knocks began as step 1 did and ended before the last step did; every
    # step is in the metrics file at the end (the caller checks each one's rollouts: all back, none masked)
    first = watch.rounds[0]
    assert first.before == [0] and STEPS not in first.after, (first.before, first.after)
    assert STEPS not in watch.rounds[1].after, watch.rounds[1].after
    assert logged == [0, *range(1, STEPS + 1)], logged


def _check_readable_rollouts(root: Path, steps: dict[int, dict[str, float]]) -> None:
    for step in range(1, STEPS + 1):
        lines = [json.loads(x) for x in (root / "train" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert len(lines) == BATCH * N, (step, len(lines))
        assert {r["env"] for r in lines} == set(ENVS)
        for r in lines:
            assert r["partition"] == "train" and r["step"] == step and isinstance(r["row_index"], int)
            assert r["uid"] and r["session"] in range(N) and r["weight_version"] == {"min": step - 1, "max": step - 1}
            assert r["prompt"] and r["prompt_tokens"] > 0 and r["generated_tokens"] > 0
            assert len(r["model_calls"]) == r["num_turns"] and all(c["generated"] for c in r["model_calls"])
            if r["env"] == "toy_lookup_simple_agent":
                calls = [t for t in r["turns"] if t["type"] == "tool_call"]
                assert len(calls) == 2 and all(c["name"] and c["arguments"] for c in calls), r["turns"]
                assert any(t["type"] == "tool_output" and t["output"] for t in r["turns"]), r["turns"]
                assert "<tool_call>" in r["model_calls"][0]["generated"]
                assert r["model_calls"][1]["context_added"]  # the tool's answer, as the model was given it
                assert "accuracy" in r["result"] and "set_overlap" in r["result"], r["result"]  # the verifier's fields
            else:
                assert r["model_calls"][0]["generated"].removesuffix("<|im_end|>") in ("A", "B", "C", "D")
    for step in (0, STEPS):
        val = [json.loads(x) for x in (root / "val" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert len(val) == 8 and all(r["partition"] == "val" for r in val)
    # every numeric field of Gym's results, per environment: toy_lookup's verifier reports accuracy and set_overlap
    # (its accuracy is its reward), string_match (toy_choice) only strings
    last = steps[STEPS]
    lookup, choice = "toy_lookup_simple_agent", "toy_choice_simple_agent"
    assert last[f"gym/{lookup}/result/accuracy"] == last[f"gym/{lookup}/reward_mean"], sorted(last)
    assert f"gym/{lookup}/result/set_overlap" in last and not [k for k in last if k.startswith(f"gym/{choice}/result/")]
    # forced_token_min_logprob (on in this config) drops the tokens toy_lookup's grammar forced, none of toy_choice's
    assert last[f"gym/{lookup}/forced_token_rate"] > 0.2 and last[f"gym/{choice}/forced_token_rate"] == 0.0


def _guard_falls_back_on_renormalised_logprobs(text: str, steps: dict[int, dict[str, float]]) -> None:
    """``nemo_gym.trusted_logprobs`` on a config whose rollout log-probs are renormalised: toy_lookup's tool-call
    grammar (vLLM structured output) renormalises the log-probs of the tokens it leaves a choice over (the ones it
    forces are out of the loss, ``forced_token_min_logprob``, and out of the gap). The guard's first check (step 1)
    finds toy_lookup's trained tokens far past its bounds and falls back: step 2 recomputes too, with the gap reported
    as without the guard."""
    first, second = steps[1], steps[2]
    assert first["onpolicy/guard/within"] == 0.0 and first["onpolicy/trusted"] == 0.0, first
    assert first["onpolicy/guard/mean_abs_diff"] > 1e-2, first["onpolicy/guard/mean_abs_diff"]
    assert "past the bound (nemo_gym.trusted_logprobs.max_mean_abs_diff" in text
    assert "recomputing the old log-probs on every step from now on" in text
    assert second["onpolicy/trusted"] == 0.0 and math.isfinite(second["onpolicy/logprob_abs_diff_mean"]), second
    assert math.isfinite(second["actor/entropy"]), second  # the recompute pass ran
    assert "log-prob guard (recomputing every step), step 2" in text
