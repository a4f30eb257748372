"""A validation pass: per-environment metrics under verl's validation naming, and Gym's /aggregate_metrics."""

from __future__ import annotations

import numpy as np
import pytest

from nemo_gym_adapter.rollouts.client import RolloutOutcome
from nemo_gym_adapter.rollouts.core import RowResult
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory
from nemo_gym_adapter.rollouts.validation import ValidationPass, aggregate_metric_names, strip_result
from tests.support.fake_gym import FakeEnvServer, routes_for


def _row(index: int, env: str, reward: float, masked: MaskReason | None = None, ok: bool = True) -> RowResult:
    result = {"reward": reward, "response": {"output": ["big"], "usage": {"total_tokens": 3}}, "extra": 1}
    outcome = RolloutOutcome(index, env if ok else None, None, 0.1, 1, result=result if ok else None)
    n = 0 if masked else 1
    traj = Trajectory(
        env_name=env,
        response_ids=np.zeros(n, dtype=np.int64),
        sampled_spans=((0, 1),) if n else (),
        sampled_logprobs=np.zeros(n, dtype=np.float32),
        reward=0.0 if masked else reward,
        gym_reward=reward,
        num_turns=1,
        masked_reason=masked,
    )
    return RowResult(index, env, outcome, traj)


@pytest.fixture
def servers():
    a, b = FakeEnvServer(), FakeEnvServer()
    yield a, b
    a.stop()
    b.stop()


def test_strip_result_keeps_what_gym_keeps():
    entry = strip_result(
        {"reward": 1.0, "response": {"output": [1], "usage": {"t": 1}}, "responses_create_params": {}}, 3, 1
    )
    assert entry == {"reward": 1.0, "response": {"usage": {"t": 1}}, "_ng_task_index": 3, "_ng_rollout_index": 1}


def test_metrics_per_environment_under_verls_validation_names_plus_gym_aggregate(servers):
    a, b = servers
    vp = ValidationPass(routes_for(("env_a", a.url), ("env_b", b.url)))
    vp.add([_row(0, "env_a", 1.0), _row(1, "env_a", 0.0), _row(2, "env_b", 1.0)], [7, 7, 8])
    vp.add([_row(0, "env_b", 0.0, masked=MaskReason.TIMEOUT, ok=False)], [9])  # a second batch of the same pass
    m = vp.metrics()
    assert m["val-core/env_a/gym/reward_mean"] == 0.5 and m["val-core/env_b/gym/reward_mean"] == 1.0
    assert m["val-core/all/gym/success_rate"] == pytest.approx(2 / 3)
    assert m["val-aux/env_b/gym/masked_rate/timeout"] == 0.5 and m["val-aux/env_a/gym/num_turns_mean"] == 1.0
    # each environment's own server got its own results (the failed row has none), stripped as Gym strips them
    (body_a,) = a.aggregate_bodies
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in body_a["verify_responses"]] == [(7, 0), (7, 1)]
    assert all("output" not in r["response"] for r in body_a["verify_responses"])
    assert len(b.aggregate_bodies[0]["verify_responses"]) == 1
    assert m["val-core/env_a/gym_aggregate/mean/reward"] == 0.5
    assert m["val-aux/env_a/gym_aggregate/max/reward"] == 1.0
    assert "val-aux/env_a/gym_aggregate/mean/reward" not in m  # key metrics are not repeated under val-aux
    assert not [k for k in m if k.endswith("/label")]  # strings are not metrics


def test_a_failing_aggregate_call_is_counted_not_raised(servers):
    a, _ = servers
    vp = ValidationPass(routes_for(("env_a", "http://127.0.0.1:9")), gym_aggregate=True, timeout_s=2)
    vp.add([_row(0, "env_a", 1.0)], [0])
    m = vp.metrics()
    assert m["val-aux/env_a/gym_aggregate/failed"] == 1.0 and m["val-core/env_a/gym/reward_mean"] == 1.0


def test_aggregate_off_and_empty_pass():
    vp = ValidationPass(routes_for(("env_a", "http://127.0.0.1:9")), gym_aggregate=False)
    assert vp.metrics() == {}
    vp.add([_row(0, "env_a", 1.0)], [0])
    assert not [k for k in vp.metrics() if "gym_aggregate" in k]
    with pytest.raises(ValueError, match="1 rows but 2 task indices"):
        vp.add([_row(0, "env_a", 1.0)], [0, 1])


def test_aggregate_metric_names_numbers_only():
    out = aggregate_metric_names("e", {"key_metrics": {"k": True}, "agent_metrics": {"x": 2, "nan": float("nan")}})
    assert out == {"val-core/e/gym_aggregate/k": 1.0, "val-aux/e/gym_aggregate/x": 2.0}
