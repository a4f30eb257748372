"""The vLLM hook against a vLLM release's real classes, the engine stubbed (run in that release's venv by
tests/integration/vllm/test_vllm_releases.py, one venv per ``stubbed`` release of scripts/vllm_versions.txt:
0.24.0, verl 0.9.1's GPU pin, whose hook is ``OpenAIServingRender.preprocess_chat``, then 0.33.0 and 0.34.0, the newest
GPU releases, whose hook is ``OnlineRenderer.preprocess_chat``). ``NGV_VLLM_RELEASE`` names the release the venv must hold.

Not collected by the trainer venv's pytest (the file name has no ``test_`` prefix; it needs that release). Real: the
release's FastAPI app (``build_app`` + ``init_app_state``, as ``vllm serve`` wires it), ``OpenAIServingChat``, the
hooked render class (``nemo_gym_adapter.vllm.hooks.hook_target_for`` of the release), ``ServingTokenization``,
``HfRenderer``, the hermes / llama3_json tool parsers, vLLM's error handlers (HTTP 400), and our
``vllm_patch.apply_patch``. Stubbed: the engine only (``ScriptedEngine``: records the prompt and sampling params it is
given and "generates" scripted text, spelled the way a model may spell it, not the way the template encodes it) and
the platform (``CpuPlatform``: the GPU wheel finds no device here, and rendering never touches one). Requests go
through ``httpx.ASGITransport``, no socket.

The cases are those the 0.31 hook passes (tests/unit/vllm/test_patch.py, tests/integration/vllm/test_patch_ray.py):
the unpatched control, the exact history on every turn of a tool-call conversation for three template families,
``/tokenize`` and ``/v1/chat/completions/render`` agreeing, the output-budget clamp, vLLM's context-length 400,
alignment and in-place-edit 400s, the ``assistant_edits`` policy, ``required_prefix_token_ids``, fast and slow
prefix renders; the abort guard (``vllm_abort``) on both paths Gym calls, with the stock control. Issue 19's
request classes (tests/unit/vllm/test_request_limits.py, tests/integration/vllm/test_server.py on 0.31):
``required_prefix_token_ids`` without an assistant message, the budget clamped on turn 1 and on ``/v1/completions``,
``top_logprobs: null`` refused, NeMo RL's token fields on the message; the stock release's answers to the same
requests as the control.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nemo_gym_adapter.vllm import hooks as vllm_hooks
from nemo_gym_adapter.vllm import patch as vllm_patch
from tests.support.conversations import TERMINATOR, TOOLS, expected_prompt, follow_up, piecewise, plain_messages
from tests.support.hostile_ids import HOSTILE_IDS, assert_refused_on_both_routes
from tests.support.vllm_releases import null_top_logprobs_is_zero, stock_clamps_budget

MAX_MODEL_LEN = 1024
FAMILIES = ["qwen25", "qwen3", "llama3"]
TOOL_PARSER = {"qwen25": "hermes", "qwen3": "hermes", "llama3": "llama3_json"}
# Where each release renders chat prompts, written out (not derived from HOOK_TARGETS, which the first case checks).
EXPECTED_HOOK = {
    "0.24.0": "vllm.entrypoints.serve.render.serving.OpenAIServingRender.preprocess_chat",
    "0.33.0": "vllm.renderers.online_renderer.OnlineRenderer.preprocess_chat",
    "0.34.0": "vllm.renderers.online_renderer.OnlineRenderer.preprocess_chat",
}
RELEASE = os.environ.get("NGV_VLLM_RELEASE", "")  # the release this venv must hold (set by the runner)
STOCK_CLAMPS_BUDGET = bool(RELEASE) and stock_clamps_budget(RELEASE)
NULL_TOP_LOGPROBS_IS_ZERO = bool(RELEASE) and null_top_logprobs_is_zero(RELEASE)
# What the scripted model "says": compact JSON (the templates re-render it with spaces), Qwen3 thinks first.
CALL = {
    "chatml": '<tool_call>\n{"name":"get_weather","arguments":{"city":"%s"}}\n</tool_call>',
    "llama3": '{"name":"get_weather","parameters":{"city":"%s"}}',
}
THINK = "<think>\nSkinny weather is fine\n</think>\n\n"
SCRIPT = [("call", "tool"), ("call", "tool"), ("answer", "user"), ("call", "tool"), ("answer", None)]


def _model_dir(family: str) -> Path:
    root = Path(os.environ.get("NGV_TINY_MODELS") or Path(__file__).resolve().parents[2] / ".cache" / "tiny-models")
    path = root / family
    if not (path / "config.json").exists():
        pytest.fail(f"tiny model {family} missing at {path}: run scripts/setup.sh (it builds the tiny models)")
    return path


# ------------------------------------------------------------------------------------------- the one stub


@dataclass
class ScriptedEngine:
    """vLLM's EngineClient as far as the OpenAI serving layer uses it; ``generate`` answers with scripted text."""

    vllm_config: Any
    renderer: Any
    family: str
    script: list[str] = field(default_factory=list)
    calls: list[tuple[dict, Any]] = field(default_factory=list)
    input_processor: Any = None
    errored: bool = False
    finish_reason: str = "stop"  # "abort": the request ends as vLLM's pause_generation(mode="abort") ends it
    dead_error: Exception = field(default_factory=lambda: RuntimeError("engine dead"))
    # Pauses: the next call is cut after this many tokens with finish "abort"; the call after it (the resumed
    # request, whose prompt then ends with those tokens) generates the rest of the same answer.
    aborts: list[int] = field(default_factory=list)
    rest: list[int] | None = None

    @property
    def model_config(self) -> Any:
        return self.vllm_config.model_config

    async def is_tracing_enabled(self) -> bool:
        return False

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        """0.33+: queue limits checked before a response starts; an engine without admission control admits all."""

    async def generate(self, prompt: dict, sampling_params: Any, request_id: str, **_: Any):
        from vllm.outputs import CompletionOutput, RequestOutput

        self.calls.append((dict(prompt), sampling_params))
        tok = self.renderer.tokenizer
        finish = self.finish_reason
        if self.rest is not None:
            ids, self.rest = self.rest, None
            text = tok.decode(ids)
        else:
            text = self.script.pop(0) if self.script else "Skinny"
            ids = piecewise(tok, text) + [tok.convert_tokens_to_ids(TERMINATOR[self.family])]
        ids = ids[: sampling_params.max_tokens]
        if self.aborts:
            cut = self.aborts.pop(0)
            ids, self.rest, finish = ids[:cut], ids[cut:], "abort"
            text = tok.decode(ids)
        logprobs = None
        if sampling_params.logprobs is not None:  # the sampled token's log-prob only (top_logprobs: 0)
            from vllm.logprobs import Logprob

            logprobs = [{t: Logprob(-0.25 - i / 8, 1, tok.decode([t]))} for i, t in enumerate(ids)]
        out = CompletionOutput(0, text, ids, None, logprobs, finish_reason=finish)
        yield RequestOutput(request_id, None, list(prompt["prompt_token_ids"]), None, [out], finished=True)


