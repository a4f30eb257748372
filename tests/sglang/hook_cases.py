"""The SGLang token-ID patch against SGLang 0.5.12's real serving code (run in ``.cache/sglang-venv`` by
``tests/integration/sglang/test_sglang_hook.py``; not collected by the trainer venv's pytest: no ``test_`` prefix).

The same cases as the vLLM hooks (``tests/vllm_releases/hook_cases.py``, ``tests/unit/vllm/test_patch.py``): the unpatched
control that loses the history, the exact history on every turn of a tool conversation in three template families
(``/tokenize`` agreeing), the fields Gym reads, the budget clamp, the context-length 400, alignment and in-place-edit
400s, the ``assistant_edits`` policy, ``required_prefix_token_ids`` (also without an assistant message), a
retokenized history kept (issue 19), fast and slow prefix renders, streaming, a
generation that ends without the template's terminator, concurrency. What is real and what is scripted:
``tests/sglang/cases.py``. The abort guard's cases are in ``abort_cases.py``, the Ray case in ``ray_cases.py``.
"""

from __future__ import annotations

import pytest

from nemo_gym_adapter.sglang import hooks as sglang_hooks
from nemo_gym_adapter.sglang import patch as sglang_patch
from tests.sglang.cases import FAMILIES, MAX_MODEL_LEN, SCRIPT, Conversation, say, sglang_tools, two_turns
from tests.sglang.engine import logprob_of
from tests.support.conversations import TERMINATOR, TOOLS, expected_prompt, piecewise, plain_messages
from tests.support.hostile_ids import HOSTILE_IDS, assert_refused_on_both_routes


def test_patch_installs_on_sglang_0_5_12(patched):
    assert (patched.backend, patched.version, patched.sglang_version) == ("sglang", "0.5.12", "0.5.12")
    assert patched.hook.endswith("OpenAIServingChat._apply_jinja_template") and len(patched.hooks) == 6
    assert sglang_patch.is_patched() and sglang_patch.apply_patch().already_patched


@pytest.mark.parametrize("family", FAMILIES)
def test_unpatched_control_loses_the_token_history(servers, unpatched, family):
    conv = Conversation(servers(family)).run()
    assert all(r.get("prompt_token_ids") is None for r in conv.responses), "stock SGLang returned token ids"
    assert all(r["choices"][0].get("token_ids") is None for r in conv.responses)
    content = conv.responses[0]["choices"][0]["logprobs"]["content"]
    assert not any(e["token"].startswith("token_id:") for e in content)  # Gym's capture refuses text tokens
    assert len(conv.history_kept()) == len(SCRIPT) - 1
    assert not all(conv.history_kept()), "stock SGLang kept the history: the control shows nothing"


@pytest.mark.parametrize("family", FAMILIES)
def test_patched_prompt_is_the_exact_token_history_every_turn(servers, patched, family):
    server = servers(family)
    conv = Conversation(server).run()
    assert conv.history_kept() == [True] * (len(SCRIPT) - 1)
    tools = sglang_tools()
    for i, (prev, turn) in enumerate(zip(conv.turns, conv.turns[1:], strict=False), start=1):
        assert turn["prompt"] == expected_prompt(server.tokenizer, family, turn, prev, tools), f"turn {i}"
        assert turn["answered_prompt"] == turn["prompt"], f"turn {i}: prompt_token_ids is not the engine prompt"
        assert turn["tokens"] == turn["prompt"], f"turn {i}: /tokenize disagrees with the engine prompt"
    # SGLang's tool-call parser saw the piecewise-spelled calls; Qwen3's reasoning parser split the think block.
    assert sum(1 for m in conv.messages if m.get("tool_calls")) == 3
    if family == "qwen3":
        said = [(m.get("reasoning_content") or "").strip() for m in conv.messages if m["role"] == "assistant"]
        assert said == ["Skinny weather is fine"] * len(SCRIPT), said


