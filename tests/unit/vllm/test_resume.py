"""Unit tests of partial rollouts on vLLM (``nemo_gym_adapter.vllm.resume``), with fakes of vLLM's engine objects.

``FakeEngine.generate`` answers each call with the next scripted ``FakeCompletionOutput`` (as vLLM's final-only
output: the turn's ids, log-probs and finish reason; ``"abort"`` as ``pause_generation(mode="abort")`` ends it) and
records the prompt and sampling it was called with, so the tests see what the resumed request asks the engine.
The real paths: vLLM's own detokenizer at the seam and the 0.31 serving code (``tests/integration/vllm/
test_resume_seam.py``, ``test_weight_sync_abort.py``), the GPU releases' classes (``tests/vllm_releases/hook_cases.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import types
from typing import Any

import pytest

from nemo_gym_adapter.tokens.resume import Segment, turn_key
from nemo_gym_adapter.vllm import resume as vllm_resume


class OutputKind:
    """vLLM's ``RequestOutputKind`` as ``vllm.resume`` reads it: by name."""

    def __init__(self, name: str) -> None:
        self.name = name


FINAL_ONLY = OutputKind("FINAL_ONLY")
PROMPT = [11, 12, 13]


@dataclasses.dataclass
class FakeSamplingParams:
    """vLLM's ``SamplingParams`` fields ``vllm.resume`` reads and sets."""

    max_tokens: int | None = 10
    min_tokens: int = 0
    seed: int | None = None
    n: int = 1
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    structured_outputs: Any = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    output_kind: Any = FINAL_ONLY
    detokenize: bool = True

    def clone(self) -> FakeSamplingParams:
        return dataclasses.replace(self)


@dataclasses.dataclass
class FakeCompletionOutput:
    text: str
    token_ids: list[int]
    logprobs: list[dict] | None
    finish_reason: str | None
    stop_reason: Any = None
    cumulative_logprob: float | None = None
    index: int = 0


@dataclasses.dataclass
class FakeRequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[FakeCompletionOutput]
    prompt_logprobs: Any = None
    num_cached_tokens: int | None = None
    finished: bool = True


def out(ids: list[int], finish: str, stop_reason: Any = None) -> FakeCompletionOutput:
    """A segment's output: log-prob -id/100 per token (so the merged values show where each came from)."""
    return FakeCompletionOutput(
        "".join(f"<{t}>" for t in ids),
        list(ids),
        [{t: -t / 100} for t in ids],
        finish,
        stop_reason,
        cumulative_logprob=-sum(ids) / 100,
    )


class FakeEngine:
    """The engine client: ``generate`` yields one final output per call, the next of ``script``."""

    def __init__(self, *script: FakeCompletionOutput | None, max_model_len: int = 1000) -> None:
        self.script = list(script)
        self.calls: list[tuple[dict, FakeSamplingParams, str]] = []
        self.model_config = types.SimpleNamespace(max_model_len=max_model_len)

    async def generate(self, prompt: dict, sampling_params: FakeSamplingParams, request_id: str, **kwargs: Any):
        self.calls.append((dict(prompt), sampling_params, request_id))
        output = self.script.pop(0)
        outputs = [] if output is None else [output]
        # vLLM's output carries the prompt text the engine input had (the resumed request has none)
        yield FakeRequestOutput(request_id, prompt.get("prompt"), list(prompt["prompt_token_ids"]), outputs)


class FakeTokenizer:
    eos_token_id = 0


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Counters, ledger, options and the server are process-wide: each test starts from nothing."""
    monkeypatch.setattr(vllm_resume, "_COUNTS", vllm_resume.collections.Counter())
    monkeypatch.setattr(vllm_resume, "LEDGER", vllm_resume.plan.Ledger())
    monkeypatch.setitem(vllm_resume.OPTIONS, "enabled", True)
    monkeypatch.setattr(vllm_resume.SERVER, "ref", lambda: None)
    # the text is vLLM's detokenizer's (tests/integration/vllm/test_resume_seam.py); here: the ids spelled out
    monkeypatch.setattr(
        vllm_resume, "replay", lambda tok, prompt, params, ids, stop: ("".join(f"<{t}>" for t in ids), len(ids), None)
    )


def run(engine: FakeEngine, params: FakeSamplingParams, prompt: dict | None = None, **kwargs: Any) -> Any:
    """One engine call under a resumable request's scope, drained; the outputs it yielded."""
    wrapped = vllm_resume.make_generate_wrapper(FakeEngine.generate)
    prompt = prompt if prompt is not None else {"type": "token", "prompt_token_ids": PROMPT, "prompt": "text"}

    async def go():
        token = vllm_resume._SCOPE.set(types.SimpleNamespace(tokenizer=FakeTokenizer()))
        try:
            return [o async for o in wrapped(engine, prompt, params, "chatcmpl-1", **kwargs)]
        finally:
            vllm_resume._SCOPE.reset(token)

    return asyncio.run(go())


