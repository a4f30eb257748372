"""``tokens.prefix_reuse``: the history render's ids taken from the full render's, segment by segment, and the path the
hooks take at agentic length (turn ends found once per sequence and shared) against the reference path.

The oracle for the segment reuse is the tokenizer itself (tokenizing the prefix text whole) and the previous
implementation (kept here as :func:`reference_prefix_ids`: every segment compared on its own). The oracle for the
hooks' path is the same splice fed plain lists with the prefix tokenized whole (what the slow path and every release
before this one computed): on long agentic conversations of the three tiny-model families, unchanged or with a random
in-place change of a message before the anchor, both give the same prompt or the same refusal.
"""

from __future__ import annotations

import copy
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.anchor import find_anchor, splice_request
from nemo_gym_adapter.tokens.prefix_reuse import (
    prefix_ids_by_segments,
    prefix_render_by_segments,
    stop_texts_for,
)
from nemo_gym_adapter.tokens.stops import Stops, stop_positions
from tests.support.agentic import AGENT_TOOLS, agentic_conversation
from tests.support.conversations import template_view
from tests.unit.tokens.test_splice_property import Family, build_family

FAMILIES = ("qwen25", "qwen3", "llama3")


@pytest.fixture(scope="module")
def families(tiny_model_dir) -> dict[str, Family]:
    return {name: build_family(name, tiny_model_dir(name)) for name in FAMILIES}


def reference_prefix_ids(prefix_text, full_text, full_ids, stops, encode):
    """The segment reuse as first shipped: every segment of the prefix compared with the full render's on its own."""
    full_parts = stops.pattern.split(full_text)
    positions = stop_positions(full_ids, set(stops.ids.values()))
    if [stops.ids[t] for t in full_parts[1::2]] != [full_ids[p] for p in positions]:
        return None
    bounds = [-1, *positions, len(full_ids)]
    full_segments = full_parts[::2]
    parts = stops.pattern.split(prefix_text)
    out: list[int] = []
    for i, segment in enumerate(parts[::2]):
        if i < len(full_segments) and segment == full_segments[i]:
            out += full_ids[bounds[i] + 1 : bounds[i + 1]]
        elif segment:
            out += encode(segment)
        if 2 * i + 1 < len(parts):
            out.append(stops.ids[parts[2 * i + 1]])
    return out


PIECES = [
    "Skinny",
    " weather",
    "\n",
    "\n\n",
    " ",
    "é",
    '{"city": "Oslo"}',
    "<tool_call>",
    "<|im_start|>",
    "assistant\n",
    "12",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_end|>\n",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
]


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    full_pieces=st.lists(st.sampled_from(PIECES), max_size=40),
    keep=st.integers(min_value=0, max_value=40),
    edit=st.lists(st.sampled_from(PIECES), max_size=6),
    tail=st.lists(st.sampled_from(PIECES), max_size=6),
)
def test_prefix_render_equals_the_reference_and_tokenizing_the_prefix(families, name, full_pieces, keep, edit, tail):
    family = families[name]
    stops = stop_texts_for(family.tok, family.template.stop_ids)
    assert stops is not None
    full_text = "".join(full_pieces)
    prefix_text = "".join(full_pieces[:keep] + edit + tail)  # shares some parts, then differs and ends its own way
    full_ids = family.encode(full_text)
    got = prefix_render_by_segments(
        prefix_text, full_text, Stops.of(full_ids, family.template.stop_ids), stops, family.encode
    )
    assert got is not None
    assert (
        got.ids
        == family.encode(prefix_text)
        == reference_prefix_ids(prefix_text, full_text, full_ids, stops, family.encode)
    )
    assert got.at == stop_positions(got.ids, family.template.stop_ids)  # positions by construction, not by a scan
    assert prefix_ids_by_segments(prefix_text, full_text, full_ids, stops, family.encode) == got.ids


def test_ids_that_are_not_the_texts_are_refused(families):
    family = families["qwen25"]
    stops = stop_texts_for(family.tok, family.template.stop_ids)
    text = "a<|im_end|>b<|im_end|>c"
    ids = family.encode(text)
    assert prefix_render_by_segments("a", text, ids[:-3], stops, family.encode) is None  # a stop id missing


class FakeFirstPieceTokenizer:
    """Fake: a fast tokenizer whose stop token is a verbatim added token but whose pre-tokenizer marks only the text's
    first piece (SentencePiece ``Metaspace`` with ``prepend_scheme: first``): a segment alone tokenizes differently."""

    is_fast = True

    def __init__(self, real) -> None:
        self.real = real
        self.added_tokens_decoder = real.added_tokens_decoder

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.real.encode(text, add_special_tokens=False)
        return [7, *ids] if ids else ids  # the marker only at the very start of the text


def test_segment_reuse_is_refused_for_a_tokenizer_whose_pieces_depend_on_their_position(families):
    family = families["qwen25"]
    assert stop_texts_for(family.tok, family.template.stop_ids) is not None  # the control: the real tokenizer
    assert stop_texts_for(FakeFirstPieceTokenizer(family.tok), family.template.stop_ids) is None


