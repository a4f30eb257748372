"""Group filtering (DAPO's dynamic sampling) on Gym rows, hydra-launched end to end on verl's v1 trainer (the one whose
replay buffer filters groups): ``python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_toy
algorithm.filter_groups.enable=true`` (metric ``gym_outcome``, the shipped default) on the toy environment's real
Gym server (string_match, reward 1 iff the reply is "A").

The rows make the outcome of some groups certain, interleaved with the others: four rows as shipped (any of A-D may be sampled: a group of the tiny
random model usually has both outcomes), two that allow only "A" (every sample scores 1) and two that allow only "B"
(every sample scores 0) -- groups with nothing to learn, which the filter must drop and replace.

Checked from verl's own rollout dump of each trained batch (``trainer.rollout_data_dir``: one line per trained
sample with its group uid and score), independently of the adapter's metrics: no trained group comes from a
fixed-outcome row, every trained group has both outcomes; verl's ``filter_groups/evicted_samples`` counted the dropped
groups and the adapter's ``gym/train/groups_without_signal_rate`` is 0 while its per-environment ``groups/same_outcome``
counted them as finished rollouts. The control (filter off, same rows and seed; the slow tier, ``pytest --slow``) shows the same
checks fail: fixed-outcome groups are trained and the no-signal rate is above 0. No process is left behind.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.e2e.test_recipe_cpu_smoke import _parse_steps, _run_recipe, batch_overrides, reaped_children  # noqa: F401

# The slow tier (CI budget; docs/CI.md): 135 s of a fresh clone's CI. In the unit tier: the outcome every training
# sample carries for verl's filter (tests/unit/recipe/managers/test_v1.py) and the same-outcome groups
# (tests/unit/rollouts/test_groups.py); the v1 launch it rides on is the v1 smoke's.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ENV = "toy_choice_simple_agent"
STEPS = 2
BATCH, N = 2, 4
OPEN, ONLY_A, ONLY_B = (0, 2, 4, 6), (1, 5), (3, 7)  # interleaved: any two consecutive rows hold a fixed one


def _allow_only(row: dict, token_id: int) -> dict:
    """``row`` with sampling restricted to one letter (ids 32-35 are A-D, configs/gym/toy_choice.yaml)."""
    meta = row["responses_create_params"]["metadata"]
    extra = json.loads(meta["extra_body"])
    extra["allowed_token_ids"] = extra["stop_token_ids"] = [token_id]
    meta["extra_body"] = json.dumps(extra)
    return row


def _rows(path: Path) -> dict[str, str]:
    """Eight toy rows written to ``path``; question -> "open" | "only_A" | "only_B"."""
    lines = (REPO / "configs" / "gym" / "data" / "toy_choice.jsonl").read_text().splitlines()[:8]
    rows, kinds = [], {}
    for i, line in enumerate(lines):
        row = json.loads(line)
        kind = "open" if i in OPEN else "only_A" if i in ONLY_A else "only_B"
        if kind != "open":
            row = _allow_only(row, 32 if kind == "only_A" else 33)
        rows.append(json.dumps(row))
        kinds[row["responses_create_params"]["input"][0]["content"]] = kind
    path.write_text("\n".join(rows) + "\n")
    return kinds


def _trained_groups(dump_dir: Path, kinds: dict[str, str]) -> dict[int, dict[str, tuple[str, list[float]]]]:
    """Step -> group uid -> (row kind, scores of its trained samples), from verl's rollout dumps."""
    out: dict[int, dict[str, tuple[str, list[float]]]] = {}
    for path in sorted(dump_dir.glob("*.jsonl")):
        groups: dict[str, tuple[str, list[float]]] = {}
        scores: dict[str, list[float]] = defaultdict(list)
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            (kind,) = [k for q, k in kinds.items() if q in rec["input"]]
            uid = str(rec["uid"]).split("_")[0]  # verl's key: <group uid>_<sample>_<turn>
            scores[uid].append(float(rec["score"]))
            groups[uid] = (kind, scores[uid])
        out[int(path.stem)] = groups
    return out


def _run(tmp_path: Path, enable: bool) -> tuple[dict, dict, str]:
    kinds = _rows(tmp_path / "rows.jsonl")
    text, _ = _run_recipe(
        tmp_path,
        f"algorithm.filter_groups.enable={str(enable).lower()}",
        f"data.train_files=[{tmp_path / 'rows.jsonl'}]",
        f"data.val_files=[{tmp_path / 'rows.jsonl'}]",
        "data.shuffle=false",  # rows in file order: each step's first two prompts hold a fixed-outcome row
        *batch_overrides(BATCH, N),
        f"trainer.total_training_steps={STEPS}",
        f"trainer.rollout_data_dir={tmp_path / 'dumps'}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        config_name="nemo_gym_cpu_toy",
    )
    steps = _parse_steps(text)
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps logged: {sorted(steps)}\n{text[-3000:]}"
    return steps, _trained_groups(tmp_path / "dumps", kinds), text


def _evicted(m: dict[str, float]) -> float:
    """verl's count of samples its replay buffer dropped as DAPO-filtered this step (0 when it dropped none)."""
    return sum(v for k, v in m.items() if k.endswith("filter_groups/evicted_samples"))


def test_groups_with_one_outcome_are_dropped_and_refilled_on_the_v1_trainer(tmp_path, reaped_children):  # noqa: F811
    steps, trained, text = _run(tmp_path, enable=True)
    assert sorted(trained) == list(range(1, STEPS + 1)), sorted(trained)
    for step, groups in trained.items():
        assert len(groups) == BATCH, (step, groups)  # refilled: a full batch of groups
        for uid, (kind, scores) in groups.items():
            assert len(scores) == N, (step, uid, scores)
            assert kind == "open", f"step {step}: a fixed-outcome row ({kind}) was trained: {scores}"
            assert len(set(scores)) == 2, f"step {step}: group {uid} has one outcome {scores}: nothing to learn"
        m = steps[step]
        assert m["gym/train/groups_without_signal_rate"] == 0.0, (step, m)
    dropped = sum(_evicted(m) for m in steps.values())
    same = sum(m[f"gym/{ENV}/groups/same_outcome"] for m in steps.values())
    # Every other row can only give one outcome and rows come in file order, so each step's first two prompts hold
    # one; each dropped group is counted by verl and by the adapter.
    assert dropped >= 1 and same >= 1, (
        dropped,
        same,
        {s: sorted(k for k in m if "group" in k) for s, m in steps.items()},
    )
    print(
        f"filter_groups: verl evicted {dropped:g} groups, adapter counted {same:g} same-outcome groups; "
        + "; ".join(f"step {s}: trained {[g[1] for g in groups.values()]}" for s, groups in trained.items())
    )
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"


@pytest.mark.slow
def test_control_without_the_filter_fixed_outcome_groups_are_trained(tmp_path, reaped_children):  # noqa: F811
    steps, trained, _ = _run(tmp_path, enable=False)
    kinds = [kind for groups in trained.values() for kind, _ in groups.values()]
    silent = [scores for groups in trained.values() for _, scores in groups.values() if len(set(scores)) == 1]
    assert any(k != "open" for k in kinds) and silent, (kinds, silent)
    assert max(m["gym/train/groups_without_signal_rate"] for m in steps.values()) > 0
    assert sum(_evicted(m) for m in steps.values()) == 0