def test_an_aborted_turn_resumes_from_its_own_tokens_and_comes_back_as_one_answer(monkeypatch):
    versions = iter([3, 4])  # the weights before the sync, then after
    monkeypatch.setattr(vllm_resume.SERVER, "version", lambda: next(versions))
    engine = FakeEngine(out([1, 2, 3], "abort"), out([4, 5], "stop", stop_reason=None))
    params = FakeSamplingParams(max_tokens=10, min_tokens=4, seed=7, prompt_logprobs=1)
    (merged,) = run(engine, params, priority=5)

    (first_prompt, first_params, _), (prompt, resumed, request_id) = engine.calls
    assert first_params is params  # the first call is the request itself, untouched
    assert prompt == {"type": "token", "prompt_token_ids": PROMPT + [1, 2, 3]}  # stale prompt text dropped
    assert (resumed.max_tokens, resumed.min_tokens) == (7, 1)  # what the turn had left
    assert resumed.seed not in (None, 7) and resumed.prompt_logprobs is None
    assert (params.max_tokens, params.seed) == (10, 7)  # the request's own params are not changed
    assert request_id == "chatcmpl-1-ngv-resume-1"

    done = merged.outputs[0]
    assert merged.request_id == "chatcmpl-1" and merged.prompt == "text"  # the request's own prompt, not the resumed
    assert merged.prompt_token_ids == PROMPT
    assert done.token_ids == [1, 2, 3, 4, 5] and done.finish_reason == "stop"
    assert done.logprobs == [{t: -t / 100} for t in [1, 2, 3, 4, 5]]  # each segment's own log-probs
    assert done.cumulative_logprob == pytest.approx(-0.15)
    assert done.text == "<1><2><3><4><5>"  # replayed over every id (the seam's text is vLLM's detokenizer's)
    segments = (Segment(3, 3), Segment(2, 4))
    assert vllm_resume.LEDGER.get(turn_key(PROMPT, [1, 2, 3, 4, 5])) == segments
    counts = vllm_resume.counters()
    assert counts["interrupted_turns"] == counts["resumes"] == counts["resumed_turns"] == 1
    assert counts["resumed_tokens"] == 3 and counts["refused_turns"] == 0


def test_a_turn_aborted_at_every_sync_keeps_every_segment(monkeypatch):
    """Aborted again before its first token (``None``: a pause that aborts the queued request, as verl's sleep after
    its abort does on GPUs), then again mid-way: every token kept once, each segment with its weight version."""
    versions = iter([1, 1, 2, 3])
    monkeypatch.setattr(vllm_resume.SERVER, "version", lambda: next(versions))
    engine = FakeEngine(out([1], "abort"), None, out([2, 3], "abort"), out([4], "length"))
    (merged,) = run(engine, FakeSamplingParams(max_tokens=4, seed=5))
    assert [c[0]["prompt_token_ids"][len(PROMPT) :] for c in engine.calls] == [[], [1], [1], [1, 2, 3]]
    assert [c[1].max_tokens for c in engine.calls] == [4, 3, 3, 1]
    assert len({c[1].seed for c in engine.calls}) == 4 and len({c[2] for c in engine.calls}) == 4
    assert merged.outputs[0].token_ids == [1, 2, 3, 4] and merged.outputs[0].finish_reason == "length"
    counts = vllm_resume.counters()
    assert (counts["interrupted_turns"], counts["resumes"], counts["resumed_tokens"]) == (1, 3, 3)
    segments = (Segment(1, 1), Segment(2, 2), Segment(1, 3))
    assert vllm_resume.LEDGER.get(turn_key(PROMPT, [1, 2, 3, 4])) == segments


def test_a_turn_aborted_before_its_first_token_is_sent_again_whole():
    engine = FakeEngine(None, out([1, 2], "stop"))
    (merged,) = run(engine, FakeSamplingParams())
    assert engine.calls[1][0]["prompt_token_ids"] == PROMPT and engine.calls[1][1].max_tokens == 10
    assert merged.request_id == "chatcmpl-1" and merged.outputs[0].token_ids == [1, 2]
    assert vllm_resume.counters()["resumed_tokens"] == 0