@dataclass
class Server:
    family: str
    app: Any
    engine: ScriptedEngine
    tokenizer: Any
    run: Callable[[Any], Any]

    @property
    def model(self) -> str:
        return f"tiny-{self.family}"

    def post(self, path: str, body: dict) -> Any:
        import httpx

        async def go():
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://vllm-release") as client:
                return await client.post(path, json={"model": self.model, **body})

        return self.run(go())

    def chat(self, messages: list[dict], **body: Any) -> Any:
        return self.post("/v1/chat/completions", {"messages": messages, "return_token_ids": True, **body})

    def tokenize(self, messages: list[dict], **body: Any) -> list[int]:
        r = self.post("/tokenize", {"messages": messages, **body})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]


@pytest.fixture(scope="session")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def vllm_release():
    """The release's modules, the platform set to CPU (the GPU wheel detects none here), the patch not yet applied."""
    import vllm
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    assert vllm.__version__ == RELEASE, f"this venv has vLLM {vllm.__version__}, not NGV_VLLM_RELEASE={RELEASE!r}"
    assert RELEASE in EXPECTED_HOOK, f"vLLM {RELEASE}: write its hook into EXPECTED_HOOK after reading its code"
    vllm.platforms._current_platform = CpuPlatform()  # what resolving it finds on a CPU build of vLLM
    return vllm


def hook_class() -> type:
    """The class the release's hook lives on (``OpenAIServingRender`` on 0.20-0.24, ``OnlineRenderer`` on 0.25+)."""
    import importlib

    import vllm

    target = vllm_hooks.hook_target_for(vllm.__version__)
    return getattr(importlib.import_module(target.module), target.qualname.split(".")[0])


def hook_instance(server: Server) -> Any:
    """The app's instance of :func:`hook_class` (``app.state.openai_serving_render`` on 0.24,
    ``app.state.online_renderer`` on 0.25+): found by type, not by name."""
    cls = hook_class()
    found = [v for v in vars(server.app.state)["_state"].values() if isinstance(v, cls)]
    assert len(found) == 1, f"{len(found)} {cls.__name__} instances on the app's state"
    return found[0]


