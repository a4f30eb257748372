"""Hostile token ids (issue 27): one table of requests the splice's id check must refuse with a 400 naming the
message, field and element, on chat and ``/tokenize`` alike. Shared by the engine suites that serve the tiny qwen25
model through their real apps (``tests/vllm_releases``, ``tests/sglang``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

VOCAB = 3007  # the tiny qwen25 model's vocabulary (config.json and tokenizer agree)
NOT_AN_ID = "must be a non-negative int token id"

# (where the bad ids go, the ids, a fragment of the 400's message)
HOSTILE_IDS = [
    ("generation_token_ids", [5, VOCAB], f"generation_token_ids[1] = {VOCAB} is out of vocabulary"),
    ("generation_token_ids", [5, -3], f"generation_token_ids[1] {NOT_AN_ID}, got -3"),
    ("generation_token_ids", [True, True], f"generation_token_ids[0] {NOT_AN_ID}, got True"),
    ("prompt_token_ids", [5, 6.0], f"prompt_token_ids[1] {NOT_AN_ID}, got 6.0 (float)"),
    ("prompt_token_ids", [5, "6"], f"prompt_token_ids[1] {NOT_AN_ID}, got '6' (str)"),
    ("prompt_token_ids", [5, 2**63], f"prompt_token_ids[1] = {2**63} is out of vocabulary"),
    ("required_prefix_token_ids", [True], f"required_prefix_token_ids[0] {NOT_AN_ID}"),
    ("required_prefix_token_ids", [1, 10**9], "required_prefix_token_ids[1] = 1000000000 is out of vocabulary"),
]
PATHS = (("/v1/chat/completions", {"max_tokens": 4}), ("/tokenize", {}))  # (route, what else its body holds)


def hostile_body(where: str, bad: list[Any]) -> dict[str, Any]:
    """A two-turn body whose assistant turn (or ``required_prefix_token_ids``) carries ``bad`` at ``where``."""
    ids: dict[str, Any] = {"prompt_token_ids": [1, 2], "generation_token_ids": [3]}
    body: dict[str, Any] = {}
    if where == "required_prefix_token_ids":
        body[where] = bad
    else:
        ids[where] = bad
    assistant = {"role": "assistant", "content": "yo", **ids}
    return {"messages": [{"role": "user", "content": "hi"}, assistant, {"role": "user", "content": "x"}], **body}


def assert_refused_on_both_routes(
    post: Callable[[str, dict[str, Any]], Any], where: str, bad: list[Any], fragment: str
) -> None:
    """``post(path, body)`` (the suite's client; an httpx-like answer) of :func:`hostile_body` to chat and
    ``/tokenize``: both answers the splice's 400 holding ``fragment``."""
    for path, extra in PATHS:
        r = post(path, {**hostile_body(where, bad), **extra})
        assert r.status_code == 400, (path, r.text)
        assert "nemo-gym-verl token splice" in r.text and fragment in r.text, (path, r.text)