def test_a_turn_nothing_interrupted_is_the_engines_own_output():
    engine = FakeEngine(out([1, 2], "stop"))
    (answer,) = run(engine, FakeSamplingParams())
    assert answer.outputs[0].token_ids == [1, 2] and len(engine.calls) == 1
    assert vllm_resume.counters()["interrupted_turns"] == 0


@pytest.mark.parametrize(
    ("params", "prompt", "reason"),
    [
        (FakeSamplingParams(structured_outputs={"regex": "a+"}), None, "structured_outputs"),
        (FakeSamplingParams(presence_penalty=0.5), None, "presence_penalty"),
        (FakeSamplingParams(bad_words=["x"]), None, "bad_words"),
        (FakeSamplingParams(n=2), None, "n"),
        (FakeSamplingParams(), {"type": "multimodal", "prompt_token_ids": PROMPT, "mm_kwargs": {}}, "not_token_prompt"),
        (FakeSamplingParams(max_tokens=2), None, "budget_spent"),
        (FakeSamplingParams(stop_token_ids=[2]), None, "ended_on_stop_token"),
    ],
)
def test_a_turn_that_cannot_be_resumed_keeps_its_abort_for_the_guard(params, prompt, reason):
    """The abort guard then answers 503 and Gym regenerates the turn, as before partial rollouts."""
    engine = FakeEngine(out([1, 2], "abort"))
    (answer,) = run(engine, params, prompt)
    assert answer.outputs[0].finish_reason == "abort" and answer.outputs[0].token_ids == [1, 2]
    assert len(engine.calls) == 1
    counts = vllm_resume.counters()
    assert counts["refused_turns"] == counts[f"refused/{reason}"] == counts["interrupted_turns"] == 1


def test_a_refusal_after_a_resume_hands_the_guard_every_token_generated_so_far(monkeypatch):
    engine = FakeEngine(out([1, 2], "abort"), out([3], "abort"))
    rejecting = iter([False, True])  # the second abort takes the replica out of rotation
    monkeypatch.setattr(vllm_resume.SERVER, "rejecting", lambda: next(rejecting))
    (answer,) = run(engine, FakeSamplingParams())
    assert answer.outputs[0].finish_reason == "abort" and answer.outputs[0].token_ids == [1, 2, 3]
    assert answer.prompt_token_ids == PROMPT
    assert vllm_resume.counters()["refused/rejecting"] == 1 and vllm_resume.counters()["resumed_turns"] == 0
    assert len(vllm_resume.LEDGER) == 0


def test_partial_rollouts_off_answers_every_abort_as_before(monkeypatch):
    monkeypatch.setitem(vllm_resume.OPTIONS, "enabled", False)
    (answer,) = run(FakeEngine(out([1], "abort")), FakeSamplingParams())
    assert answer.outputs[0].finish_reason == "abort"
    assert vllm_resume.counters()["refused/disabled"] == 1


def test_the_context_clamp_holds_for_the_rest():
    engine = FakeEngine(out([1, 2], "abort"), out([3], "length"), max_model_len=len(PROMPT) + 3)
    run(engine, FakeSamplingParams(max_tokens=None))
    assert engine.calls[1][1].max_tokens == 1  # prompt + 2 kept + 1 = max_model_len
    engine = FakeEngine(out([1, 2, 3], "abort"), max_model_len=len(PROMPT) + 3)
    (answer,) = run(engine, FakeSamplingParams(max_tokens=None))
    assert answer.outputs[0].finish_reason == "abort" and vllm_resume.counters()["refused/budget_spent"] == 1


def test_a_stop_string_across_the_seam_ends_the_answer_where_vllm_would_have(monkeypatch):
    """The replay (vLLM's detokenizer over every id) finds the stop string that began before the seam: the ids end
    at the token that completed it, as vLLM ends an uninterrupted turn, and the tokens after it are counted."""
    monkeypatch.setattr(vllm_resume, "replay", lambda tok, prompt, params, ids, stop: ("<1><2>", 3, "<3"))
    engine = FakeEngine(out([1, 2], "abort"), out([3, 4, 5], "length"))
    (merged,) = run(engine, FakeSamplingParams())
    done = merged.outputs[0]
    assert done.token_ids == [1, 2, 3] and done.logprobs == [{t: -t / 100} for t in [1, 2, 3]]
    assert (done.finish_reason, done.stop_reason, done.text) == ("stop", "<3", "<1><2>")
    assert done.cumulative_logprob is None  # not the sum of the kept tokens' any more
    counts = vllm_resume.counters()
    assert (counts["seam_stop_cuts"], counts["seam_cut_tokens"]) == (1, 2)
    assert vllm_resume.LEDGER.get(turn_key(PROMPT, [1, 2, 3])) == (Segment(2, None), Segment(1, None))