def app_parts() -> tuple[Any, Any, Any, Any]:
    """vLLM's ``make_arg_parser``, ``validate_parsed_serve_args``, ``build_app``, ``init_app_state``: where the
    release keeps them (they moved: ``entrypoints.openai`` up to 0.24, ``entrypoints.launchers`` from 0.25, the
    argument parser in ``entrypoints.common`` from 0.33)."""
    import importlib

    def first(*names: str) -> Any:
        for name in names:
            module, _, attr = name.rpartition(".")
            try:
                return getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError):
                continue
        raise ImportError(f"none of {names} in vLLM {RELEASE}")

    return (
        first(*(f"vllm.entrypoints.{m}.cli_args.make_arg_parser" for m in ("common", "launchers", "openai"))),
        first(
            *(f"vllm.entrypoints.{m}.cli_args.validate_parsed_serve_args" for m in ("common", "launchers", "openai"))
        ),
        first("vllm.entrypoints.launchers.app.build_app", "vllm.entrypoints.openai.api_server.build_app"),
        first(
            "vllm.entrypoints.launchers.api_server.app_state.init_app_state",
            "vllm.entrypoints.openai.api_server.init_app_state",
        ),
    )


def render_only_config(make: Callable[[], Any]) -> Any:
    """``make()`` (a ``VllmConfig``). From 0.34 ``CpuPlatform.check_and_update_config`` refuses an x86 CPU without
    triton-cpu ("vLLM on x86 CPUs requires Triton"), which its model runner needs; nothing here runs a model. Only
    then is the config made again with vLLM's ``HAS_TRITON`` read as true for that one call (the check is the first
    thing it does), so the releases that merely warn keep their own path."""
    try:
        return make()
    except RuntimeError as e:
        if "requires Triton" not in str(e):
            raise
    import vllm.triton_utils as triton_utils

    saved = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        return make()
    finally:
        triton_utils.HAS_TRITON = saved


def build_server(family: str, tool_parser: str, loop: Any) -> Server:
    """The release's real OpenAI app for the tiny ``family`` model, with ``tool_parser``, over a ScriptedEngine."""
    from transformers import AutoTokenizer
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.renderers import renderer_from_config
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser, validate_parsed_serve_args, build_app, init_app_state = app_parts()
    path = str(_model_dir(family))
    argv = ["--model", path, "--served-model-name", f"tiny-{family}", "--max-model-len", str(MAX_MODEL_LEN)]
    argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
    parser = make_arg_parser(FlexibleArgumentParser())
    if any("--enable-scale-out" in action.option_strings for action in parser._actions):
        argv.append("--enable-scale-out")  # 0.33+ serves /v1/chat/completions/render only with it (403 otherwise)
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    config = render_only_config(
        lambda: VllmConfig(model_config=AsyncEngineArgs.from_cli_args(args).create_model_config())
    )
    engine = ScriptedEngine(config, renderer_from_config(config), family)
    app = build_app(args, ("generate",), config.model_config)
    loop.run_until_complete(init_app_state(engine, app.state, args, ("generate",)))
    return Server(family, app, engine, AutoTokenizer.from_pretrained(path), loop.run_until_complete)


@pytest.fixture(scope="session")
def servers(vllm_release, loop) -> Callable[[str], Server]:
    """Factory: ``servers(family)`` -> the release's real OpenAI app over a ScriptedEngine (built once per family)."""
    built: dict[str, Server] = {}

    def get(family: str) -> Server:
        if family not in built:
            built[family] = build_server(family, TOOL_PARSER[family], loop)
        return built[family]

    return get


@pytest.fixture
def patched(vllm_release, monkeypatch):
    """The patch installed (once per process, as in a server), the policy reset to the default for every test."""
    report = vllm_patch.apply_patch()
    monkeypatch.setitem(vllm_hooks.OPTIONS, "assistant_edits", "keep_ids")
    return report


