"""Unit tests of trajectories → verl's padded legacy batch (``nemo_gym_adapter.rollouts.padding``), against a deliberately
slow per-token reference, including every recorded Gym result (``tests/fixtures/gym_results``)."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch

from nemo_gym_adapter.rollouts.builder import build_trajectory
from nemo_gym_adapter.rollouts.outcome import trajectory_from_outcome
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import parse_run_result
from tests.support.gym_results import (
    CFG,
    E0,
    G0,
    G1,
    P0,
    PAD,
    RECORDED,
    FakeFailure,
    FakeOutcome,
    build,
    handmade_multiturn,
    handmade_result,
)


def reference_pad(trajs: list[Trajectory], P: int, R: int, pad: int) -> dict[str, torch.Tensor]:
    """Independent, deliberately slow per-token implementation of verl's legacy batch layout."""
    out = {k: [] for k in ("prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores", "token_turns")}
    out.update(attention_mask=[], position_ids=[], input_ids=[])
    for t in trajs:
        prompt = t.prompt_ids.tolist() or [pad]
        resp = t.response_ids.tolist() or [pad]
        mask = [0] * len(resp)
        lps = [0.0] * len(resp)
        turns = [0] * len(resp)
        lp_iter = iter(t.sampled_logprobs.tolist())
        for k, (start, end) in enumerate(t.sampled_spans):
            for j in range(start, end):
                mask[j] = 1
                lps[j] = next(lp_iter)
                turns[j] = (t.call_indices[k] if t.call_indices else k) + 1
        prow = [pad] * (P - len(prompt)) + prompt
        rrow = resp + [pad] * (R - len(resp))
        att = [0] * (P - len(prompt)) + [1] * len(prompt) + [1] * len(resp) + [0] * (R - len(resp))
        pos, seen = [], 0
        for a in att:
            seen += a
            pos.append(max(seen - 1, 0))
        scores = [0.0] * R
        scores[len(resp) - 1] = t.reward
        out["prompts"].append(prow)
        out["responses"].append(rrow)
        out["response_mask"].append(mask + [0] * (R - len(resp)))
        out["rollout_log_probs"].append(lps + [0.0] * (R - len(resp)))
        out["rm_scores"].append(scores)
        out["token_turns"].append(turns + [0] * (R - len(resp)))
        out["attention_mask"].append(att)
        out["position_ids"].append(pos)
        out["input_ids"].append(prow + rrow)
    floats = {"rollout_log_probs", "rm_scores"}
    return {k: torch.tensor(v, dtype=torch.float32 if k in floats else torch.long) for k, v in out.items()}


def _random_batch(seed: int, n: int = 24) -> tuple[list[Trajectory], TrajectoryConfig]:
    rng = random.Random(seed)
    cfg = TrajectoryConfig(prompt_length=12, response_length=20, max_model_len=rng.choice([None, 26]))
    trajs = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.15:
            trajs.append(
                trajectory_from_outcome(
                    FakeOutcome(0, 1.0, failure=FakeFailure("timeout", "t")), env_name="e", config=cfg
                )
            )
            continue
        prompt = [rng.randrange(1, 500) for _ in range(rng.randint(1, 14))]
        turns = rng.randint(1, 4)
        gens = [[rng.randrange(1, 500) for _ in range(rng.randint(1, 6))] for _ in range(turns)]
        envs = [[rng.randrange(1, 500) for _ in range(rng.randint(0, 4))] for _ in range(turns - 1)]
        payload = handmade_multiturn(prompt, gens, envs, reward=rng.choice([0.0, 1.0, 0.25]))
        payload["mask_sample"] = kind > 0.9
        trajs.append(build(payload, cfg))
    return trajs, cfg


@pytest.mark.parametrize("seed", range(6))
def test_padding_matches_slow_reference(seed):
    trajs, cfg = _random_batch(seed)
    got = pad_trajectories(trajs, prompt_length=cfg.prompt_length, response_length=cfg.response_length, pad_token_id=7)
    want = reference_pad(trajs, cfg.prompt_length, cfg.response_length, 7)
    assert set(got.tensors) == set(want)
    for key, expected in want.items():
        assert got.tensors[key].dtype == expected.dtype, key
        assert torch.equal(got.tensors[key], expected), key


def test_random_batches_cover_masked_truncated_and_multiturn_rows():
    trajs = [t for seed in range(6) for t in _random_batch(seed)[0]]
    assert {MaskReason.TIMEOUT, MaskReason.MASK_SAMPLE, MaskReason.PROMPT_TOO_LONG} <= {t.masked_reason for t in trajs}
    assert any(t.truncated for t in trajs) and max(t.num_turns for t in trajs if not t.masked) >= 3


