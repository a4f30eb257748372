"""Unit tests of the partial-rollout token math (``nemo_gym_adapter.tokens.resume``): when an interrupted turn can be
resumed, what budget and seed the rest gets, how segments are kept. Pure: no engine."""

from __future__ import annotations

import random

import pytest

from nemo_gym_adapter.tokens import resume as plan
from nemo_gym_adapter.tokens.resume import Ledger, Sampling, Segment


def test_a_plain_turn_resumes():
    assert plan.refusal(Sampling(max_tokens=10), [5, 6, 7], segments=1) is None
    assert plan.refusal(Sampling(max_tokens=10), [], segments=1) is None  # aborted before its first token


@pytest.mark.parametrize("name", plan.OUTPUT_DEPENDENT)
def test_sampling_that_depends_on_the_generated_tokens_is_refused_by_name(name):
    """Penalties over output tokens, grammars, bad words, budgets: the kept tokens cannot move into the prompt."""
    assert plan.refusal(Sampling(max_tokens=10, output_dependent=(name,)), [1], segments=1) == name


def test_refusals_in_order_each_a_metric_key():
    kw = {"segments": 1}
    assert plan.refusal(Sampling(n=2, output_dependent=("bad_words",)), [1], enabled=False, **kw) == "disabled"
    assert plan.refusal(Sampling(n=2), [1], rejecting=True, **kw) == "rejecting"
    assert plan.refusal(Sampling(n=2), [1], token_prompt=False, **kw) == "n"
    assert plan.refusal(Sampling(), [1], token_prompt=False, **kw) == "not_token_prompt"
    assert plan.refusal(Sampling(), [1], segments=plan.MAX_SEGMENTS) == "too_many_segments"
    assert plan.refusal(Sampling(), [1], segments=plan.MAX_SEGMENTS - 1) is None
    # resumed requests aborted before their first token (a pause that aborts again) are capped separately
    assert plan.refusal(Sampling(), [1], segments=1, attempts=plan.MAX_ATTEMPTS) == "too_many_segments"
    assert plan.refusal(Sampling(), [1], segments=1, attempts=plan.MAX_ATTEMPTS - 1) is None
    assert set(plan.REFUSALS) >= set(plan.OUTPUT_DEPENDENT)
    assert all("/" not in r and " " not in r for r in plan.REFUSALS)


def test_a_turn_that_had_already_finished_is_not_guessed_on():
    """The abort raced the finish: every token of the budget is there, or the last one is a stop token."""
    assert plan.refusal(Sampling(max_tokens=3), [1, 2, 3], segments=1) == "budget_spent"
    assert plan.refusal(Sampling(max_tokens=9), [1, 2, 3], segments=1, room=3) == "budget_spent"  # context full
    assert plan.refusal(Sampling(max_tokens=9), [1, 2, 3], segments=1, room=4) is None
    stops = frozenset({99})
    assert plan.refusal(Sampling(stop_token_ids=stops), [1, 99], segments=1) == "ended_on_stop_token"
    # min_tokens suppresses stop tokens: a stop id inside the minimum was just a token
    assert plan.refusal(Sampling(stop_token_ids=stops, min_tokens=2), [1, 99], segments=1) is None
    assert plan.refusal(Sampling(stop_token_ids=stops), [99, 1], segments=1) is None


@pytest.mark.parametrize("seed", range(200))
def test_the_resumed_budget_is_what_the_turn_had_left_within_the_context(seed):
    rng = random.Random(seed)
    max_model_len = rng.randrange(50, 500)
    prompt = rng.randrange(1, max_model_len)
    max_tokens = rng.randrange(1, max_model_len - prompt + 1)  # vLLM clamps the request this way
    min_tokens = rng.randrange(0, max_tokens + 1)
    kept = rng.randrange(0, max_tokens)  # fewer than the budget: a turn refusal() lets through
    sampling = Sampling(max_tokens=max_tokens, min_tokens=min_tokens)
    rest, rest_min = plan.resumed_limits(sampling, kept, prompt, max_model_len)
    assert rest == max_tokens - kept >= 1
    assert prompt + kept + rest <= max_model_len  # the context clamp still holds
    assert rest_min == max(0, min_tokens - kept) <= rest
    assert kept + rest_min >= min_tokens  # the minimum counts the kept tokens


def test_without_a_budget_the_rest_is_what_the_context_leaves():
    assert plan.resumed_limits(Sampling(max_tokens=None), 10, 30, 100) == (60, 0)
    assert plan.resumed_limits(Sampling(max_tokens=None), 10, 30, None) == (None, 0)
    assert plan.resumed_limits(Sampling(max_tokens=50), 10, 30, 60) == (20, 0)  # the context is the tighter bound


def test_each_segment_gets_its_own_seed():
    seeds = [plan.resumed_seed(7, k) for k in range(1, 6)]
    assert len(set(seeds)) == 5 and 7 not in seeds and all(0 <= s < 2**63 for s in seeds)
    assert plan.resumed_seed(7, 1) == plan.resumed_seed(7, 1)  # reproducible
    assert plan.resumed_seed(None, 3) is None


class Extendable:
    """An engine's own sequence type (vLLM's FlatLogprobs): constructed empty, grown with ``extend``."""

    def __init__(self, items=()) -> None:
        self.items = list(items)

    def extend(self, other) -> None:
        self.items.extend(other.items if isinstance(other, Extendable) else other)


def test_segments_are_concatenated_in_their_own_container_type():
    assert plan.concat([[1, 2], [], [3]]) == [1, 2, 3]
    assert plan.concat([(1,), [2]]) == [1, 2]
    merged = plan.concat([Extendable([1]), Extendable([2, 3])])
    assert isinstance(merged, Extendable) and merged.items == [1, 2, 3]
    assert plan.concat([[1], None]) is None  # no log-probs asked: none invented


def test_version_span_covers_segments_that_carry_tokens():
    assert plan.version_span([Segment(5, 3), Segment(0, 9), Segment(4, 4)]) == (3, 4)
    assert plan.version_span([Segment(5, None)]) is None


def test_turn_keys_name_a_call_by_its_prompt_and_generation():
    key = plan.turn_key([1, 2, 3], [4, 5])
    assert key == plan.turn_key([1, 2, 3], [4, 5])
    assert key != plan.turn_key([1, 2], [3, 4, 5])  # the same ids split elsewhere are another call
    assert key != plan.turn_key([1, 2, 3], [4, 5, 6])


def test_the_ledger_keeps_the_newest_turns():
    ledger = Ledger(capacity=2)
    for i in range(3):
        ledger.record(f"k{i}", [Segment(i, i)])
    assert len(ledger) == 2 and ledger.get("k0") is None and ledger.get("k2") == (Segment(2, 2),)
    ledger.record("k1", [Segment(9, 9)])  # recorded again: newest
    ledger.record("k3", [Segment(3, 3)])
    assert ledger.get("k2") is None and ledger.get("k1") == (Segment(9, 9),)