@pytest.fixture
def unpatched(vllm_release, monkeypatch):
    """The stock release for the duration of a test (the original methods back in place if the patch is installed)."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

    from nemo_gym_adapter.vllm.abort import GUARD_SENTINEL

    cls = hook_class()
    for name in ("preprocess_chat", "preprocess_completion"):
        current = getattr(cls, name)
        monkeypatch.setattr(cls, name, getattr(current, vllm_hooks.SENTINEL, current))
    current = OpenAIServingChat.chat_completion_full_generator
    monkeypatch.setattr(OpenAIServingChat, "chat_completion_full_generator", getattr(current, GUARD_SENTINEL, current))


# -------------------------------------------------------------------------------------- the conversation


def _say(family: str, kind: str, seed: int) -> str:
    city = ["Paris", "Oslo", "Skinny"][seed % 3]
    body = CALL["llama3" if family == "llama3" else "chatml"] % city if kind == "call" else "It is sunny."
    return THINK + body if family == "qwen3" else body


class Conversation:
    """A Gym-shaped conversation through the app: ids on every assistant message, tools, /tokenize per turn."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.messages: list[dict] = [
            {"role": "system", "content": "You are a weather bot. Be brief."},
            {"role": "user", "content": "What is the weather in Paris? Skinny answers please."},
        ]
        self.turns: list[dict] = []

    def run(self) -> Conversation:
        s = self.server
        s.engine.script = [_say(s.family, kind, seed) for seed, (kind, _) in enumerate(SCRIPT)]
        for seed, (_, then) in enumerate(SCRIPT):
            sent = json.loads(json.dumps(self.messages))
            r = s.chat(self.messages, tools=TOOLS, tool_choice="auto", max_tokens=200, seed=seed)
            assert r.status_code == 200, r.text
            data = r.json()
            choice = data["choices"][0]
            engine_prompt = s.engine.calls[-1][0]["prompt_token_ids"]
            assert data["prompt_token_ids"] == engine_prompt  # return_token_ids reports what the engine got
            rendered = s.post("/v1/chat/completions/render", {"messages": sent, "tools": TOOLS, "max_tokens": 200})
            assert rendered.status_code == 200, rendered.text
            self.turns.append(
                {
                    "messages": sent,
                    "prompt": engine_prompt,
                    "generation": choice["token_ids"],
                    "tokens": s.tokenize(sent, tools=TOOLS),
                    "render": rendered.json()["token_ids"],
                }
            )
            message = choice["message"]
            answer = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                answer["tool_calls"] = [
                    {"id": c["id"] or f"call_{seed}", "type": "function", "function": c["function"]}
                    for c in message["tool_calls"]
                ]
            answer.update(prompt_token_ids=engine_prompt, generation_token_ids=choice["token_ids"])
            self.messages.append(answer)
            if then:  # None: the conversation ends here
                self.messages.append(follow_up(then, answer))
        return self

    def history_kept(self) -> list[bool]:
        return [
            cur["prompt"][: len(prev["prompt"]) + len(prev["generation"])] == prev["prompt"] + prev["generation"]
            for prev, cur in zip(self.turns, self.turns[1:], strict=False)
        ]


def _two_turns(
    server: Server, content: str = "Skinny weather in Paris", pad_words: int = 0, tools: list | None = None
) -> tuple[list, list]:
    """[user, assistant with ids (piecewise, as a model may spell it), user] and the model's history ids."""
    tok = server.tokenizer
    first = [{"role": "user", "content": "What is the weather? " + "weather " * pad_words}]
    prompt = server.tokenize(first, **({"tools": tools} if tools else {}))
    generation = piecewise(tok, content) + [tok.convert_tokens_to_ids(TERMINATOR[server.family])]
    assistant = {
        "role": "assistant",
        "content": content,
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
    }
    return [*first, assistant, {"role": "user", "content": "And Oslo?"}], prompt + generation


# ------------------------------------------------------------------------------------------------ the cases


def test_patch_installs_on_the_releases_render_hook(patched):
    assert (patched.vllm_version, patched.hook) == (RELEASE, EXPECTED_HOOK[RELEASE])
    assert getattr(hook_class().preprocess_chat, vllm_hooks.SENTINEL, None) is not None
    assert vllm_patch.is_patched() and vllm_patch.apply_patch().already_patched


@pytest.mark.parametrize("family", FAMILIES)
def test_unpatched_control_loses_the_token_history(servers, unpatched, family):
    conv = Conversation(servers(family)).run()
    assert len(conv.history_kept()) == len(SCRIPT) - 1
    assert not all(conv.history_kept()), "stock vLLM kept the history: the control shows nothing"


@pytest.mark.parametrize("family", FAMILIES)
def test_patched_prompt_is_the_exact_token_history_every_turn(servers, patched, family):
    server = servers(family)
    conv = Conversation(server).run()
    assert conv.history_kept() == [True] * (len(SCRIPT) - 1)
    for i, (prev, turn) in enumerate(zip(conv.turns, conv.turns[1:], strict=False), start=1):
        assert turn["prompt"] == expected_prompt(server.tokenizer, family, turn, prev), f"turn {i}"
        assert turn["tokens"] == turn["prompt"], f"turn {i}: /tokenize disagrees with the engine prompt"
        assert turn["render"] == turn["prompt"], f"turn {i}: /v1/chat/completions/render disagrees"
    assert sum(1 for m in conv.messages if m.get("tool_calls")) == 3  # vLLM's tool parser saw the scripted calls


def test_requests_without_ids_are_left_to_vllm(servers, patched):
    server = servers("qwen25")
    messages = plain_messages(_two_turns(server)[0])
    r = server.chat(messages, max_tokens=4)
    assert r.status_code == 200, r.text
    text = server.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert r.json()["prompt_token_ids"] == server.tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("fast", [True, False])
