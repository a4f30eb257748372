"""Whether a ``/run`` result is another row's answer, read from what it echoes of the request it answers.

Gym's resources servers answer ``BaseVerifyResponse(**body.model_dump(), reward=...)``: the request comes back as
they read it, verifier fields and ``responses_create_params`` included. A relay or cache that mixed up answers shows
in that echo; :mod:`~nemo_gym_adapter.rollouts.client` masks such a row ``wrong_row`` rather than train another
task's reward as this row's. Works on the decoded JSON (``Mapping``), before any parsing: a result that is not this
row's is not worth validating.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from nemo_gym_adapter.wire.payloads import RESERVED_ROW_KEYS


def other_row_fields(sent: Mapping[str, Any], result: Mapping[str, Any], limit: int = 3) -> list[str]:
    """Why ``result`` is another row's answer to ``sent`` (a ``/run`` body), as ``"<key>: sent <a>, result has <b>"``
    lines (at most ``limit``); empty when it can be this row's.

    Gym's resources servers answer ``BaseVerifyResponse(**body.model_dump(), reward=...)``: the request comes back as
    they read it. Two signs, both required, because each alone has innocent causes: (1) the user's words are gone
    from the echoed ``responses_create_params.input`` (some agents return a conversation they built there --
    harbor_agent, mini_swe_agent -- but keep the task in it); (2) a verifier field comes back with another value
    (some servers normalise one -- mcqa's ``expected_answer.strip().upper()`` -- so strings are compared stripped and
    case-folded, numbers as numbers; a coerced type is no evidence, nor are reserved or ``_``-prefixed keys or
    fields the result does not carry). A relay or cache that mixed up answers shows both; such a reward, trained as
    this row's, would be another task's."""
    if not _conversation_lost(sent.get("responses_create_params"), result.get("responses_create_params")):
        return []
    clashes = []
    for key, value in sent.items():
        if not isinstance(key, str) or key in RESERVED_ROW_KEYS or key.startswith("_") or key not in result:
            continue
        echoed = result[key]
        if _scalar_kind(value) is None or _scalar_kind(value) != _scalar_kind(echoed) or _same(value, echoed):
            continue
        clashes.append(f"{key}: sent {json.dumps(value)[:60]}, result has {json.dumps(echoed)[:60]}")
        if len(clashes) >= limit:
            break
    return clashes


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _texts(value: Any) -> list[str]:
    """The texts of a Responses-API ``input`` (a string, messages with a string or parts as ``content``)."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    for item in value if isinstance(value, list) else ():
        content = item.get("content") if isinstance(item, Mapping) else None
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(str(p.get("text")) for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return out


def _user_texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    users = [i for i in value if isinstance(i, Mapping) and i.get("role") == "user"] if isinstance(value, list) else []
    return [t for t in _texts(users) if t.strip()]


def _conversation_lost(sent: Any, echoed: Any) -> bool:
    """The sent input's user texts are not all found in the echoed input (no echo, or nothing to compare: False)."""
    if not isinstance(sent, Mapping) or not isinstance(echoed, Mapping) or "input" not in echoed:
        return False
    mine = _user_texts(sent.get("input"))
    theirs = " ".join(_texts(echoed.get("input")))
    return bool(mine) and any(t.strip() not in theirs for t in mine)


def _scalar_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "str" if isinstance(value, str) else None