def test_masked_rows_are_identifiable_from_response_mask_alone():
    trajs, cfg = _random_batch(11, n=64)
    batch = pad_trajectories(trajs, prompt_length=12, response_length=20, pad_token_id=PAD)
    fully_masked = (batch.tensors["response_mask"].sum(-1) == 0).tolist()
    assert fully_masked == [t.masked for t in trajs]
    assert (batch.tensors["attention_mask"][:, 12:].sum(-1) >= 1).all()  # never an empty response
    assert batch.non_tensors["gym_masked_reason"].tolist() == [t.masked_reason.value if t.masked else "" for t in trajs]
    assert batch.tensors["rm_scores"][torch.tensor(fully_masked)].abs().sum() == 0


def test_batch_shapes_and_non_tensors():
    trajs = [
        build(handmade_multiturn(P0, [G0, G1], [E0]), env_name="env_a"),
        build(handmade_result([]), env_name="env_b"),
    ]
    b = pad_trajectories(trajs, prompt_length=5, response_length=9, pad_token_id=PAD)
    for key in ("prompts",):
        assert b.tensors[key].shape == (2, 5)
    for key in ("responses", "response_mask", "rollout_log_probs", "rm_scores"):
        assert b.tensors[key].shape == (2, 9)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert b.tensors[key].shape == (2, 14)
    assert b.non_tensors["__num_turns__"].tolist() == [2, 0] and b.non_tensors["__num_turns__"].dtype == np.int32
    assert b.non_tensors["gym_env"].tolist() == ["env_a", "env_b"]
    assert b.non_tensors["gym_masked_reason"].tolist() == ["", "no_model_call"]
    assert b.non_tensors["multi_modal_inputs"].tolist() == [{}, {}]
    assert b.tensors["rm_scores"][0, len(G0 + E0 + G1) - 1] == 1.0


def test_padding_rejects_rows_longer_than_the_lengths():
    t = build(handmade_multiturn(P0, [G0, G1], [E0]))
    with pytest.raises(ValueError, match="row 0 has a response of 8 tokens > response_length 4"):
        pad_trajectories([t], prompt_length=8, response_length=4, pad_token_id=PAD)


def test_outcomes_to_padded_rows_in_row_order():
    outcomes = [
        FakeOutcome(0, 2.0, result=handmade_multiturn(P0, [G0, G1], [E0])),
        FakeOutcome(1, 9.0, failure=FakeFailure("timeout", "after 900 s")),
    ]
    trajs = [trajectory_from_outcome(o, env_name=e, config=CFG) for o, e in zip(outcomes, ["a", "b"], strict=True)]
    batch = pad_trajectories(
        trajs, prompt_length=CFG.prompt_length, response_length=CFG.response_length, pad_token_id=PAD
    )
    assert [t.masked_reason for t in trajs] == [None, MaskReason.TIMEOUT]
    assert batch.tensors["response_mask"].sum(-1).tolist() == [5, 0]


def test_batch_is_accepted_by_verl_dataproto_and_position_ids_match_verl():
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.utils.model import compute_position_id_with_mask

    trajs, cfg = _random_batch(3)
    b = pad_trajectories(trajs, prompt_length=12, response_length=20, pad_token_id=PAD)
    assert torch.equal(b.tensors["position_ids"], compute_position_id_with_mask(b.tensors["attention_mask"]))
    data = DataProto(batch=TensorDict(b.tensors, batch_size=len(trajs)), non_tensor_batch=b.non_tensors)
    assert len(data) == len(trajs)
    assert len(DataProto.concat([data, data])) == 2 * len(trajs)


@pytest.mark.skipif(not RECORDED, reason="no recorded Gym results yet (tests/fixtures/gym_results/*.json)")
@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
@pytest.mark.parametrize("policy", ["mask", "truncate"])
def test_every_recorded_result_parses_and_pads_consistently(path, policy):
    payload = json.loads(path.read_text())
    results = payload if isinstance(payload, list) else [payload]
    before = copy.deepcopy(results)
    cfg = TrajectoryConfig(prompt_length=4096, response_length=4096, contiguity=policy)
    trajs = [build_trajectory(parse_run_result(r), env_name=path.stem, config=cfg) for r in results]
    batch = pad_trajectories(trajs, prompt_length=4096, response_length=4096, pad_token_id=PAD)
    assert results == before
    want = reference_pad(trajs, 4096, 4096, PAD)
    for key, expected in want.items():
        assert torch.equal(batch.tensors[key], expected), key
    for t in trajs:
        assert t.masked == (t.num_generated == 0)