def test_fast_and_slow_prefix_renders_agree(servers, patched, monkeypatch, fast):
    """The fast path calls vLLM's renderer directly (``render_messages_async``, ``build_chat_params``): on the release it
    must be taken (not silently fall back), and the slow path (the hook again, ``parser=None``) must agree."""
    server = servers("qwen25")
    messages, history = _two_turns(server, tools=TOOLS)
    taken: list[bool] = []
    original = vllm_hooks.fast_prefix_ids

    async def spy(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs) if fast else None
        taken.append(result is not None)
        return result

    monkeypatch.setattr(vllm_hooks, "fast_prefix_ids", spy)
    r = server.chat(messages, tools=TOOLS, max_tokens=4)
    assert r.status_code == 200, r.text
    assert taken == [fast]
    turn = {"messages": messages}
    prev = {"prompt": history, "generation": []}
    assert r.json()["prompt_token_ids"] == expected_prompt(server.tokenizer, "qwen25", turn, prev)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_budget_is_clamped_where_stock_vllm_would_reject(servers, patched, monkeypatch, field):
    """A prompt that fits with a budget that does not: up to 0.31 stock vLLM answers 400 (the patch clamps instead);
    from 0.32 vLLM no longer holds the budget back from the prompt's room and clamps it itself (``get_max_tokens``),
    to what the patch clamps it to -- the control asserts whichever the release does."""
    server = servers("qwen25")
    messages, _ = _two_turns(server, pad_words=MAX_MODEL_LEN - 250)
    with monkeypatch.context() as m:
        cls = hook_class()
        m.setattr(cls, "preprocess_chat", cls.preprocess_chat.__ngv_original__)
        stock = server.chat(plain_messages(messages), **{field: 400})
    if STOCK_CLAMPS_BUDGET:
        assert stock.status_code == 200, stock.text
        stock_len = len(stock.json()["prompt_token_ids"])
        assert server.engine.calls[-1][1].max_tokens == MAX_MODEL_LEN - stock_len < 400
    else:
        assert stock.status_code == 400, stock.text
    r = server.chat(messages, **{field: 400})
    assert r.status_code == 200, r.text
    prompt_len = len(r.json()["prompt_token_ids"])
    assert server.engine.calls[-1][1].max_tokens == MAX_MODEL_LEN - prompt_len < 400


def test_overlong_spliced_history_is_vllms_context_length_400(servers, patched):
    server = servers("qwen25")
    tok = server.tokenizer
    text = "Skinny weather " * 150  # ~300 tokens rendered, one token per character "generated"
    messages, _ = _two_turns(server, content=text)
    messages[1]["generation_token_ids"] = [tok.convert_tokens_to_ids(tok.tokenize(c)[0]) for c in text] + [
        tok.convert_tokens_to_ids(TERMINATOR["qwen25"])
    ]
    messages[1]["prompt_token_ids"] = server.tokenize(messages[:1])
    assert len(server.tokenize(plain_messages(messages))) < MAX_MODEL_LEN < len(messages[1]["generation_token_ids"])
    r = server.chat(messages, max_tokens=4)
    assert r.status_code == 400, r.text
    assert f"This model's maximum context length is {MAX_MODEL_LEN} tokens" in r.json()["error"]["message"]


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


@pytest.mark.parametrize("family", FAMILIES)
def test_history_edited_in_place_is_a_400_naming_the_message(servers, patched, family):
    server = servers(family)
    messages, _ = _two_turns(server)
    assert server.chat(messages, max_tokens=4).status_code == 200
    edited = [{**messages[0], "content": "What is the weather in Rome? "}, *messages[1:]]
    r = server.chat(edited, max_tokens=4)
    assert r.status_code == 400, r.text
    assert "messages[0] (user) differs" in r.text and "Rome" in r.text


@pytest.mark.parametrize("policy", ["keep_ids", "refuse"])
def test_assistant_edited_with_its_ids_kept_follows_the_policy(servers, patched, policy):
    server = servers("qwen25")
    vllm_patch.apply_patch(policy)
    messages, history = _two_turns(server)
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
    messages, history = _two_turns(server)
    expected = server.chat(messages, max_tokens=4).json()["prompt_token_ids"]
    assert expected[: len(history)] == history
    # Gym's prefix supply without ids on the messages: the required prefix is the model prefix.
    r = server.chat(plain_messages(messages), max_tokens=4, required_prefix_token_ids=history)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == expected
    r = server.chat(messages, max_tokens=4, required_prefix_token_ids=[history[0] + 1, *history[1:]])
    assert r.status_code == 400 and "required_prefix_token_ids" in r.text, r.text


def test_streaming_request_gets_the_same_spliced_prompt(servers, patched):
    server = servers("qwen25")
    messages, history = _two_turns(server, tools=TOOLS)
    plain = server.chat(messages, tools=TOOLS, max_tokens=4)
    assert plain.status_code == 200, plain.text
    r = server.chat(messages, tools=TOOLS, max_tokens=4, stream=True)
    assert r.status_code == 200, r.text
    assert "data: [DONE]" in r.text
    assert server.engine.calls[-1][0]["prompt_token_ids"] == plain.json()["prompt_token_ids"]
    assert plain.json()["prompt_token_ids"][: len(history)] == history


