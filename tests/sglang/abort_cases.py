"""The SGLang abort guard and the actor-side checks against SGLang 0.5.12's real serving code (run in
``.cache/sglang-venv`` by ``tests/integration/sglang/test_sglang_hook.py``; see ``tests/sglang/cases.py``).

An aborted generation: verl's own ``abort_all_requests`` (``pause_generation(mode="abort")``, what verl's async
trainers call before a weight sync) while a request runs in the engine. Stock SGLang answers 200 with
``finish_reason: "abort"`` and the cut text; patched, a 503 that Gym retries, and the retry waits in SGLang's paused
tokenizer manager until verl's ``resume_generation``. On both paths Gym calls (chat, completions).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from nemo_gym_adapter.errors import SetupError
from nemo_gym_adapter.sglang import answer as sglang_answer
from nemo_gym_adapter.sglang import patch as sglang_patch
from nemo_gym_adapter.wire.payloads import GENERATION_ABORTED
from tests.sglang.engine import Hold


def _wait(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stock", [False, True])
def test_an_aborted_generation_is_a_503_when_patched_and_a_cut_200_when_stock(servers, loop, path, stock):
    server = servers("qwen25")
    sglang_patch.unpatch() if stock else sglang_patch.apply_patch()
    before = sglang_answer.aborted_total()
    server.verl_server.set_script([Hold("Skinny weather in Paris")])
    body = (
        {"messages": [{"role": "user", "content": "Say ab."}], "max_tokens": 8}
        if path.endswith("chat/completions")
        else {"prompt": "Say ab.", "max_tokens": 8}
    )
    result: dict = {}
    request = threading.Thread(target=lambda: result.update(r=server.post(path, body)))
    request.start()
    _wait(lambda: server.scheduler.held)  # the request is running in the engine
    loop.run(server.verl_server.abort_all_requests())
    request.join(60)
    r = result["r"]
    # A retry sent while the engine is paused (Gym retries a 503 after 0.5 s) waits in SGLang's tokenizer manager
    # (``generate_request`` waits on ``is_pause_cond``) and is served once verl calls resume_generation.
    server.verl_server.set_script(["It is sunny."])
    retried: dict = {}
    retry = threading.Thread(target=lambda: retried.update(r=server.post(path, body)))
    retry.start()
    retry.join(1.0)
    assert retry.is_alive(), "a request was served while the engine was paused"
    loop.run(server.verl_server.resume_generation())
    retry.join(60)
    assert retried["r"].status_code == 200, retried["r"].text
    if stock:
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "abort"
        assert (choice.get("text") or choice["message"]["content"]).startswith("Sk")  # the cut text, as if finished
        sglang_patch.apply_patch()
    else:
        assert r.status_code == 503, r.text
        assert r.json()["message"] == sglang_answer.ABORT_MESSAGE
        assert r.json()["message"].startswith(GENERATION_ABORTED)  # what rollouts.trajectory masks as `aborted`
        assert sglang_answer.aborted_total() == before + 1


def test_a_server_without_a_tokenizer_is_refused_naming_the_verl_key():
    """verl defaults ``rollout.skip_tokenizer_init`` to True; SGLang then has no tokenizer and its chat endpoint
    answers 500 for every request (seen: ``'NoneType' object has no attribute 'apply_chat_template'``)."""
    actor = SimpleNamespace(tokenizer_manager=SimpleNamespace(tokenizer=None), config=SimpleNamespace(max_model_len=8))
    with pytest.raises(SetupError, match="actor_rollout_ref.rollout.skip_tokenizer_init=False"):
        sglang_patch._patch_inside_actor(actor)


def test_what_the_manager_reads_from_a_replica_answers(servers, patched):
    """``/v1/models`` (served name, context length: ``policy.read_model_card``), the liveness probe ``/health``, and
    the engine probe through SGLang's native ``/generate`` (``policy.probe_logprob(api="generate")``: the mean
    prompt log-prob the scheduler returned, the first token having none)."""
    from nemo_gym_adapter.wire.policy import probe_logprob, read_model_card
    from tests.sglang.engine import logprob_of

    server = servers("qwen25")
    health = server.client.get("/health")
    assert health.status_code == 200, health.text
    address = str(server.client.base_url).removeprefix("http://").rstrip("/")
    card = read_model_card({address: "sglang_server_0_0"})
    assert (card.name, card.max_model_len) == (server.model, 1024)
    ids = server.tokenizer.encode("The weather in Paris is sunny.", add_special_tokens=False)
    expected = sum(logprob_of(i, t) for i, t in enumerate(ids[1:], start=1)) / (len(ids) - 1)
    assert probe_logprob(address, server.model, ids, api="generate") == pytest.approx(expected)
    assert server.scheduler.calls[-1].input_ids == ids