def test_calls_outside_a_resumable_request_are_the_engines_own():
    """verl's token-in/token-out generate, streaming (delta output) and calls without the scope: untouched."""
    engine = FakeEngine(out([1], "abort"), out([1], "abort"))
    wrapped = vllm_resume.make_generate_wrapper(FakeEngine.generate)
    params = FakeSamplingParams()
    gen = wrapped(engine, {"prompt_token_ids": PROMPT}, params, "r1")
    assert gen.ag_code is FakeEngine.generate.__code__  # the original generator itself, no layer in between

    async def in_scope():
        token = vllm_resume._SCOPE.set(types.SimpleNamespace(tokenizer=None))
        try:
            delta = dataclasses.replace(params, output_kind=OutputKind("DELTA"))
            return wrapped(engine, {"prompt_token_ids": PROMPT}, delta, "r2")
        finally:
            vllm_resume._SCOPE.reset(token)

    assert asyncio.run(in_scope()).ag_code is FakeEngine.generate.__code__


def test_the_scope_marks_non_streaming_requests_and_wraps_their_engine_once():
    class Engine(FakeEngine):
        pass

    class Serving:
        def __init__(self, engine):
            self.engine_client = engine
            self.renderer = types.SimpleNamespace(tokenizer="tok")

        async def create_chat_completion(self, request, raw_request=None):
            return [o async for o in self.engine_client.generate({"prompt_token_ids": PROMPT}, request.params, "c")]

    Serving.create_chat_completion = vllm_resume.make_scope_wrapper(Serving.create_chat_completion)
    engine = Engine(out([1], "abort"), out([2], "stop"))
    (answer,) = asyncio.run(Serving(engine).create_chat_completion(types.SimpleNamespace(params=FakeSamplingParams())))
    assert answer.outputs[0].token_ids == [1, 2]  # resumed
    assert getattr(Engine.generate, vllm_resume.SENTINEL) is FakeEngine.generate
    vllm_resume.wrap_engine(Engine)  # idempotent
    assert getattr(Engine.generate, vllm_resume.SENTINEL) is FakeEngine.generate
    streamed = types.SimpleNamespace(params=FakeSamplingParams(), stream=True)
    engine.script = [out([1], "abort")]
    (cut,) = asyncio.run(Serving(engine).create_chat_completion(streamed))
    assert cut.outputs[0].finish_reason == "abort"  # a streaming request is never resumed


def test_install_wraps_the_serving_methods_once_and_names_a_missing_one(monkeypatch):
    import sys

    from nemo_gym_adapter.errors import SetupError

    classes = []
    for module_name, qualname in vllm_resume.SCOPE_TARGETS:
        class_name, method = qualname.split(".")
        module = types.ModuleType(module_name)

        async def create(self, request, raw_request=None):
            return None

        setattr(module, class_name, type(class_name, (), {method: create}))
        monkeypatch.setitem(sys.modules, module_name, module)
        classes.append((getattr(module, class_name), method, create))
    assert vllm_resume.install_resume() is False
    assert vllm_resume.install_resume() is True
    for cls, method, create in classes:
        assert getattr(getattr(cls, method), vllm_resume.SENTINEL) is create
    monkeypatch.setitem(sys.modules, vllm_resume.SCOPE_TARGETS[1][0], types.ModuleType("empty"))
    with pytest.raises(SetupError, match="partial rollouts: vLLM has no .*create_completion"):
        vllm_resume.install_resume()


def test_counters_are_read_from_the_server_actors_summed(monkeypatch):
    import sys

    from nemo_gym_adapter.vllm import abort as vllm_abort
    from nemo_gym_adapter.vllm import patch as vllm_patch

    run(FakeEngine(out([1, 2], "abort"), out([3], "stop")), FakeSamplingParams())
    monkeypatch.setitem(vllm_abort._COUNTS, "aborted", 2)
    monkeypatch.setitem(vllm_abort._COUNTS, "regenerated_tokens", 9)
    fake_ray = types.ModuleType("ray")
    fake_ray.get = lambda refs, timeout=None: [ref() for ref in refs]
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    actor = types.SimpleNamespace(__ray_call__=types.SimpleNamespace(remote=lambda fn: lambda: fn(object())))
    counts = vllm_patch.engine_counters({"vllm_server_0_0": actor, "vllm_server_1_0": actor})
    assert counts is not None  # both actors read this process's counts here
    assert (counts["interrupted_turns"], counts["resumed_tokens"], counts["aborted_turns"]) == (2, 4, 4)
    assert counts["regenerated_tokens"] == 18 and counts["refused_turns"] == 0
