"""Property tests of the splice: random multi-turn rollouts simulated turn by turn as vLLM + NeMo Gym run them.

Each turn: the request's prompt is the splice of the conversation so far (what the patched vLLM feeds the engine);
the "model" then generates ids that differ from what the template writes for the same text (random vocab pieces,
``<tool_call>`` spelled in plain pieces, compact JSON, think blocks, any stop id or none); Gym sends the assistant
message back with ``prompt_token_ids`` / ``generation_token_ids``, followed by tool output or a user message. The
invariant: every prompt starts with every earlier prompt + generation, exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.tokens.same_text import SameText
from nemo_gym_adapter.tokens.splice import (
    last_tokenized_assistant,
    messages_through,
    splice_prompt,
    turn_history,
)
from nemo_gym_adapter.tokens.turn_template import TurnTemplate
from tests.support.conversations import template_view

ENDINGS = ("terminator", "other_eos", "none")
FOLLOW_UPS = ("env", "user", "injected_assistant")


@dataclass(frozen=True)
class Turn:
    """One model call and what the environment answers. Contents are vocab indices (into a family's safe vocab)."""

    content: tuple[int, ...]
    call: tuple[str, dict] | None
    plain_markers: bool  # <tool_call> spelled in plain pieces instead of the added token
    compact_json: bool
    reasoning: tuple[int, ...] | None
    ending: str
    follow_up: str


def turns(max_vocab: int) -> st.SearchStrategy[list[Turn]]:
    ids = st.lists(st.integers(0, max_vocab - 1), max_size=10).map(tuple)
    call = st.one_of(
        st.none(),
        st.tuples(st.just("get_weather"), st.fixed_dictionaries({"city": st.sampled_from(["Paris", "Tokyo"])})),
        st.tuples(st.just("search"), st.fixed_dictionaries({"query": st.text("abc xyz", max_size=8)})),
    )
    turn = st.builds(
        Turn,
        content=ids,
        call=call,
        plain_markers=st.booleans(),
        compact_json=st.booleans(),
        reasoning=st.one_of(st.none(), ids),
        ending=st.sampled_from(ENDINGS),
        follow_up=st.sampled_from(FOLLOW_UPS),
    )
    return st.lists(turn, min_size=1, max_size=6)


def assert_prefix_chain(history: list[tuple[list[int], list[int]]], prompt: list[int]) -> None:
    for turn, (earlier_prompt, generation) in enumerate(history):
        n = len(earlier_prompt) + len(generation)
        assert prompt[:n] == earlier_prompt + generation, f"prompt diverges from turn {turn + 1}'s tokens"


# =====================================================================================================================
# Synthetic layout (no tokenizer): START role NL content END NL, Qwen3-like reasoning stripping. Fast; many examples.

START, END, EOS, NL = 1, 2, 3, 4
ROLE = {"system": 5, "user": 6, "assistant": 7, "tool": 8}
SYNTHETIC = TurnTemplate(terminator_id=END, stop_ids=frozenset({END, EOS}))


def synthetic_render(messages: list[dict], add_generation_prompt: bool) -> list[int]:
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    out: list[int] = []
    for i, m in enumerate(messages):
        body = list(m.get("content") or [])
        if m.get("reasoning") and i > last_user:
            body = [*m["reasoning"], *body]
        out += [START, ROLE[m["role"]], NL, *body, END, NL]
    return out + ([START, ROLE["assistant"], NL] if add_generation_prompt else [])


@settings(max_examples=150, deadline=None)
@given(turns(50))
def test_synthetic_rollouts_stay_token_exact(script):
    messages = [{"role": "system", "content": [100]}, {"role": "user", "content": [101]}]
    history: list[tuple[list[int], list[int]]] = []
    for turn in script:
        found = last_tokenized_assistant(messages)
        full = synthetic_render(messages, True)
        if found is None:
            prompt = full
        else:
            k, model_prefix = found
            prefix = synthetic_render(messages_through(messages, k), False)
            prompt = splice_prompt(model_prefix, prefix, full, SYNTHETIC, turn_history(messages, k))
        assert_prefix_chain(history, prompt)
        # Model ids (200+) never equal the template's re-encoding of the same text (500+, one id fewer).
        generation = [200 + i for i in (turn.reasoning or ())] + [200 + i for i in turn.content]
        generation += {"terminator": [END], "other_eos": [EOS], "none": []}[turn.ending]
        message = {"role": "assistant", "content": [500 + i for i in turn.content[1:]]}
        if turn.reasoning:
            message["reasoning"] = [500 + i for i in turn.reasoning]
        messages = [*messages, {**message, "prompt_token_ids": prompt, "generation_token_ids": generation}]
        history.append((prompt, generation))
        if turn.follow_up == "injected_assistant":
            messages.append({"role": "assistant", "content": [600]})
        messages.append({"role": "tool" if turn.follow_up == "env" else "user", "content": [700 + len(history)]})
    k, model_prefix = last_tokenized_assistant(messages)
    prefix = synthetic_render(messages_through(messages, k), False)
    full = synthetic_render(messages, True)
    assert_prefix_chain(history, splice_prompt(model_prefix, prefix, full, SYNTHETIC, turn_history(messages, k)))


# =====================================================================================================================
# Real chat templates and tokenizers of the three tiny-model families.

TOOLS = [
    {"type": "function", "function": {"name": name, "description": "d", "parameters": {"type": "object"}}}
    for name in ("get_weather", "search")
]


@dataclass(frozen=True)
class Family:
    name: str
    tok: object
    template: TurnTemplate
    other_eos: int
    safe_vocab: tuple[int, ...]  # plain-text ids: no added tokens, printable ASCII without template punctuation

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def pieces(self, text: str) -> list[int]:
        return [i for ch in text for i in self.encode(ch)]

    def render(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        text = self.tok.apply_chat_template(
            template_view(messages), tools=TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return self.encode(text)

    def splice(self, messages: list[dict], k: int, model_prefix: list[int], prefix: list[int], full: list[int]):
        """What the vLLM hook computes: the splice with the in-place edit check."""
        history = turn_history(messages, k, self.template.stop_texts)
        same_text = SameText.for_tokenizer(self.tok, self.template.added_ids)  # as vllm.hooks builds it
        return splice_prompt(
            model_prefix, prefix, full, self.template, history, decode=self.tok.decode, same_text=same_text
        )


def build_family(name: str, path) -> Family:
    """A ``Family`` of the tiny model at ``path`` (tokenizer, its TurnTemplate, a safe plain-text vocabulary)."""
    from transformers import AutoTokenizer

    from nemo_gym_adapter.tokens.turn_template import turn_template_from_tokenizer

    tok = AutoTokenizer.from_pretrained(path)
    eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    template = turn_template_from_tokenizer(tok, eos if isinstance(eos, list) else [eos])
    (other_eos,) = template.stop_ids - {template.terminator_id}
    added = set(tok.get_added_vocab().values())
    safe = tuple(
        i
        for i in range(len(tok))
        if i not in added and (text := tok.decode([i])).isascii() and text.isprintable() and not set(text) & set("<>|")
    )
    return Family(name, tok, template, other_eos, safe)


@pytest.fixture(scope="module")
def families(tiny_model_dir) -> dict[str, Family]:
    return {name: build_family(name, tiny_model_dir(name)) for name in ("qwen25", "qwen3", "llama3")}


def generate(family: Family, turn: Turn) -> tuple[list[int], dict]:
    """The ids the model samples for ``turn`` and the assistant message Gym sends back (without its ids)."""
    content_ids = [family.safe_vocab[i % len(family.safe_vocab)] for i in turn.content]
    content = family.tok.decode(content_ids)
    message: dict = {"role": "assistant", "content": content or None}
    ids: list[int] = []
    if family.name == "qwen3":
        reasoning_ids = [family.safe_vocab[i % len(family.safe_vocab)] for i in (turn.reasoning or ())]
        ids += family.encode("<think>\n") + reasoning_ids + family.encode("\n</think>\n\n")
        if reasoning_ids:  # Gym's reasoning parser moves the think text out of the content
            message["reasoning"] = message["reasoning_content"] = family.tok.decode(reasoning_ids)
    ids += content_ids
    if turn.call:
        name, args = turn.call
        separators = (",", ":") if turn.compact_json else (", ", ": ")
        if family.name == "llama3":  # Llama's JSON tool call: the whole output, no content
            ids = family.encode(json.dumps({"name": name, "parameters": args}, separators=separators))
            message["content"] = None
        else:
            marker = family.pieces if turn.plain_markers else family.encode
            body = json.dumps({"name": name, "arguments": args}, separators=separators)
            ids += family.encode("\n") + marker("<tool_call>") + family.encode(f"\n{body}\n") + marker("</tool_call>")
        message["tool_calls"] = [
            {"id": f"call_{len(ids)}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        ]
    ids += {"terminator": [family.template.terminator_id], "other_eos": [family.other_eos], "none": []}[turn.ending]
    return ids, message


@pytest.mark.parametrize("name", ["qwen25", "qwen3", "llama3"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=turns(10_000))
def test_tiny_model_rollouts_stay_token_exact(families, name, script):
    family = families[name]
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris?"}]
    history: list[tuple[list[int], list[int]]] = []
    for turn in script:
        full = family.render(messages, True)
        found = last_tokenized_assistant(messages)
        if found is None:
            prompt = full
        else:
            k, model_prefix = found
            prefix = family.render(messages_through(messages, k), False)
            prompt = family.splice(messages, k, model_prefix, prefix, full)
        assert_prefix_chain(history, prompt)
        generation, message = generate(family, turn)
        log_probs = [-1.0] * len(generation)
        message.update(prompt_token_ids=prompt, generation_token_ids=generation, generation_log_probs=log_probs)
        messages = [*messages, message]
        history.append((prompt, generation))
        if turn.follow_up == "injected_assistant":
            messages.append({"role": "assistant", "content": "Noted."})
        if turn.call and turn.follow_up == "env":
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "42"})
        else:
            messages.append({"role": "user", "content": f"Next {len(history)}?"})
    k, model_prefix = last_tokenized_assistant(messages)
    prefix = family.render(messages_through(messages, k), False)
    assert_prefix_chain(history, family.splice(messages, k, model_prefix, prefix, family.render(messages, True)))