def test_request_chat_template_kwargs_reach_the_prefix_render(servers, patched):
    """Qwen3 with ``enable_thinking: false`` (a request-level template kwarg): the generation prompt the model saw
    ends with an empty think block; the next turn's prompt keeps the model's ids and renders the tail the same way."""
    server = servers("qwen3")
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    first = [{"role": "user", "content": "What is the weather?"}]
    prompt = server.tokenize(first, **kwargs)
    assert server.tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")
    generation = piecewise(server.tokenizer, "Skinny weather") + [server.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    answer = {"role": "assistant", "content": "Skinny weather", "prompt_token_ids": prompt}
    messages = [*first, {**answer, "generation_token_ids": generation}, {"role": "user", "content": "And Oslo?"}]
    r = server.chat(messages, max_tokens=4, **kwargs)
    assert r.status_code == 200, r.text
    ids = r.json()["prompt_token_ids"]
    assert ids[: len(prompt) + len(generation)] == prompt + generation
    assert server.tokenizer.decode(ids[len(prompt) + len(generation) :]).endswith("<think>\n\n</think>\n\n")


def test_harmony_models_bypass_the_hook_so_ids_on_them_are_a_400(servers, patched, monkeypatch):
    """GPT-OSS renders through openai_harmony in ``render_chat`` and never reaches ``preprocess_chat``: the ids would
    be ignored in silence. The patch guards ``render_chat``; the harmony render itself is not run (it downloads its
    encoding), the bypass is shown in the release's source instead."""
    import inspect

    original = getattr(hook_class().render_chat, vllm_hooks.SENTINEL)
    source = inspect.getsource(original)
    assert "if not self.use_harmony:" in source and "self._make_request_with_harmony(" in source
    server = servers("qwen25")
    messages, _ = _two_turns(server)  # the tiny model's ids, before the flag (0.33+'s /tokenize renders harmony then)
    monkeypatch.setattr(hook_instance(server), "use_harmony", True)
    r = server.chat(messages, max_tokens=4)
    assert r.status_code == 400, r.text
    assert "openai_harmony" in r.text and "messages[1]" in r.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_aborted_generation_is_a_503_when_patched_and_a_cut_200_when_stock(servers, patched, monkeypatch, path):
    """The abort guard on the release's real serving classes and FastAPI routes (the engine ends the request with
    ``finish_reason="abort"``) for a turn that is not resumed (partial rollouts off): patched, a 503 naming the
    abort and counted; stock (the guard's originals put back), the cut text as a 200 success."""
    from nemo_gym_adapter.vllm import abort as vllm_abort
    from nemo_gym_adapter.vllm import resume as vllm_resume

    server = servers("qwen25")
    monkeypatch.setattr(server.engine, "finish_reason", "abort")
    monkeypatch.setitem(vllm_resume.OPTIONS, "enabled", False)
    body = (
        {"messages": [{"role": "user", "content": "Say ab."}], "max_tokens": 8}
        if path.endswith("chat/completions")
        else {"prompt": "Say ab.", "max_tokens": 8}
    )
    assert vllm_abort.is_guarded()
    before = vllm_abort.aborted_total()
    r = server.post(path, body)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["message"] == vllm_abort.ABORT_MESSAGE, r.text
    assert vllm_abort.aborted_total() == before + 1

    for target in vllm_abort.ABORT_GUARD_TARGETS:  # the stock release for the control
        import importlib

        class_name, method_name = target.qualname.split(".")
        cls = getattr(importlib.import_module(target.module), class_name)
        monkeypatch.setattr(cls, method_name, getattr(getattr(cls, method_name), vllm_abort.GUARD_SENTINEL))
    assert not vllm_abort.is_guarded()
    r = server.post(path, body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "abort" and (choice.get("text") or choice["message"]["content"]) == "Skinny"


def _resumable_body(path: str, **extra: Any) -> dict:
    if path.endswith("chat/completions"):
        messages = [{"role": "user", "content": "Say ab."}]
        body = {"messages": messages, "max_tokens": 20, "logprobs": True, "top_logprobs": 0, "return_token_ids": True}
        return {**body, **extra}
    return {"prompt": "Say ab.", "max_tokens": 20, "logprobs": 0, "return_token_ids": True, **extra}


def _choice(path: str, body: dict) -> tuple[list[int], list[float], str]:
    choice = body["choices"][0]
    if path.endswith("chat/completions"):
        return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]], choice["message"]["content"]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"], choice["text"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_aborted_generation_resumes_from_its_own_tokens(servers, patched, monkeypatch, path):
    """Partial rollouts on the release's real serving classes: the engine cuts the turn after 3 tokens (a pause); the
    patch asks the same engine for the rest with prompt + those 3 tokens and what the budget had left, and answers
    one completion: every id once, each segment's log-probs, the whole text (replayed by the release's own detokenizer)."""
    from nemo_gym_adapter.vllm import resume as vllm_resume

    server = servers("qwen25")
    tok = server.tokenizer
    monkeypatch.setattr(server.engine, "rest", None)
    monkeypatch.setattr(server.engine, "aborts", [3])
    monkeypatch.setattr(server.engine, "script", ["Skinny weather in Paris"])
    before = vllm_resume.counters()
    r = server.post(path, _resumable_body(path))
    assert r.status_code == 200, r.text
    (first, params), (resumed, rest_params) = server.engine.calls[-2:]
    full = piecewise(tok, "Skinny weather in Paris") + [tok.convert_tokens_to_ids(TERMINATOR["qwen25"])]
    assert resumed["prompt_token_ids"] == first["prompt_token_ids"] + full[:3]
    assert (params.max_tokens, rest_params.max_tokens) == (20, 17)
    ids, logprobs, text = _choice(path, r.json())
    assert ids == full and r.json()["choices"][0]["finish_reason"] == "stop"
    assert text == "Skinny weather in Paris"
    # the scripted engine's log-probs count from each call's first token: the seam shows in them
    assert logprobs == pytest.approx([-0.25 - i / 8 for i in range(3)] + [-0.25 - i / 8 for i in range(len(full) - 3)])
    after = vllm_resume.counters()
    assert after["resumes"] - before["resumes"] == 1 and after["resumed_tokens"] - before["resumed_tokens"] == 3