# ---------------------------------------------------------------------------------------------------------------------
# The hooks' path on long agentic conversations vs the reference path.


def render_text(family: Family, messages: list[dict], add_generation_prompt: bool) -> str:
    return family.tok.apply_chat_template(
        template_view(messages), tools=AGENT_TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def hooks_path(family: Family, messages: list[dict]) -> list[int]:
    """What the vLLM and SGLang hooks compute: the full render's turn ends found once, the history render built from
    its segments (with its turn ends), both handed to the splice as ``Stops``."""
    anchor = find_anchor(messages, None)
    full_text = render_text(family, messages, True)
    full = Stops.of(family.encode(full_text), family.template.stop_ids)
    stops = stop_texts_for(family.tok, family.template.stop_ids)
    prefix = prefix_render_by_segments(
        render_text(family, messages[: anchor.index + 1], False), full_text, full, stops, family.encode
    )
    return _splice(family, anchor, messages, prefix, full)


def reference_path(family: Family, messages: list[dict]) -> list[int]:
    """The same splice on plain lists, the history render tokenized whole."""
    anchor = find_anchor(messages, None)
    full = family.encode(render_text(family, messages, True))
    prefix = family.encode(render_text(family, messages[: anchor.index + 1], False))
    return _splice(family, anchor, messages, prefix, full)


def _splice(family, anchor, messages, prefix, full):
    from nemo_gym_adapter.tokens.same_text import SameText

    same_text = SameText.for_tokenizer(family.tok, family.template.added_ids)
    return splice_request(
        anchor,
        messages,
        prefix,
        full,
        family.template,
        decode=family.tok.decode,
        assistant_edits="keep_ids",
        same_text=same_text,
    )


def outcome(path, family, messages):
    try:
        return "spliced", path(family, messages)
    except TokenAlignmentError as e:
        return "refused", str(e)


CHANGES = ("append", "replace_char", "truncate", "whitespace", "same", "drop_message", "retokenize")


def change(family: Family, messages: list[dict], kind: str, rng: random.Random) -> tuple[list[dict], bool]:
    """``messages`` with one message before the anchor changed in place; and whether the history the template renders
    changed (then the request must be refused)."""
    out = copy.deepcopy(messages)
    anchor = find_anchor(out, None).index
    index = rng.choice([i for i in range(anchor) if out[i]["role"] != "assistant"])
    before = render_text(family, out[: anchor + 1], False)
    text = out[index]["content"]
    if kind == "append":
        out[index]["content"] = text + " and more"
    elif kind == "replace_char":
        at = rng.randrange(len(text))
        out[index]["content"] = text[:at] + ("x" if text[at] != "x" else "y") + text[at + 1 :]
    elif kind == "truncate":
        out[index]["content"] = text[: len(text) // 2]
    elif kind == "whitespace":
        out[index]["content"] = text + "  "
    elif kind == "drop_message":
        del out[index]
        return out, True
    elif kind == "retokenize":
        # The model saw the system prompt in other tokens (a client that tokenized it itself): one of its tokens
        # re-spelled in two pieces in every prompt (all start with that span), so the history stays one history.
        prompt = out[anchor]["prompt_token_ids"]
        at, pieces = next(
            (i, split)
            for i, t in enumerate(prompt[: prompt.index(family.template.terminator_id)])
            if t not in family.template.added_ids
            and len(text := family.tok.decode([t])) >= 2
            and (split := family.encode(text[:1]) + family.encode(text[1:])) != [t]
            and family.tok.decode(split) == text
        )
        for message in out:
            if message.get("prompt_token_ids") is not None:
                ids = message["prompt_token_ids"]
                message["prompt_token_ids"] = ids[:at] + pieces + ids[at + 1 :]
        return out, False
    anchor = find_anchor(out, None).index
    return out, render_text(family, out[: anchor + 1], False) != before


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.integers(2, 10),
    tokens=st.integers(600, 3000),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(CHANGES),
)
def test_hooks_path_gives_the_reference_paths_prompt_or_refusal(families, name, turns, tokens, seed, kind):
    family = families[name]
    conv = agentic_conversation(
        family.tok, name, turns, tokens, splice=lambda m, f: reference_path(family, m), seed=seed
    )
    first = outcome(hooks_path, family, conv.messages)
    assert first[0] == "spliced"
    assert first == outcome(reference_path, family, conv.messages)
    changed, edits_history = change(family, conv.messages, kind, random.Random(seed))
    fast = outcome(hooks_path, family, changed)
    assert fast == outcome(reference_path, family, changed)
    if edits_history:  # the control: a change of the history the model saw is refused, never spliced
        assert fast[0] == "refused", (kind, fast)
    elif kind in ("same", "retokenize"):
        assert fast[0] == "spliced"
        if kind == "same":
            assert fast == first
    if fast[0] == "refused":
        assert re.search(r"messages\[\d+\]|turn", fast[1]), fast[1]