@pytest.mark.parametrize("family", FAMILIES)
def test_answer_carries_what_gyms_vllm_model_reads(servers, patched, family):
    """vLLM's shape: prompt_token_ids (top), choices[0].token_ids, "token_id:N" log-prob tokens with their values."""
    server = servers(family)
    server.verl_server.set_script([say(family, "answer", 0)])
    r = server.chat([{"role": "user", "content": "Weather?"}], max_tokens=50)
    assert r.status_code == 200, r.text
    data = r.json()
    generated = server.scheduler.outputs[-1]
    choice = data["choices"][0]
    assert data["prompt_token_ids"] == server.scheduler.calls[-1].input_ids
    assert choice["token_ids"] == generated and generated[-1] == server.terminator()
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in generated]
    assert [e["logprob"] for e in content] == pytest.approx([logprob_of(i, t) for i, t in enumerate(generated)])
    assert choice["message"]["content"] == "It is sunny." and choice["finish_reason"] == "stop"
    if family == "qwen3":
        assert choice["message"]["reasoning_content"].strip() == "Skinny weather is fine"
    # Without the flags the answer is SGLang's own.
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather?"}], "logprobs": True})
    assert "prompt_token_ids" not in r.json()
    assert not r.json()["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:")


def test_requests_without_ids_are_left_to_sglang(servers, patched):
    server = servers("qwen25")
    messages = plain_messages(two_turns(server)[0])
    r = server.chat(messages, max_tokens=4)
    assert r.status_code == 200, r.text
    text = server.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert server.scheduler.calls[-1].input_ids == server.tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("fast", [True, False])
def test_fast_and_slow_prefix_renders_agree(servers, patched, monkeypatch, fast):
    server = servers("qwen25")
    messages, history = two_turns(server, tools=TOOLS)
    monkeypatch.setitem(sglang_hooks.OPTIONS, "fast_prefix", fast)
    taken: list[bool] = []
    original = sglang_hooks.prefix_render_by_segments
    monkeypatch.setattr(sglang_hooks, "prefix_render_by_segments", lambda *a: taken.append(True) or original(*a))
    r = server.chat(messages, tools=TOOLS, max_tokens=4)
    assert r.status_code == 200, r.text
    assert bool(taken) == fast
    expected = expected_prompt(
        server.tokenizer, "qwen25", {"messages": messages}, {"prompt": history, "generation": []}, sglang_tools()
    )
    assert r.json()["prompt_token_ids"] == expected


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_budget_is_clamped_where_stock_sglang_would_reject(servers, patched, field):
    server = servers("qwen25")
    messages, _ = two_turns(server, pad_words=MAX_MODEL_LEN - 250)
    stock = server.chat(plain_messages(messages), **{field: 400})  # no ids: the patch leaves it to SGLang's check
    assert stock.status_code == 400, stock.text
    assert "context length" in stock.json()["message"], stock.text  # what Gym's vllm_model matches
    r = server.chat(messages, **{field: 400})
    assert r.status_code == 200, r.text
    prompt_len = len(r.json()["prompt_token_ids"])
    assert server.scheduler.calls[-1].max_new_tokens == MAX_MODEL_LEN - prompt_len < 400


def test_overlong_spliced_history_is_a_context_length_400(servers, patched):
    server = servers("qwen25")
    tok = server.tokenizer
    text = "Skinny weather " * 150
    messages, _ = two_turns(server, content=text)
    one_by_one = [tok.convert_tokens_to_ids(tok.tokenize(c)[0]) for c in text]  # a character per token
    messages[1]["generation_token_ids"] = [*one_by_one, server.terminator()]
    assert len(server.tokenize(plain_messages(messages))) < MAX_MODEL_LEN < len(messages[1]["generation_token_ids"])
    r = server.chat(messages, max_tokens=4)
    assert r.status_code == 400, r.text
    assert f"This model's maximum context length is {MAX_MODEL_LEN} tokens" in r.json()["message"]


