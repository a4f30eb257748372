"""Where a request's model-made tokens end, and the spliced prompt built from there: one implementation for every
backend.

A request is spliced when an assistant message carries ``prompt_token_ids``/``generation_token_ids`` (Gym's
``vllm_model`` with ``return_token_id_information``) or the request carries Gym's ``required_prefix_token_ids``
(``supply_prefix_token_ids``, NeMo RL's server field). :func:`find_anchor` reads that from plain messages and the
request's required-prefix value; :func:`splice_request` then builds the prompt from the two renders the backend made
(the full request, and the messages through the anchor without a generation prompt) with the splice
(:mod:`nemo_gym_adapter.tokens.splice`: exact history, in-place edits refused, a retokenized history kept
(:mod:`nemo_gym_adapter.tokens.same_text`), the ``assistant_edits`` policy) and checks the required prefix. A required
prefix on a conversation without any assistant message (NeMo RL's merged-tokens case) anchors at index -1: the prefix
is the model prefix by itself, matched by turn count and text (:mod:`nemo_gym_adapter.tokens.required_prefix`), and
the backend renders no prefix (:attr:`Anchor.renders_prefix`).

The backends only differ in where they find these values and how they render: the vLLM hook
(:mod:`nemo_gym_adapter.vllm.hooks`) reads the required prefix from vLLM's request model and renders through vLLM; the
SGLang hook (:mod:`nemo_gym_adapter.sglang.hooks`) reads both from the raw request body (SGLang's request model drops
unknown fields) and renders through the server's tokenizer. Pure; imports the splice and the flat ``errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.required_prefix import KEY as REQUIRED_PREFIX_KEY  # Gym's prefix supply, NeMo RL's field
from nemo_gym_adapter.tokens.required_prefix import splice_required_prefix
from nemo_gym_adapter.tokens.same_text import SameText
from nemo_gym_adapter.tokens.splice import check_token_ids, last_tokenized_assistant, splice_prompt, turn_history
from nemo_gym_adapter.tokens.stops import Stops
from nemo_gym_adapter.tokens.turn_template import TurnTemplate

SPLICE_ERROR = "nemo-gym-verl token splice"  # how every splice refusal (an HTTP 400) starts


@dataclass(frozen=True)
class Anchor:
    """Where the model's own tokens end: message ``index``, its ``model_prefix``, and Gym's required prefix."""

    index: int  # -1: no assistant message at all (the required prefix alone; no prefix render)
    model_prefix: list[int]
    required: list[int] | None
    from_messages: bool = True  # False: Gym's required prefix alone, no per-turn ids to check the history with

    @property
    def renders_prefix(self) -> bool:
        """Does the splice need ``messages[:index+1]`` rendered without a generation prompt (``prefix_ids`` of
        :func:`splice_request`)? Not for a required prefix on a conversation without an assistant message."""
        return self.index >= 0


def required_prefix(value: Any, vocab_size: int | None = None) -> list[int] | None:
    """A request's ``required_prefix_token_ids`` value, checked: None (absent or empty) or a list of token ids in the
    engine's vocabulary ``[0, vocab_size)``.

    Raises ``TokenAlignmentError`` naming the element for anything else (``splice.check_token_ids``: booleans,
    floats, strings, negative or out-of-vocabulary ids)."""
    if value is None or (isinstance(value, list) and not value):
        return None
    if not isinstance(value, list):
        raise TokenAlignmentError(f"{REQUIRED_PREFIX_KEY} must be a list of token ids, got {type(value).__name__}")
    check_token_ids(value, REQUIRED_PREFIX_KEY, vocab_size)
    return value


def find_anchor(messages: Sequence[Any], required: list[int] | None, vocab_size: int | None = None) -> Anchor | None:
    """The splice anchor of a request (``messages``: dicts; ``required``: from :func:`required_prefix`), or None to
    leave the request to the stock engine (no assistant message carries ids and no required prefix is given).

    Raises ``TokenAlignmentError`` for malformed ids, naming the message, field and element; ``vocab_size``: the
    engine's vocabulary, every id of the model prefix must be in it."""
    found = last_tokenized_assistant(messages, vocab_size)
    if found is not None:
        return Anchor(found[0], found[1], required)
    if required is None:
        return None
    # Gym's prefix supply without ids on the messages: the required prefix is the parent call's prompt + generation,
    # which ends at the last assistant message. The splice's turn count still checks that this holds. No assistant
    # message at all (NeMo RL's merged-tokens case): -1, the prefix is matched by turn count and text alone.
    index = next((i for i in range(len(messages) - 1, -1, -1) if role_of(messages[i]) == "assistant"), -1)
    return Anchor(index, list(required), required, from_messages=False)


def role_of(message: Any) -> Any:
    """A message's role, whether it is a dict or an object with a ``role`` attribute."""
    return message.get("role") if isinstance(message, Mapping) else getattr(message, "role", None)


def splice_request(
    anchor: Anchor,
    messages: Sequence[Mapping[str, Any]],
    prefix_ids: list[int] | Stops | None,
    full_ids: list[int] | Stops,
    template: TurnTemplate,
    *,
    decode: Callable[[list[int]], str] | None,
    assistant_edits: str,
    same_text: SameText | None = None,
) -> list[int]:
    """The prompt for a request anchored at ``anchor``: ``prefix_ids`` is ``messages[:anchor.index+1]`` rendered
    without a generation prompt (None when ``anchor.renders_prefix`` is false), ``full_ids`` the whole request as the
    engine rendered it (see :func:`~nemo_gym_adapter.tokens.splice.splice_prompt`); either may come as
    :class:`~nemo_gym_adapter.tokens.stops.Stops` of the template's stop ids, so their turn ends are found once per
    request. ``messages`` are the request's
    messages with their ids (the history check reads them). ``same_text``: the tokenizer's exact text comparison
    (:meth:`SameText.for_tokenizer`): a history unit spelled in other tokens than the render is kept, not refused;
    None: any difference is an edit. Raises ``TokenAlignmentError`` (an edited history, a turn-count mismatch, a
    required prefix the spliced prompt does not start with or that does not spell the conversation)."""
    if not anchor.renders_prefix:  # the required prefix alone: no assistant message to render a prefix through
        full = full_ids.ids if isinstance(full_ids, Stops) else full_ids
        prompt = splice_required_prefix(anchor.model_prefix, full, template, same_text=same_text)
    else:
        if prefix_ids is None:
            raise ValueError("splice_request: prefix_ids is required for an anchor at an assistant message")
        history = turn_history(messages, anchor.index, template.stop_texts) if anchor.from_messages else None
        prompt = splice_prompt(
            anchor.model_prefix,
            prefix_ids,
            full_ids,
            template,
            history,
            decode=decode,
            assistant_edits=assistant_edits,
            same_text=same_text,
        )
    if anchor.required is not None and prompt[: len(anchor.required)] != anchor.required:
        raise TokenAlignmentError(
            f"{REQUIRED_PREFIX_KEY} ({len(anchor.required)} ids) is not a prefix of the spliced prompt "
            f"({len(prompt)} ids): it disagrees with the assistant message's token ids"
        )
    return prompt