def test_a_stop_string_across_the_seam_ends_the_answer_where_vllm_would(servers, patched, monkeypatch):
    """``stop: ["weather in"]``, the turn cut between "weather" and " in": neither segment's own check can match it;
    the answer ends at the token that completed it, the text before it, as the release's detokenizer ends a whole turn."""
    from nemo_gym_adapter.vllm import resume as vllm_resume

    server = servers("qwen25")
    tok = server.tokenizer
    full = piecewise(tok, "Skinny weather in Paris") + [tok.convert_tokens_to_ids(TERMINATOR["qwen25"])]
    cut = next(k for k in range(len(full)) if "weather" in tok.decode(full[:k]))
    end = next(k for k in range(len(full)) if "weather in" in tok.decode(full[:k]))
    assert cut < end, (cut, end)  # the seam falls inside the stop string
    monkeypatch.setattr(server.engine, "rest", None)
    monkeypatch.setattr(server.engine, "aborts", [cut])
    monkeypatch.setattr(server.engine, "script", ["Skinny weather in Paris"])
    before = vllm_resume.counters()["seam_stop_cuts"]
    r = server.post("/v1/chat/completions", _resumable_body("/v1/chat/completions", stop=["weather in"]))
    assert r.status_code == 200, r.text
    ids, logprobs, text = _choice("/v1/chat/completions", r.json())
    choice = r.json()["choices"][0]
    assert ids == full[:end] and len(logprobs) == end
    assert (text, choice["finish_reason"], choice["stop_reason"]) == ("Skinny ", "stop", "weather in")
    assert vllm_resume.counters()["seam_stop_cuts"] == before + 1


# ------------------------------------------------------------------------- issue 19: NeMo RL's server request classes


def test_required_prefix_without_an_assistant_message(servers, patched):
    """NeMo RL's merged-tokens case: a user-only conversation and a required prefix that ends inside the user
    message, spelling ' Skinny' in two tokens where the template writes one."""
    server = servers("qwen25")
    tok = server.tokenizer
    messages = [{"role": "user", "content": " Skinny"}]
    full = server.tokenize(messages, add_generation_prompt=True)
    (one,) = tok.encode(" Skinny", add_special_tokens=False)
    two = tok.encode(" S", add_special_tokens=False) + tok.encode("kinny", add_special_tokens=False)
    assert len(two) == 2 and tok.decode(two) == " Skinny"
    at = full.index(one)
    prefix = full[:at] + two
    expected = prefix + full[at + 1 :]
    assert server.tokenize(messages, add_generation_prompt=True, required_prefix_token_ids=prefix) == expected
    r = server.chat(messages, max_tokens=2, required_prefix_token_ids=prefix)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == expected
    # a prefix that does not spell the conversation (an edited word) is refused
    bad = full[:at] + tok.encode(" Slim", add_special_tokens=False)
    r = server.chat(messages, max_tokens=2, required_prefix_token_ids=bad)
    assert r.status_code == 400 and "required_prefix_token_ids" in r.text, r.text


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_turn_one_budget_is_clamped_without_ids(servers, patched, field):
    server = servers("qwen25")
    r = server.chat([{"role": "user", "content": "hi"}], **{field: 10 * MAX_MODEL_LEN})
    assert r.status_code == 200, r.text
    (_, params) = server.engine.calls[-1]
    assert params.max_tokens == MAX_MODEL_LEN - len(r.json()["prompt_token_ids"])


def test_completions_budget_is_clamped(servers, patched):
    server = servers("qwen25")
    r = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 10 * MAX_MODEL_LEN})
    assert r.status_code == 200, r.text
    (prompt, params) = server.engine.calls[-1]
    assert params.max_tokens == MAX_MODEL_LEN - len(prompt["prompt_token_ids"])