@pytest.mark.parametrize(
    ("ids", "fragment"),
    [
        ({"prompt_token_ids": [1, 2, 3], "generation_token_ids": [4]}, "token history does not match"),
        ({"prompt_token_ids": [1, "x"], "generation_token_ids": [4]}, "int token id"),
        ({"prompt_token_ids": [1, 2]}, "generation_token_ids"),
    ],
)
def test_alignment_errors_become_a_400_naming_the_problem(servers, patched, ids, fragment):
    server = servers("qwen25")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", **ids}]
    r = server.chat([*messages, {"role": "user", "content": "x"}], max_tokens=4)
    assert r.status_code == 400, r.text
    assert "nemo-gym-verl token splice" in r.text and fragment in r.text
    tokenized = server.post("/tokenize", {"messages": [*messages, {"role": "user", "content": "x"}]})
    assert tokenized.status_code == 400 and fragment in tokenized.text  # /tokenize refuses the same way


@pytest.mark.parametrize("family", FAMILIES)
def test_history_edited_in_place_is_a_400_naming_the_message(servers, patched, family):
    server = servers(family)
    messages, _ = two_turns(server)
    assert server.chat(messages, max_tokens=4).status_code == 200
    edited = [{**messages[0], "content": "What is the weather in Rome? "}, *messages[1:]]
    r = server.chat(edited, max_tokens=4)
    assert r.status_code == 400, r.text
    assert "messages[0] (user) differs" in r.text and "Rome" in r.text


@pytest.mark.parametrize("policy", ["keep_ids", "refuse"])
def test_assistant_edited_with_its_ids_kept_follows_the_policy(servers, patched, policy):
    server = servers("qwen25")
    sglang_patch.apply_patch(policy)
    messages, history = two_turns(server)
    unedited = server.chat(messages, max_tokens=4)
    assert unedited.status_code == 200, unedited.text
    edited = [messages[0], {**messages[1], "content": "Rainy weather in Paris"}, messages[2]]
    r = server.chat(edited, max_tokens=4)
    if policy == "keep_ids":
        assert r.status_code == 200, r.text
        assert r.json()["prompt_token_ids"] == unedited.json()["prompt_token_ids"]
        assert r.json()["prompt_token_ids"][: len(history)] == history
    else:
        assert r.status_code == 400, r.text
        assert "messages[1].content is not what" in r.text


def test_required_prefix_token_ids_is_honoured_and_checked(servers, patched):
    server = servers("qwen25")
    messages, history = two_turns(server)
    expected = server.chat(messages, max_tokens=4).json()["prompt_token_ids"]
    assert expected[: len(history)] == history
    r = server.chat(plain_messages(messages), max_tokens=4, required_prefix_token_ids=history)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == expected
    r = server.chat(messages, max_tokens=4, required_prefix_token_ids=[history[0] + 1, *history[1:]])
    assert r.status_code == 400 and "required_prefix_token_ids" in r.text, r.text


def test_required_prefix_without_an_assistant_message(servers, patched):
    """Issue 19 on SGLang (the shared ``tokens.anchor``/``tokens.required_prefix`` math): NeMo RL's merged-tokens case,
    a user-only conversation and a required prefix that ends inside the user message, spelling ' Skinny' in two tokens
    where the template writes one; an edited word is refused."""
    server = servers("qwen25")
    tok = server.tokenizer
    messages = [{"role": "user", "content": " Skinny"}]
    r = server.chat(messages, max_tokens=2)
    assert r.status_code == 200, r.text
    full = r.json()["prompt_token_ids"]
    (one,) = tok.encode(" Skinny", add_special_tokens=False)
    two = tok.encode(" S", add_special_tokens=False) + tok.encode("kinny", add_special_tokens=False)
    assert len(two) == 2 and tok.decode(two) == " Skinny"
    at = full.index(one)
    prefix = full[:at] + two
    expected = prefix + full[at + 1 :]
    r = server.chat(messages, max_tokens=2, required_prefix_token_ids=prefix)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == expected
    assert server.scheduler.calls[-1].input_ids == expected, "the engine was not given the spliced prompt"
    bad = full[:at] + tok.encode(" Slim", add_special_tokens=False)
    r = server.chat(messages, max_tokens=2, required_prefix_token_ids=bad)
    assert r.status_code == 400 and "required_prefix_token_ids" in r.text, r.text


