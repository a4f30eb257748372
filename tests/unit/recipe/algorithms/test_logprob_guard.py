"""The trusted-log-prob guard's decisions (``recipe.nemo_gym.algorithms.logprob_guard``): which steps recompute, what a measured
gap decides, which tokens and samples it is measured on, and the one write into verl's config. verl's real v1 branch
under the mixin: test_logprob_guard_verl.py. The e2e assertions of trusted steps in full launches (v1, legacy,
SmolLM2; the multi-environment fallback): tests/e2e."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from omegaconf import OmegaConf

from nemo_gym_adapter.errors import AdapterConfigError, AdapterError
from recipe.nemo_gym.algorithms import logprob_guard as lg
from recipe.nemo_gym.config.load import load_config
from tests.support.recipe_config import minimal_recipe_config

EXACT = lg.Gap(tokens=100, mean_abs=3e-6, max_abs=2e-4, mean=1e-8)
BF16 = lg.Gap(tokens=100, mean_abs=1.4e-2, max_abs=4e-2, mean=-1.6e-3)  # FSDP bf16 vs fp32 engine (docs/ONPOLICY.md)
NOTHING = lg.Gap(tokens=0)


def guard(**kw) -> lg.LogprobGuard:
    return lg.LogprobGuard(lg.GuardSettings(**{"enable": True, **kw}))


def run(g: lg.LogprobGuard, steps, gaps) -> list[bool]:
    """Drive ``g`` like a trainer: ask, and hand a recompute step its gap (``gaps[step]``, default exact)."""
    trusted = []
    for step in steps:
        trusted.append(g.trusts(step))
        if not trusted[-1]:
            g.observe(step, gaps.get(step, EXACT))
    return trusted


def test_first_step_recomputes_then_trusted_until_each_scheduled_check():
    g = guard(check_every=4)
    assert run(g, range(1, 11), {}) == [False, True, True, True, False, True, True, True, False, True]


def test_check_every_zero_checks_the_first_step_of_the_launch_only():
    assert run(guard(check_every=0), range(1, 8), {}) == [False] + [True] * 6
    # a resumed launch starts at its own first step, and checks it
    assert run(guard(check_every=0), range(41, 44), {}) == [False, True, True]


def test_a_gap_past_a_bound_falls_back_to_recomputing_for_the_rest_of_the_launch():
    g = guard(check_every=3)
    assert run(g, range(1, 10), {4: BF16}) == [False, True, True, False, False, False, False, False, False]
    assert g.state is lg.State.FALLBACK


@pytest.mark.parametrize(
    "gap",
    [
        lg.Gap(tokens=50, mean_abs=2e-4, max_abs=1e-3, mean=2e-4),  # a one-signed offset (a padded vocabulary)
        lg.Gap(tokens=50, mean_abs=5e-6, max_abs=0.2, mean=0.0),  # one token far off
    ],
)
def test_either_bound_alone_refuses(gap):
    g = guard()
    assert not g.trusts(1)
    assert "past the bound" in (g.observe(1, gap) or "") and g.state is lg.State.FALLBACK


def test_on_exceed_fail_stops_the_run_naming_the_key():
    g = guard(on_exceed="fail")
    g.trusts(1)
    with pytest.raises(AdapterError, match=r"nemo_gym\.trusted_logprobs\.on_exceed=fail") as e:
        g.observe(1, BF16)
    assert "nemo_gym.trusted_logprobs.enable=false" in str(e.value)


def test_a_step_with_nothing_fresh_to_measure_decides_nothing_and_checks_again():
    g = guard(check_every=5)
    assert run(g, range(1, 5), {1: NOTHING, 2: NOTHING}) == [False, False, False, True]
    # the same on a scheduled check of a trusted run (e.g. an async step whose samples are all stale)
    assert run(g, range(8, 12), {8: NOTHING}) == [False, False, True, True]


def test_off_never_trusts_reports_nothing_extra_and_prints_nothing():
    g = lg.LogprobGuard(lg.GuardSettings(enable=False))
    assert run(g, range(1, 5), {}) == [False] * 4
    assert g.observe(5, EXACT) is None and g.step_metrics(EXACT) == {}


def test_every_recompute_step_prints_its_gap_also_after_a_fallback():
    g = guard()
    g.trusts(1)
    assert "within" in (g.observe(1, EXACT) or "") and "3.00e-06" in (g.observe(1, EXACT) or "")
    g = guard()
    g.trusts(1)
    g.observe(1, BF16)
    g.trusts(2)
    assert "recomputing every step" in (g.observe(2, BF16) or "")


def test_step_metrics():
    g = guard()
    g.trusts(1)
    m = g.step_metrics(EXACT)
    assert m["onpolicy/trusted"] == 0.0 and m["onpolicy/guard/within"] == 1.0 and m["onpolicy/guard/num_tokens"] == 100
    g.observe(1, EXACT)
    g.trusts(2)
    assert g.step_metrics(None) == {"onpolicy/trusted": 1.0}
    assert math.isnan(guard().step_metrics(NOTHING)["onpolicy/guard/within"])


def test_the_gap_counts_trained_tokens_only_so_forced_tokens_never_matter():
    # Row 0: a grammar-forced token (rollout log-prob ~0, actor -7) left out by forced_token_min_logprob, and two
    # free tokens; the rollout engine is exact on the free ones.
    actor = torch.tensor([[-7.0, -1.5, -0.25], [-2.0, -3.0, 0.0]])
    rollout = torch.tensor([[-1e-6, -1.5, -0.25], [-2.0, -3.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    gap = lg.measure_gap(actor, rollout, mask)
    assert gap.tokens == 4 and gap.max_abs == 0.0
    assert guard().within(gap)
    # The same token trained (the rule off): the renormalised log-prob is a gap the guard refuses.
    assert not guard().within(lg.measure_gap(actor, rollout, torch.ones_like(mask)))


def test_renormalised_free_tokens_are_a_gap_too():
    # allowed_token_ids with processed log-probs: the sampled letter's log-prob renormalised over 4 letters
    actor = torch.log(torch.tensor([[0.01, 0.02]]))
    rollout = torch.log(torch.tensor([[0.25, 0.5]]))
    assert not guard().within(lg.measure_gap(actor, rollout, torch.ones(1, 2)))


def test_only_samples_of_the_current_weights_are_measured():
    tags = [
        {"min_global_steps": 4, "max_global_steps": 4},  # fresh at step 5
        {"min_global_steps": 3, "max_global_steps": 4},  # spans a weight sync
        {"min_global_steps": 3, "max_global_steps": 3},  # one step stale
        {"min_global_steps": 4, "max_global_steps": 4, "is_padding": True},
    ]
    fresh = lg.fresh_rows(tags, global_steps=5)
    assert fresh.tolist() == [True, False, False, False]
    actor = torch.tensor([[-1.0], [-1.0], [-1.0], [-1.0]])
    rollout = torch.tensor([[-1.0], [-3.0], [-4.0], [-9.0]])  # the stale rows differ by policy drift, not the engine
    gap = lg.measure_gap(actor, rollout, torch.ones(4, 1), fresh)
    assert gap.tokens == 1 and gap.max_abs == 0.0


def test_rollout_nll_is_the_mean_over_trained_tokens():
    rollout = torch.tensor([[-1.0, -3.0, -100.0]])
    assert lg.rollout_nll_mean(rollout, torch.tensor([[1, 1, 0]])) == 2.0
    assert math.isnan(lg.rollout_nll_mean(rollout, torch.zeros(1, 3)))


def _verl_like_config(block):
    return OmegaConf.create(
        {
            "algorithm": {"rollout_correction": block},
            "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "vanilla"}}},
        }
    )


@pytest.mark.parametrize("block", [{"rollout_is": "sequence", "rollout_is_threshold": 2.0, "bypass_mode": False}, None])
def test_the_switch_sets_verls_bypass_per_step_and_puts_the_config_back(block):
    cfg = _verl_like_config(copy.deepcopy(block))
    OmegaConf.set_struct(cfg, True)  # verl's trainer config is a struct config
    switch = lg.BypassSwitch(cfg)
    switch.set(True)
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    # what verl's legacy apply_bypass_mode does to the driver's copy on a bypassed step
    with __import__("omegaconf").open_dict(cfg):
        cfg.actor_rollout_ref.actor.policy_loss.loss_mode = "bypass_mode"
    switch.set(False)
    restored = OmegaConf.to_container(cfg.algorithm.rollout_correction) if block else cfg.algorithm.rollout_correction
    assert restored == block
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"


class FakeTrainer:
    """What the guard reads of a verl trainer: its config."""

    def __init__(self, cfg) -> None:
        self.config = OmegaConf.create(cfg)


def test_begin_and_finish_step_on_a_fake_trainer(tmp_path, capsys):
    cfg = minimal_recipe_config(tmp_path)
    cfg["nemo_gym"]["trusted_logprobs"] = {"enable": True, "check_every": 2}
    cfg.setdefault("algorithm", {})["rollout_correction"] = {"rollout_is": None, "bypass_mode": False}
    t = FakeTrainer(cfg)
    old, rollout, mask = torch.full((2, 3), -1.0), torch.full((2, 3), -1.0), torch.ones(2, 3)
    assert lg.begin_step(t, 1) is False and t.config.algorithm.rollout_correction.bypass_mode is False
    m = lg.finish_step(t, 1, old, rollout, mask)
    assert m["onpolicy/trusted"] == 0.0 and m["onpolicy/guard/within"] == 1.0 and m["onpolicy/rollout_nll_mean"] == 1.0
    assert "log-prob guard, step 1" in capsys.readouterr().out
    assert lg.begin_step(t, 2) is True and t.config.algorithm.rollout_correction.bypass_mode is True
    assert lg.finish_step(t, 2, None, rollout, mask) == {"onpolicy/trusted": 1.0, "onpolicy/rollout_nll_mean": 1.0}
    assert lg.begin_step(t, 3) is False and t.config.algorithm.rollout_correction.bypass_mode is False


def test_off_the_trainers_calls_leave_verls_config_alone(tmp_path, capsys):
    """The default: the trainers still call begin/finish every step; nothing of verl's config is read or changed, the
    old log-probs are always recomputed and only the sampler-side entropy estimate is added."""
    cfg = minimal_recipe_config(tmp_path)
    cfg.setdefault("algorithm", {})["rollout_correction"] = {"rollout_is": None, "bypass_mode": False}
    t = FakeTrainer(cfg)
    before = OmegaConf.to_container(t.config)
    old, rollout, mask = torch.full((2, 3), -1.5), torch.full((2, 3), -1.0), torch.ones(2, 3)
    for step in (1, 2, 3):
        assert lg.begin_step(t, step) is False
        assert lg.finish_step(t, step, old, rollout, mask) == {"onpolicy/rollout_nll_mean": 1.0}
    assert lg.guard_of(t)[1] is None and OmegaConf.to_container(t.config) == before
    assert capsys.readouterr().out == ""


def test_config_refuses_verls_own_bypass_with_the_guard_on(tmp_path):
    cfg = minimal_recipe_config(tmp_path)
    cfg["nemo_gym"]["trusted_logprobs"] = {"enable": True}
    cfg.setdefault("algorithm", {})["rollout_correction"] = {"bypass_mode": True}
    with pytest.raises(AdapterConfigError, match=r"bypass_mode=true with nemo_gym\.trusted_logprobs\.enable=true"):
        load_config(cfg)
    cfg["nemo_gym"]["trusted_logprobs"] = {"enable": False}
    load_config(cfg)  # verl's own unguarded bypass stays the user's choice


@pytest.mark.parametrize(
    "section, key",
    [
        ({"check_every": -1}, "nemo_gym.trusted_logprobs.check_every"),
        ({"max_mean_abs_diff": 0}, "nemo_gym.trusted_logprobs.max_mean_abs_diff"),
        ({"max_abs_diff": -1.0}, "nemo_gym.trusted_logprobs.max_abs_diff"),
        ({"on_exceed": "ignore"}, "nemo_gym.trusted_logprobs.on_exceed"),
        ({"enabled": True}, "nemo_gym.trusted_logprobs.enabled"),
    ],
)
def test_section_errors_name_the_key(tmp_path, section, key):
    cfg = minimal_recipe_config(tmp_path)
    cfg["nemo_gym"]["trusted_logprobs"] = section
    with pytest.raises(AdapterConfigError, match=key.replace(".", r"\.")):
        load_config(cfg)


def test_start_up_notes_name_the_settings_that_make_a_fallback_likely():
    s = lg.GuardSettings(enable=True)
    r = {"logprobs_mode": "raw_logprobs", "temperature": 0.7, "top_p": 1.0, "top_k": -1, "dtype": "float32"}
    notes = lg.config_notes(OmegaConf.create({"actor_rollout_ref": {"rollout": r}}), s)
    assert len(notes) == 1 and "raw_logprobs" in notes[0] and "temperature=0.7" in notes[0]
    r.update(logprobs_mode="processed_logprobs", top_p=0.9, dtype="bfloat16")
    notes = lg.config_notes(OmegaConf.create({"actor_rollout_ref": {"rollout": r}}), s)
    assert any("top_p=0.9" in n for n in notes) and any("bfloat16" in n for n in notes)
    r.update(top_p=1.0, dtype="float32")
    assert lg.config_notes(OmegaConf.create({"actor_rollout_ref": {"rollout": r}}), s) == []
    assert lg.config_notes(OmegaConf.create({"actor_rollout_ref": {"rollout": r}}), lg.GuardSettings()) == []


def test_a_batch_with_a_stale_sample_recomputes_and_its_fresh_samples_still_check():
    g = guard(check_every=10)
    assert not g.trusts(1) and "within" in (g.observe(1, EXACT) or "")
    assert g.trusts(2, all_fresh=True)
    assert not g.trusts(3, all_fresh=False)  # an async step training on samples of older weights
    assert "within" in (g.observe(3, EXACT) or "") and g.trusts(4)
    tags = [
        {"min_global_steps": 2, "max_global_steps": 2},
        {"min_global_steps": 1, "max_global_steps": 2, "is_padding": True},
    ]
    assert lg.all_fresh(tags, lg.fresh_rows(tags, 3))  # padding does not count
    tags[1]["is_padding"] = False
    assert not lg.all_fresh(tags, lg.fresh_rows(tags, 3))
