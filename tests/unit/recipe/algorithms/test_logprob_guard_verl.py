"""The guard through verl's real v1 ``PPOTrainer._compute_old_log_prob`` (verl 0.9.1's code, with our mixin in front as
the recipe runs it): the per-step ``bypass_mode`` reaches verl's own branch. TransferQueue and the actor worker group
are fakes (named so): a trusted step must take verl's copy (rollout log-probs -> old, no actor call), a check or a
batch with a stale sample must reach the actor's recompute."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from recipe.nemo_gym.algorithms import logprob_guard as lg
from tests.support.recipe_config import minimal_recipe_config

trainer_base = pytest.importorskip("verl.trainer.ppo.v1.trainer_base")


class FakeRecompute(Exception):
    """Raised by the fake actor: verl chose to recompute the old log-probs."""


class FakeActorGroup:
    def __init__(self) -> None:
        self.calls = 0

    def compute_log_prob(self, batch):
        self.calls += 1
        raise FakeRecompute


class FakeFields(dict):
    """What ``tq.kv_batch_get`` returns, as far as verl's bypass branch and our mixin read it."""

    def to_padded_tensor(self) -> FakeFields:
        return self


class FakeTransferQueue:
    """One partition's fields in memory: ``kv_batch_get`` / ``kv_batch_put`` as verl's trainer calls them."""

    def __init__(self, fields: dict[str, torch.Tensor]) -> None:
        self.fields = dict(fields)

    def kv_batch_get(self, keys, partition_id, select_fields):
        return FakeFields({f: self.fields[f].clone() for f in select_fields})

    def kv_batch_put(self, keys, partition_id, fields):
        self.fields.update(dict(fields))
        return SimpleNamespace(keys=keys, partition_id=partition_id)


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    import transfer_queue

    from recipe.nemo_gym.trainer.task_runner_v1 import nemo_gym_trainer_cls

    rollout = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.2, 0.0]])
    store = FakeTransferQueue(
        {
            "rollout_log_probs": rollout,
            "old_log_probs": torch.zeros_like(rollout),
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
            "rm_scores": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]),
        }
    )
    monkeypatch.setattr(transfer_queue, "kv_batch_get", store.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", store.kv_batch_put)
    cfg = minimal_recipe_config(tmp_path)
    cfg["nemo_gym"]["trusted_logprobs"] = {"enable": True, "check_every": 10}
    cfg.setdefault("algorithm", {})["rollout_correction"] = {"rollout_is": None, "bypass_mode": False}
    cls = nemo_gym_trainer_cls(trainer_base.PPOTrainer)
    stubs = {name: lambda *a, **k: None for name in trainer_base.PPOTrainer.__abstractmethods__}  # never called here
    t = object.__new__(type("FakeConcrete" + cls.__name__, (cls,), stubs))
    t.config, t.actor_rollout_wg, t.store = OmegaConf.create(cfg), FakeActorGroup(), store
    return t


def _batch(step: int, stale: bool = False):
    current = step - 1
    tags = [
        {"min_global_steps": current, "max_global_steps": current},
        {"min_global_steps": current - int(stale), "max_global_steps": current},
    ]
    return SimpleNamespace(keys=["u0_0_0", "u1_0_0"], partition_id="train", tags=tags, extra_info={})


def test_verls_own_branch_follows_the_guard_step_by_step(trainer, capsys):
    rollout = trainer.store.fields["rollout_log_probs"]
    mask = trainer.store.fields["response_mask"]
    trainer.global_steps = 1  # the launch's first step: a check, verl recomputes
    with pytest.raises(FakeRecompute):
        trainer._compute_old_log_prob(_batch(1), {})
    assert trainer.config.algorithm.rollout_correction.bypass_mode is False
    lg.finish_step(trainer, 1, rollout + 1e-6, rollout, mask)  # what the recompute measured: within the bounds
    assert "within" in capsys.readouterr().out

    trainer.global_steps = 2  # trusted: verl's bypass copies the rollout's log-probs, the actor is never asked
    metrics: dict[str, float] = {}
    trainer._compute_old_log_prob(_batch(2), metrics)
    assert trainer.actor_rollout_wg.calls == 1
    assert torch.equal(trainer.store.fields["old_log_probs"], rollout)
    assert metrics["onpolicy/trusted"] == 1.0 and "onpolicy/logprob_abs_diff_mean" not in metrics
    assert "actor/entropy" not in metrics  # verl computes it only in the recompute pass

    trainer.global_steps = 3  # a stale sample in the batch (the async modes): verl recomputes whatever the guard says
    with pytest.raises(FakeRecompute):
        trainer._compute_old_log_prob(_batch(3, stale=True), {})
    assert trainer.actor_rollout_wg.calls == 2 and trainer.config.algorithm.rollout_correction.bypass_mode is False