def test_retokenized_history_is_kept_and_an_edit_refused(servers, patched):
    """Issue 19 on SGLang (``tokens.same_text``): a user message the history spells in other tokens than the render
    (the same text) keeps the model's ids; the same message edited is still a 400."""
    server = servers("qwen25")
    tok = server.tokenizer
    messages, history = two_turns(server)
    prompt = messages[1]["prompt_token_ids"]
    (weather,) = tok.encode(" weather", add_special_tokens=False)
    at = prompt.index(weather)
    split = tok.encode(" we", add_special_tokens=False) + tok.encode("ather", add_special_tokens=False)
    assert len(split) >= 2 and tok.decode(split) == " weather"
    respelled = prompt[:at] + split + prompt[at + 1 :]
    retokenized = [dict(m) for m in messages]
    retokenized[1]["prompt_token_ids"] = respelled
    r = server.chat(retokenized, max_tokens=4)
    assert r.status_code == 200, r.text
    kept = respelled + messages[1]["generation_token_ids"]
    assert r.json()["prompt_token_ids"][: len(kept)] == kept
    edited = [dict(m) for m in retokenized]
    edited[0]["content"] = edited[0]["content"].replace("weather", "climate")
    r = server.chat(edited, max_tokens=4)
    assert r.status_code == 400 and "messages[0]" in r.text, r.text


def test_streaming_request_gets_the_same_spliced_prompt(servers, patched):
    """Gym never streams; a streaming request is spliced all the same (its chunks carry no id fields)."""
    server = servers("qwen25")
    messages, history = two_turns(server, tools=TOOLS)
    plain_answer = server.chat(messages, tools=TOOLS, max_tokens=4)
    assert plain_answer.status_code == 200, plain_answer.text
    r = server.chat(messages, tools=TOOLS, max_tokens=4, stream=True)
    assert r.status_code == 200, r.text
    assert "data: [DONE]" in r.text
    assert server.scheduler.calls[-1].input_ids == plain_answer.json()["prompt_token_ids"]
    assert plain_answer.json()["prompt_token_ids"][: len(history)] == history


def test_request_chat_template_kwargs_reach_the_prefix_render(servers, patched):
    server = servers("qwen3")
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    first = [{"role": "user", "content": "What is the weather?"}]
    prompt = server.tokenize(first, **kwargs)
    assert server.tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")
    generation = piecewise(server.tokenizer, "Skinny weather") + [server.terminator()]
    answer = {"role": "assistant", "content": "Skinny weather", "prompt_token_ids": prompt}
    messages = [*first, {**answer, "generation_token_ids": generation}, {"role": "user", "content": "And Oslo?"}]
    r = server.chat(messages, max_tokens=4, **kwargs)
    assert r.status_code == 200, r.text
    ids = r.json()["prompt_token_ids"]
    assert ids[: len(prompt) + len(generation)] == prompt + generation
    assert server.tokenizer.decode(ids[len(prompt) + len(generation) :]).endswith("<think>\n\n</think>\n\n")


def test_named_conversation_templates_bypass_the_hook_so_ids_on_them_are_a_400(servers, patched, monkeypatch):
    server = servers("qwen25")
    monkeypatch.setattr(type(server.verl_server.template_manager), "chat_template_name", property(lambda s: "chatml"))
    messages, _ = two_turns(server)
    r = server.chat(messages, max_tokens=4)
    assert r.status_code == 400, r.text
    assert "conversation template 'chatml'" in r.text