def test_top_logprobs_null_is_a_400_naming_it_where_vllm_would_drop_the_log_probs(servers, patched):
    """Up to 0.31 vLLM answers ``top_logprobs: null`` without log-probs (Gym #1612): the patch refuses it. From 0.32
    vLLM reads the null as 0 before any hook runs, so the request is served with the sampled tokens' log-probs."""
    server = servers("qwen25")
    r = server.chat([{"role": "user", "content": "hi"}], max_tokens=2, logprobs=True, top_logprobs=None)
    if NULL_TOP_LOGPROBS_IS_ZERO:
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"]) > 0, r.text
    else:
        assert r.status_code == 400 and "top_logprobs" in r.json()["error"]["message"], r.text


def test_token_fields_on_the_message_as_nemo_rl_serves_them(servers, patched):
    server = servers("qwen25")
    r = server.chat([{"role": "user", "content": "hi"}], max_tokens=3, logprobs=True, top_logprobs=0)
    assert r.status_code == 200, r.text
    data = r.json()
    message, choice = data["choices"][0]["message"], data["choices"][0]
    assert message["prompt_token_ids"] == data["prompt_token_ids"]
    assert message["generation_token_ids"] == choice["token_ids"]
    assert message["generation_log_probs"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    # without logprobs: no partial bundle (Gym refuses one)
    r = server.chat([{"role": "user", "content": "hi"}], max_tokens=3)
    assert not {"prompt_token_ids", "generation_token_ids", "generation_log_probs"} & set(
        r.json()["choices"][0]["message"]
    )


def test_the_stock_release_answers_these_requests_the_way_issue_19_describes(servers, unpatched):
    """The control of the issue-19 cases above: the stock release refuses a turn-1 budget over the context, answers
    ``top_logprobs: null`` with a 200 whose log-probs are missing (up to 0.31; from 0.32 with them, as patched), and
    puts no token fields on the message."""
    server = servers("qwen25")
    hi = [{"role": "user", "content": "hi"}]
    assert server.chat(hi, max_tokens=10 * MAX_MODEL_LEN).status_code == 400
    r = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 10 * MAX_MODEL_LEN})
    assert r.status_code == 400, r.text
    r = server.chat(hi, max_tokens=2, logprobs=True, top_logprobs=None)
    assert r.status_code == 200, r.text
    logprobs = r.json()["choices"][0]["logprobs"]
    assert (logprobs is not None) == NULL_TOP_LOGPROBS_IS_ZERO, r.text
    r = server.chat(hi, max_tokens=3, logprobs=True, top_logprobs=0)
    assert r.status_code == 200 and "generation_token_ids" not in r.json()["choices"][0]["message"], r.text


# ----------------------------------------------------------------------------- issue 27: hostile ids, access


@pytest.mark.parametrize(("where", "bad", "fragment"), HOSTILE_IDS)
def test_hostile_ids_are_one_400_on_chat_and_tokenize_alike(servers, patched, where, bad, fragment):
    """Every id is checked against the engine's vocabulary inside the splice, once, on both routes (issue 27): chat
    and ``/tokenize`` answer the same 400 naming the message, field and element, before the engine sees anything."""
    server = servers("qwen25")
    calls = len(server.engine.calls)
    assert_refused_on_both_routes(server.post, where, bad, fragment)
    assert len(server.engine.calls) == calls  # nothing reached the engine


def test_the_access_guard_refuses_every_route_of_the_releases_app_without_the_key(servers, patched):
    """The guard (``nemo_gym_adapter.access.guard``) on the release's real app: every route it serves answers 401
    without the run's key, before any route runs (vLLM's own ``--api-key`` leaves all but /v1, /v2 and
    /inference open); with the key the routes answer as before; removed, the app is open again (the control)."""
    import httpx

    from nemo_gym_adapter.access import guard

    server = servers("qwen25")
    paths = sorted({r.path for r in server.app.routes if hasattr(r, "path")})
    assert {"/health", "/tokenize", "/v1/chat/completions", "/v1/completions", "/metrics"} <= set(paths), paths

    def status(path: str, headers: dict | None = None) -> int:
        async def go():
            transport = httpx.ASGITransport(app=server.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://vllm-release") as client:
                return (await client.post(path.replace("{", "x").replace("}", ""), headers=headers)).status_code

        return server.run(go())

    calls = len(server.engine.calls)
    guard.install_guard(["the-run-key"])
    try:
        opened = {p: s for p in paths if (s := status(p)) != 401}
        assert not opened, opened
        assert status("/v1/chat/completions", {"Authorization": "Bearer other"}) == 401
        assert len(server.engine.calls) == calls
        r = server.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401  # the helper sends no key
        assert status("/tokenize", {"Authorization": "Bearer the-run-key"}) != 401
    finally:
        guard.remove_guard()
    assert status("/health") != 401  # the control: without the guard, the app answers without a key
