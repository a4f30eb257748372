"""``nemo_gym.trajectory.train_tokens: measure_retemplated`` -- a MEASUREMENT mode, never a default: each rollout is
trained as its re-templated conversation, the way trainers without exact token ids train multi-turn rollouts.

Why it exists: to measure what exact tokens buy against what such trainers actually do. They keep the conversation
as messages (Gym's ``response.output``), render the final history with the chat template, tokenize it, and train on
the assistant spans of that render with old log-probs from the actor. Where the template re-renders what the model
wrote (a bare-JSON call put inside ``<tool_call>`` tags, a retokenized word, a stripped ``<think>``), those spans hold
tokens the model never generated, and every later turn is conditioned on a context the model never saw. This module
builds exactly that sample, and says which of its trained tokens the model generated:

* the conversation: the row's input messages and tools, then per model call one assistant message (its text and its
  tool calls, arguments parsed from JSON as vLLM does for chat templates) and each tool output as a ``tool`` message
  (:func:`conversation`: what Gym's model server sends a chat-completions engine, Responses items to chat messages);
* the render (:class:`ChatRenderer`, the trainer's tokenizer): prompt = the input messages with the generation
  prompt; response = the rest of the whole conversation's render; trained = the tokens inside each assistant
  message's span (from the end of the render before it, with the generation prompt, to the end of the render with
  it, trailing whitespace left out: content, tool calls and the turn's end token);
* the alignment (:func:`align`): each assistant span against what the model generated in that call (difflib's
  matching blocks): matched tokens carry their generation log-prob, the others are ``never_generated`` (no rollout
  log-prob exists for them: 0 stands in, and the mode needs the actor's old log-probs -- start-up refuses
  ``trusted_logprobs`` with it).

Pure token math over a renderer; the one renderer with state is :class:`HFChatRenderer` (a Hugging Face tokenizer).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from nemo_gym_adapter.rollouts.builder import build_trajectory
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import GymRunResult

_TEXT_PARTS = ("input_text", "output_text", "text")


class ChatRenderer(Protocol):
    """What the re-templated sample needs of the trainer's tokenizer."""

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Any, *, add_generation_prompt: bool) -> str: ...

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` (its special tokens as tokens, none added) and each token's character span."""
        ...


class HFChatRenderer:
    """:class:`ChatRenderer` over a Hugging Face tokenizer (a fast one: character offsets are needed)."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError("measure_retemplated needs a fast tokenizer (character offsets of each token)")
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Any, *, add_generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


@dataclass(frozen=True)
class Conversation:
    """A rollout as chat messages: ``assistant[k]`` is the index in ``messages`` of model call k's message."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    assistant: tuple[int, ...]
    first_output: int  # index in ``messages`` of the first message the rollout added (after the row's input)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text") or "") for p in content if isinstance(p, Mapping) and p.get("type") in _TEXT_PARTS
        )
    return ""


def _arguments(arguments: Any) -> Any:
    # vLLM parses a tool call's JSON arguments into an object before the chat template sees it (templates write
    # ``arguments | tojson``); a string that is not JSON stays a string.
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _chat_tools(tools: Any) -> tuple[dict[str, Any], ...] | None:
    """Responses-API function tools (``{type, name, description, parameters}``) as chat tools (``{type, function}``)."""
    if not isinstance(tools, list) or not tools:
        return None
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        if "function" in tool:
            out.append(dict(tool))
            continue
        spec = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": spec})
    return tuple(out) or None


def _input_message(item: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = item.get("type")
    if kind in (None, "message") and item.get("role"):
        return {"role": item["role"], "content": _text(item.get("content"))}
    if kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function"}
        call["function"] = {"name": item.get("name"), "arguments": _arguments(item.get("arguments"))}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "content": str(item.get("output") or ""), "tool_call_id": item.get("call_id")}
    return None


def conversation(result: GymRunResult) -> Conversation:
    """The rollout as chat messages (module docstring). Model items between two calls' id-carrying items are one
    call's: its text and tool calls become one assistant message, even an empty one (a call that wrote nothing)."""
    params = (result.model_extra or {}).get("responses_create_params") or {}
    raw_input = params.get("input")
    items = [{"role": "user", "content": raw_input}] if isinstance(raw_input, str) else list(raw_input or [])
    messages = [m for m in (_input_message(i) for i in items if isinstance(i, Mapping)) if m is not None]
    first_output = len(messages)
    assistant: list[int] = []
    current: dict[str, Any] | None = None
    for item in result.response.output:
        extra = item.model_extra or {}
        if item.type == "function_call_output":
            current = None
            messages.append(
                {"role": "tool", "content": str(extra.get("output") or ""), "tool_call_id": extra.get("call_id")}
            )
            continue
        if not item.is_model_output:
            continue
        if current is None:
            current = {"role": "assistant", "content": ""}
            messages.append(current)
            assistant.append(len(messages) - 1)
        if item.type == "message":
            current["content"] += _text(extra.get("content"))
        elif item.type == "function_call":
            call = {"id": extra.get("call_id"), "type": "function"}
            call["function"] = {"name": extra.get("name"), "arguments": _arguments(extra.get("arguments"))}
            current.setdefault("tool_calls", []).append(call)
        if item.has_token_ids:  # the call ends here: its next model item starts another message
            current = None
    return Conversation(tuple(messages), _chat_tools(params.get("tools")), tuple(assistant), first_output)


def align(trained: Sequence[int], generated: Sequence[int], logprobs: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Each trained token of one assistant span against the tokens the model generated in that call: (its rollout
    log-prob -- the generated token's where the two match, 0 elsewhere --, never_generated flags). difflib's matching
    blocks: the longest common runs, in order."""
    lp = np.zeros(len(trained), dtype=np.float32)
    never = np.ones(len(trained), dtype=bool)
    matcher = difflib.SequenceMatcher(None, list(trained), list(generated), autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        if size:
            lp[a : a + size] = np.asarray(logprobs[b : b + size], dtype=np.float32)
            never[a : a + size] = False
    return lp, never


class RetemplateError(ValueError):
    """The chat template does not render the conversation as one growing text (nothing to train)."""


def _span_chars(renderer: ChatRenderer, conv: Conversation, full: str) -> list[tuple[int, int]]:
    spans = []
    for k, i in enumerate(conv.assistant):
        head = renderer.render(conv.messages[:i], conv.tools, add_generation_prompt=True)
        upto = renderer.render(conv.messages[: i + 1], conv.tools, add_generation_prompt=False)
        if not full.startswith(head) or not full.startswith(upto.rstrip()):
            raise RetemplateError(f"model call {k}: the render before or with its message is not a prefix of the whole")
        spans.append((len(head), len(upto.rstrip())))
    return spans


def retemplated_trajectory(
    result: GymRunResult,
    *,
    env_name: str,
    config: TrajectoryConfig,
    renderer: ChatRenderer,
    row_index: int | None = None,
    latency_s: float | None = None,
) -> Trajectory:
    """One ``/run`` result → its re-templated trajectory (module docstring). Every check of
    :func:`~nemo_gym_adapter.rollouts.builder.build_trajectory` but contiguity applies first (a result it masks stays
    masked for the same reason); then the render, its budgets (prompt over ``prompt_length`` masked, a response over
    its budget cut at the end of the last assistant span that fits) and the alignment."""
    base = build_trajectory(
        result,
        env_name=env_name,
        config=replace(config, contiguity="truncate"),
        row_index=row_index,
        latency_s=latency_s,
    )
    if base.masked:
        return base
    where = f"row {row_index}" if row_index is not None else "row"
    calls = result.model_calls()
    conv = conversation(result)

    def masked(reason: MaskReason, detail: str) -> Trajectory:
        return replace(
            base,
            response_ids=base.response_ids[:0],
            sampled_spans=(),
            sampled_logprobs=base.sampled_logprobs[:0],
            forced=None,
            masked_reason=reason,
            detail=detail,
            reward=0.0,
            truncated=False,
        )

    if len(conv.assistant) != len(calls):
        return masked(MaskReason.INVALID_RESULT, f"{where}: {len(calls)} model calls, {len(conv.assistant)} messages")
    full = renderer.render(conv.messages, conv.tools, add_generation_prompt=False)
    try:
        chars = _span_chars(renderer, conv, full)
    except RetemplateError as err:
        return masked(MaskReason.INVALID_RESULT, f"{where}: re-templating: {err}")
    ids, offsets = renderer.encode(full)
    starts = np.array([o[0] for o in offsets], dtype=np.int64)
    ends = np.array([o[1] for o in offsets], dtype=np.int64)
    n_prompt = int(np.searchsorted(ends, chars[0][0], side="right")) if chars else len(ids)
    if n_prompt > config.prompt_length:
        return masked(MaskReason.PROMPT_TOO_LONG, f"{where}: re-templated prompt has {n_prompt} tokens")
    budget = config.response_length
    if config.max_model_len is not None:
        budget = max(0, min(budget, config.max_model_len - n_prompt))
    spans: list[tuple[int, int]] = []
    lps: list[np.ndarray] = []
    never: list[np.ndarray] = []
    call_ids: list[int] = []
    cut = False
    for k, (c0, c1) in enumerate(chars):
        inside = np.flatnonzero((starts >= c0) & (ends <= c1) & (ends > starts))
        if inside.size == 0:
            continue
        s, e = int(inside[0]) - n_prompt, int(inside[-1]) + 1 - n_prompt
        if e > budget:  # cut at the end of the last span that fits, or inside the first (as build_trajectory does)
            cut = True
            if spans or s >= budget:
                break
            e = budget
        call = calls[k][1]
        lp, nv = align(ids[s + n_prompt : e + n_prompt], call.generation_token_ids, call.generation_log_probs)
        spans.append((s, e))
        lps.append(lp)
        never.append(nv)
        call_ids.append(k)
    if not spans:
        return masked(MaskReason.EMPTY_GENERATION, f"{where}: no assistant span of the re-templated render fits")
    end = spans[-1][1]
    prompt = np.asarray(ids[:n_prompt], dtype=np.int64)
    response = np.asarray(ids[n_prompt : n_prompt + end], dtype=np.int64)
    for arr in (prompt, response):
        arr.flags.writeable = False
    return replace(
        base,
        prompt_ids=prompt,
        response_ids=response,
        sampled_spans=tuple(spans),
        sampled_logprobs=np.concatenate(lps),
        never_generated=np.concatenate(never),
        call_indices=tuple(call_ids),
        forced=None,
        detail="",  # the exact history's break (build_trajectory's) is not this sample's
        truncated=cut,
        num_turns=len(spans),
    )
