"""GDPO on the v1 trainer (``recipe.nemo_gym.algorithms.gdpo``) equals GDPO on the legacy trainer, bit for bit, on the same batch.

Both sides run verl's own code on what the adapter builds from the same trajectories:

* legacy: ``padding.pad_trajectories`` + ``outcomes.legacy_extras`` as the legacy manager returns them, then verl's
  ``ray_trainer.compute_advantage`` (what ``RayPPOTrainer.fit`` calls);
* v1: each sample's record as the v1 manager puts it (``sample_record`` with ``reward_extra_info`` and its own
  components), stored in a fake of TransferQueue that returns fields as TransferQueue's storage does (jagged nested
  tensors, ``NonTensorStack`` columns), then verl's own v1 ``PPOTrainer._compute_advantage`` behind the recipe's
  ``NemoGymTrainerMixin``.

The control: the same v1 call without the mixin fails the way verl 0.9.1 does (GDPO reads ``batch["prompts"]`` and
the reward-component columns, which verl's v1 fetch never brings).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory
from recipe.nemo_gym.algorithms import gdpo
from recipe.nemo_gym.algorithms.outcomes import legacy_extras, masked_fill, sample_extras
from recipe.nemo_gym.managers.v1 import sample_record
from tests.support.verl_estimators import restored_estimators

pytestmark = pytest.mark.filterwarnings("ignore")

KEYS = ["correctness", "format", "schema_valid"]
P, R, PAD = 8, 24, 0


def trajectory(
    rng: np.random.Generator, components: dict[str, float] | None, env: str = "multi", masked: MaskReason | None = None
) -> Trajectory:
    """A multi-turn sample: two generations with tool tokens between them, lengths drawn from ``rng``."""
    numeric = {f"reward_components/{k}": v for k, v in (components or {}).items()}
    reward = float(sum((components or {}).values()))
    prompt = rng.integers(1, 100, size=int(rng.integers(2, P + 1)))
    if masked is not None:
        return Trajectory(env_name=env, prompt_ids=prompt, masked_reason=masked, gym_reward=reward, numeric=numeric)
    g0, tool, g1 = (int(x) for x in rng.integers(1, 7, size=3))
    end = g0 + tool + g1
    return Trajectory(
        env_name=env,
        prompt_ids=prompt,
        response_ids=rng.integers(1, 100, size=end),
        sampled_spans=((0, g0), (g0 + tool, end)),
        sampled_logprobs=(-rng.random(g0 + g1)).astype(np.float32),
        reward=reward,
        gym_reward=reward,
        num_turns=2,
        numeric=numeric,
    )


def batch(seed: int = 0) -> tuple[list[Trajectory], list[str]]:
    """Four groups of four: component values drawn from {0, 1}; one masked sample in group 1, two in group 2, one
    sample in group 3 with an extra component the others lack (not a GDPO key: trained as returned)."""
    rng = np.random.default_rng(seed)
    trajs, uids = [], []
    for g in range(4):
        for s in range(4):
            comps = {k: float(rng.integers(0, 2)) for k in KEYS}
            if g == 3 and s == 0:
                comps["latency_penalty"] = -0.5
            masked = MaskReason.TIMEOUT if (g, s) in {(1, 2), (2, 0), (2, 3)} else None
            trajs.append(trajectory(rng, None if masked else comps, masked=masked))
            uids.append(f"uid{g}")
    return trajs, uids


def algorithm(**extra: Any) -> Any:
    return OmegaConf.create(
        {
            "adv_estimator": "gdpo",
            "gdpo_reward_keys": KEYS,
            "gdpo_reward_weights": [1.0, 0.5, 2.0],
            "norm_adv_by_std_in_grpo": True,
            "use_kl_in_reward": False,
            "gamma": 1.0,
            "lam": 1.0,
            **extra,
        }
    )


def config(**extra: Any) -> Any:
    return OmegaConf.create(
        {"algorithm": algorithm(**extra), "actor_rollout_ref": {"rollout": {"n": 4, "response_length": R}}}
    )


def legacy_advantages(trajs: list[Trajectory], uids: list[str], algo: Any) -> torch.Tensor:
    """What the legacy trainer computes: verl's ``compute_advantage`` on the legacy manager's batch."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    padded = pad_trajectories(trajs, prompt_length=P, response_length=R, pad_token_id=PAD)
    uid = np.array(uids, dtype=object)
    extras = legacy_extras(trajs, uids, taken={"uid", *padded.non_tensors}, fill_keys=KEYS)
    data = DataProto.from_dict(tensors=padded.tensors, non_tensors={**padded.non_tensors, **extras, "uid": uid})
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    return compute_advantage(data, adv_estimator="gdpo", config=algo).batch["advantages"]


def v1_records(trajs: list[Trajectory], uids: list[str]) -> dict[str, dict[str, Any]]:
    """Each sample's fields as the v1 manager puts them: valid samples their own ``reward_extra_info``, masked ones
    their group's fill (``masked_fill`` over the group, the GDPO keys among the fill keys)."""
    records = {}
    groups: dict[str, list[Trajectory]] = {}
    for t, uid in zip(trajs, uids, strict=True):
        groups.setdefault(uid, []).append(t)
    sessions: dict[str, int] = {}
    for t, uid in zip(trajs, uids, strict=True):
        session = sessions[uid] = sessions.get(uid, -1) + 1
        fill = masked_fill(groups[uid], KEYS)
        prompt = {"uid": uid, "global_steps": 1}
        key, fields, _ = sample_record(
            prompt, session, t, pad_token_id=PAD, versions=(0, 0), reward_extra_info=sample_extras(t, fill)
        )
        records[key] = fields
    return records


