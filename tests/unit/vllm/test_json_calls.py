"""Tool calls written as JSON (``ngv_json``'s rule): bare, fenced, tagged and listed calls are read; prose, a schema
echo and broken JSON are content, never an error; arbitrary text never raises (property test)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.vllm.json_calls import JsonCall, parse_json_calls

PARIS = JsonCall("get_weather", '{"city": "Paris"}')
SCHEMA_ECHO = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}'
)


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        '  {"name":"get_weather","arguments":{"city":"Paris"}}\n',
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',  # Llama 3's spelling
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',  # arguments already JSON text
    ],
)
def test_a_call_the_way_the_model_writes_it(text):
    assert parse_json_calls(text) == (None, [PARIS])


def test_prose_around_a_call_stays_content_and_every_call_is_kept():
    text = (
        'Let me check.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n'
        'and {"name": "get_time", "arguments": {}} too.'
    )
    content, calls = parse_json_calls(text)
    assert calls == [PARIS, JsonCall("get_time", "{}")]
    assert content == "Let me check.\n\nand  too."


def test_a_schema_echo_is_content_even_with_a_call_after_it():
    """The misses of the plain Llama-3 parser: the model echoes the <tools> schema first; its nested "name" is never
    read as a call, and the real call after it is."""
    assert parse_json_calls(SCHEMA_ECHO) == (SCHEMA_ECHO, [])
    content, calls = parse_json_calls(SCHEMA_ECHO + '\n{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert calls == [PARIS] and content == SCHEMA_ECHO


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Paris is cold.",
        "",
        '{"name": "get_weather", "arguments": {"city": "Paris"}',  # cut at the token budget
        '{"name": "", "arguments": {}}',
        '{"name": 3, "arguments": {}}',
        '{"name": "get_weather"}',  # no arguments: not a call
        '[{"name": "get_weather", "arguments": {}}, 3]',  # a list with a non-call: data, not calls
        "[]",
        "{{{{",
        "[" * 5000,  # deep nesting: the decoder's recursion limit, not a crash
        '{"a": 1} [1, 2] "x"',
    ],
)
def test_anything_else_is_content_and_no_call(text):
    assert parse_json_calls(text) == (text, [])


def test_non_ascii_arguments_are_kept_as_written():
    _, calls = parse_json_calls('{"name": "get_weather", "arguments": {"city": "Zürich"}}')
    assert calls == [JsonCall("get_weather", '{"city": "Zürich"}')]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('{}[]",:` \nabnme0tool_call<>/json\\')), max_size=200))
def test_no_text_raises_and_every_call_reads_back(text):
    content, calls = parse_json_calls(text)
    assert content is None or isinstance(content, str)
    for call in calls:
        assert call.name.strip()
        assert isinstance(call.arguments, str)
    if not calls:
        assert content == text


@settings(max_examples=100, deadline=None)
@given(
    st.text(alphabet=st.characters(blacklist_characters="{}[]`<"), max_size=40),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)
def test_a_call_in_any_prose_is_found(prose, arguments):
    call = json.dumps({"name": "f", "arguments": arguments})
    content, calls = parse_json_calls(f"{prose}{call}{prose}")
    assert calls == [JsonCall("f", json.dumps(arguments, ensure_ascii=False))]
    assert content == ((prose + prose).strip() or None)