@pytest.mark.parametrize("ending", ["other_stop", "length"])
def test_a_generation_not_ending_in_the_templates_terminator_is_spliced_as_generated(servers, patched, ending):
    """Qwen2.5 may stop at ``<|endoftext|>`` (generation_config EOS; the template writes ``<|im_end|>``), or be cut by
    ``max_tokens`` (no stop id: the template's terminator is inserted). Both come from SGLang's own stop handling."""
    server = servers("qwen25")
    tok = server.tokenizer
    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")
    server.verl_server.set_script([[*piecewise(tok, "Skinny weather in Paris"), endoftext]])
    first = [{"role": "user", "content": "What is the weather?"}]
    r = server.chat(first, max_tokens=50 if ending == "other_stop" else 3)
    assert r.status_code == 200, r.text
    data = r.json()
    prompt, generation = data["prompt_token_ids"], data["choices"][0]["token_ids"]
    assert data["choices"][0]["finish_reason"] == ("stop" if ending == "other_stop" else "length")
    assert (generation[-1] == endoftext) == (ending == "other_stop")
    answer = {"role": "assistant", "content": data["choices"][0]["message"]["content"] or ""}
    messages = [*first, {**answer, "prompt_token_ids": prompt, "generation_token_ids": generation}]
    messages.append({"role": "user", "content": "And Oslo?"})
    r = server.chat(messages, max_tokens=4)
    assert r.status_code == 200, r.text
    spliced = server.scheduler.calls[-1].input_ids
    assert spliced[: len(prompt) + len(generation)] == prompt + generation
    previous = {"prompt": prompt, "generation": generation}
    assert spliced == expected_prompt(tok, "qwen25", {"messages": messages}, previous, sglang_tools())
    im_end = tok.convert_tokens_to_ids(TERMINATOR["qwen25"])
    assert (spliced[len(prompt) + len(generation)] == im_end) == (ending == "length")


def test_concurrent_requests_each_get_their_own_history(servers, patched):
    """The per-request state (raw-body ids, the render's result) lives in a ContextVar: concurrent requests on the
    server's one event loop never see each other's ids."""
    from concurrent.futures import ThreadPoolExecutor

    server = servers("qwen25")
    cases = [two_turns(server, content=f"Skinny weather number {i} in Paris") for i in range(12)]
    server.verl_server.set_script(["It is sunny."] * len(cases))
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda case: server.chat(case[0], max_tokens=4), cases))
    for (_, history), r in zip(cases, answers, strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["prompt_token_ids"][: len(history)] == history
    engine_prompts = sorted(tuple(c.input_ids) for c in server.scheduler.calls[-len(cases) :])
    assert engine_prompts == sorted(tuple(r.json()["prompt_token_ids"]) for r in answers)


# ----------------------------------------------------------------------------- issue 27: hostile ids, access


@pytest.mark.parametrize(("where", "bad", "fragment"), HOSTILE_IDS)
def test_hostile_ids_are_one_400_on_chat_and_tokenize_alike(servers, patched, where, bad, fragment):
    """The vLLM hook's id check, shared (``tokens.anchor``): chat and ``/tokenize`` answer the same 400 naming the
    message, field and element, and the scheduler never sees the request (issue 27)."""
    server = servers("qwen25")
    calls = len(server.scheduler.calls)
    assert_refused_on_both_routes(server.post, where, bad, fragment)
    assert len(server.scheduler.calls) == calls  # nothing reached the engine


def test_the_access_guard_refuses_every_route_of_sglangs_app_without_the_key(servers, patched):
    """The guard on SGLang 0.5.12's real app served by verl's server: every route answers 401 without the run's key
    (SGLang's own ``--api-key`` leaves ``/health*`` and ``/metrics`` open), the scheduler sees nothing; with the key
    the routes answer; removed, the app is open again (the control)."""
    from sglang.srt.entrypoints.http_server import app

    from nemo_gym_adapter.access import guard

    server = servers("qwen25")
    paths = sorted({r.path for r in app.routes if hasattr(r, "path")})
    assert {"/health", "/tokenize", "/v1/chat/completions", "/generate", "/update_weights_from_tensor"} <= set(paths)
    calls = len(server.scheduler.calls)
    guard.install_guard(["the-run-key"])
    try:
        opened = {
            p: s for p in paths if (s := server.client.post(p.replace("{", "x").replace("}", "")).status_code) != 401
        }
        assert not opened, opened
        assert server.client.get("/health", headers={"Authorization": "Bearer other"}).status_code == 401
        assert len(server.scheduler.calls) == calls
        assert server.client.get("/health", headers={"Authorization": "Bearer the-run-key"}).status_code == 200
    finally:
        guard.remove_guard()
    assert server.client.get("/health").status_code == 200  # the control