class FakeTransferQueue:
    """Stands in for TransferQueue's ``kv_batch_get``/``kv_batch_put``: stored fields come back as its storage
    managers pack them (every tensor column a jagged nested tensor, every other column a ``NonTensorStack``; fields
    a sample does not have are left out)."""

    def __init__(self, records: dict[str, dict[str, Any]]) -> None:
        self.records = records
        self.written: dict[str, Any] = {}

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> TensorDict:
        present = [f for f in select_fields if f in self.records[keys[0]]]
        columns: dict[str, Any] = {}
        for field in present:
            chunk = [self.records[k][field] for k in keys]
            if isinstance(chunk[0], torch.Tensor):
                columns[field] = torch.nested.as_nested_tensor(chunk, layout=torch.jagged)
            else:
                columns[field] = NonTensorStack(*chunk)
        return TensorDict(columns, batch_size=len(keys))

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: TensorDict) -> Any:
        from transfer_queue import KVBatchMeta

        self.written = {k: fields[k] for k in fields.keys()}
        return KVBatchMeta(keys=list(keys), tags=[{}] * len(keys), partition_id=partition_id)


def v1_trainer_cls(with_mixin: bool = True) -> type:
    """verl's v1 ``PPOTrainer._compute_advantage`` on a bare object, behind the recipe's mixin (or not)."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from recipe.nemo_gym.trainer.task_runner_v1 import NemoGymTrainerMixin

    class FakeV1Trainer:
        _compute_advantage = PPOTrainer._compute_advantage

        def __init__(self, cfg: Any) -> None:
            self.config = cfg

    return type("Trainer", (NemoGymTrainerMixin, FakeV1Trainer), {}) if with_mixin else FakeV1Trainer


def v1_advantages(monkeypatch, trajs, uids, cfg, with_mixin=True) -> tuple[list[torch.Tensor], dict[str, float]]:
    import transfer_queue
    from transfer_queue import KVBatchMeta

    fake = FakeTransferQueue(v1_records(trajs, uids))
    monkeypatch.setattr(transfer_queue, "kv_batch_get", fake.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", fake.kv_batch_put)
    keys = list(fake.records)
    meta = KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train")
    metrics: dict[str, float] = {}
    v1_trainer_cls(with_mixin)(cfg)._compute_advantage(meta, metrics)
    return list(fake.written["advantages"].unbind()), metrics


@pytest.fixture(autouse=True)
def installed():
    """What the v1 task runner does (masked_estimators.install(), then gdpo.install()), undone afterwards: other
    tests compare with verl's own estimators."""
    with restored_estimators():
        assert gdpo.install() and not gdpo.install()  # once per process
        yield


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_v1_gdpo_equals_the_legacy_trainers_bit_for_bit(monkeypatch, seed):
    trajs, uids = batch(seed)
    legacy = legacy_advantages(trajs, uids, algorithm())
    v1, metrics = v1_advantages(monkeypatch, trajs, uids, config())
    assert len(v1) == len(trajs)
    for i, (row, t) in enumerate(zip(v1, trajs, strict=True)):
        assert torch.equal(row, legacy[i, : len(row)]), (i, row, legacy[i])
        assert legacy[i, len(row) :].abs().sum() == 0  # the legacy row's padding
        if t.masked:
            assert row.abs().sum() == 0
    assert any(row.abs().sum() > 0 for row in v1)  # something to compare
    # the legacy trainer's gdpo/<key>/* metrics over the same column
    for key in KEYS:
        column = legacy_extras(trajs, uids, taken=set(), fill_keys=KEYS)[key]
        assert metrics[f"gdpo/{key}/mean"] == float(np.mean(column))


def test_without_the_hand_over_verls_v1_gdpo_never_sees_the_components(monkeypatch):
    trajs, uids = batch()
    with pytest.raises(KeyError, match='key "prompts" not found'):  # the first thing GDPO reads that v1 lacks
        v1_advantages(monkeypatch, trajs, uids, config(), with_mixin=False)


def test_at_the_v1_layouts_own_width_the_whitening_rounds_differently(monkeypatch):
    """Why the hand-over pads to ``rollout.response_length``: the same batch at its own (narrower) width gives other
    last bits (GDPO's batch whitening sums the whole tensor)."""
    trajs, uids = batch()
    legacy = legacy_advantages(trajs, uids, algorithm())
    narrow = OmegaConf.merge(config(), {"actor_rollout_ref": {"rollout": {"response_length": 1}}})
    v1, _ = v1_advantages(monkeypatch, trajs, uids, narrow)
    assert all(torch.allclose(row, legacy[i, : len(row)], atol=1e-5) for i, row in enumerate(v1))
    assert not all(torch.equal(row, legacy[i, : len(row)]) for i, row in enumerate(v1))


def test_other_estimators_are_left_to_verl(monkeypatch):
    trajs, uids = batch()
    cfg = config(adv_estimator="grpo")
    v1, metrics = v1_advantages(monkeypatch, trajs, uids, cfg)
    assert not any(k.startswith("gdpo/") for k in metrics) and len(v1) == len(trajs)
    assert gdpo.COMPONENTS.get() is None


def test_an_environment_whose_results_lack_a_key_stops_the_step_naming_it(monkeypatch):
    rng = np.random.default_rng(3)
    trajs = [
        trajectory(rng, {"format": 1.0}, masked=MaskReason.MISSING_REWARD_COMPONENT),
        trajectory(rng, {"format": 0.0}, masked=MaskReason.MISSING_REWARD_COMPONENT),
    ]
    with pytest.raises(AdapterConfigError, match=r"gdpo_reward_keys\[0\]='correctness'.*carry \['format'\]"):
        v1_advantages(monkeypatch, trajs, ["u", "u"], config())
