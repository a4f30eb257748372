"""What a rollout's tool calls were worth, read from Gym's result whatever the environment's verifier checks: how many
calls, and the share that name a tool the row offered with arguments that fit its schema. Pure; ``wire`` adds these
to every result's numeric fields, so they reach the per-environment metrics (``gym/<env>/result/tool_calls/...``),
validation's too, and the readable dump beside the reward.

The schema check is the top level of the arguments object (the shape of every tool schema Gym's environments ship):
a JSON object, every ``required`` key present, no key outside ``properties`` where ``additionalProperties`` is false,
each value of its JSON ``type`` (a bool is not a number) and inside its ``enum``. Nested objects are not descended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

TOOL_CALLS = "tool_calls"
"""Prefix of :meth:`GymRunResult.tool_call_fields` in :meth:`GymRunResult.numeric_fields`."""
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _tool_schemas(params: Any) -> dict[str, Any]:
    """``{name: parameters schema}`` of the tools a row offered (Responses-API ``{"type": "function", "name",
    "parameters"}`` items, or chat-style ``{"function": {...}}``)."""
    tools = params.get("tools") if isinstance(params, Mapping) else None
    out: dict[str, Any] = {}
    for tool in tools if isinstance(tools, list) else ():
        spec = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            out[spec["name"]] = spec.get("parameters")
    return out


def schema_problem(arguments: Any, schema: Any) -> str | None:
    """What is wrong with a call's ``arguments`` (JSON text) against its tool's parameters ``schema``, at the top
    level of the object (the shape of every tool schema Gym's environments ship): not a JSON object, a ``required``
    key missing, a key outside ``properties`` where ``additionalProperties`` is false, a value of another JSON
    ``type`` (bool is not a number), a value outside ``enum``. None: nothing wrong (also when there is no schema)."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return "arguments are not JSON"
    if not isinstance(value, dict):
        return "arguments are not a JSON object"
    if not isinstance(schema, Mapping):
        return None
    found = schema.get("properties")
    properties: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    for key in schema.get("required") or ():
        if key not in value:
            return f"required key {key!r} missing"
    for key, item in value.items():
        spec = properties.get(key)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return f"key {key!r} not in the schema"
            continue
        kinds = spec.get("type") if isinstance(spec, Mapping) else None
        names = [kinds] if isinstance(kinds, str) else list(kinds or ())
        types = tuple(t for n in names for t in _JSON_TYPES.get(n, ()))
        if types and (not isinstance(item, types) or (isinstance(item, bool) and bool not in types)):
            return f"{key!r} is not of type {kinds}"
        if isinstance(spec, Mapping) and isinstance(spec.get("enum"), list) and item not in spec["enum"]:
            return f"{key!r} is not one of {spec['enum']}"
    return None


def call_fields(params: Any, calls: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """For a rollout with tools offered or calls made (``{}`` otherwise): ``tool_calls/count``; over its calls, when
    it made any, ``tool_calls/schema_valid`` (offered tool, :func:`schema_problem` finds nothing) and
    ``tool_calls/unknown_tool`` (a tool the row did not offer; 0 when the row lists none). ``calls``: the ``name`` /
    ``arguments`` of Gym's ``function_call`` output items; ``params``: the result's ``responses_create_params``."""
    tools = _tool_schemas(params)
    if not calls and not tools:
        return {}
    out = {f"{TOOL_CALLS}/count": float(len(calls))}
    if calls:
        unknown = valid = 0
        for call in calls:
            name = call.get("name")
            if tools and name not in tools:
                unknown += 1
                continue
            valid += schema_problem(call.get("arguments"), tools.get(name) if isinstance(name, str) else None) is None
        out[f"{TOOL_CALLS}/schema_valid"] = valid / len(calls)
        out[f"{TOOL_CALLS}/unknown_tool"] = unknown / len(calls)
    return out
