"""What a chat template writes at turn ends, probed once per server from the tokenizer: :class:`TurnTemplate`.

The splice (:mod:`splice`) counts and walks *turn ends* -- the template's terminator (``<|im_end|>``, ``<|eot_id|>``),
the tokenizer EOS and the generation-config EOS ids -- and needs to know whether the template closes user turns with
one too. That is a property of the chat template, found by rendering a probe conversation, not of any request. Apart
from :mod:`splice` because it runs once per server (decode/encode are fine here) while the splice runs on every turn
and never encodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.errors import TokenAlignmentError

# Probe strings no chat template rewrites, to find what the template writes after assistant (and user) content.
_PROBE_MARKER = "NGVSPLICEPROBE"
_USER_MARKER = "NGVUSERPROBE"


@dataclass(frozen=True)
class TurnTemplate:
    """What a chat template writes at turn ends, and what a generation may end with.

    ``terminator_id``: the token the chat template writes at the end of every assistant turn (``<|im_end|>``,
    ``<|eot_id|>``), which is not necessarily the tokenizer's EOS. ``stop_ids``: every id a generation may end with:
    the terminator, the tokenizer EOS, the generation-config EOS ids. The terminator is always added to ``stop_ids``.
    ``stop_texts``: the text of each stop id (what a message would spell to produce one when rendered).
    ``closes_turns``: the template ends user messages with a stop id too (ChatML, Llama 3), which the in-place edit
    check relies on; False for templates such as Mistral's ``[INST] ... [/INST]``.
    """

    terminator_id: int
    stop_ids: frozenset[int] = frozenset()
    stop_texts: tuple[str, ...] = ()
    closes_turns: bool = True
    # Added/special token ids of the tokenizer: a retokenized unit must keep them where they were (the text check of
    # ``history_check`` accepts other splits of plain text only, never a special token spelled as text).
    added_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not _is_token_id(self.terminator_id):
            raise TokenAlignmentError(
                f"TurnTemplate.terminator_id must be a non-negative int, got {self.terminator_id!r}"
            )
        stops = frozenset(self.stop_ids) | {self.terminator_id}
        bad = sorted(repr(s) for s in stops if not _is_token_id(s))
        if bad:
            raise TokenAlignmentError(f"TurnTemplate.stop_ids must be non-negative ints, got {', '.join(bad)}")
        # Frozen dataclass: normalising a field needs object.__setattr__ (only ever during construction).
        object.__setattr__(self, "stop_ids", stops)


def turn_template_from_tokenizer(
    tokenizer: Any, extra_stop_ids: Iterable[int] = (), *, chat_template: str | None = None
) -> TurnTemplate:
    """Derive the turn terminator from the tokenizer's own chat template, not from ``eos_token_id``.

    Renders a probe conversation (user, assistant with a marker content) without a generation prompt and takes the
    first added/special token the template writes after the marker: ``<|im_end|>`` for ChatML, ``<|eot_id|>`` for
    Llama 3 (whose EOS is ``<|end_of_text|>``). ``extra_stop_ids``: generation-config EOS ids the engine also stops
    at. ``chat_template`` overrides the tokenizer's template (vLLM's ``--chat-template``).

    ``tokenizer`` needs ``apply_chat_template``, ``encode`` and ``get_added_vocab`` or ``added_tokens_decoder``
    (Hugging Face tokenizers and vLLM's tokenizer wrappers have them). Runs once per server, so decode/encode is fine.
    Raises ``TokenAlignmentError`` when the template writes no special token after assistant content.
    """
    special_ids = _added_token_ids(tokenizer)
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": False}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    probes = (
        [{"role": "user", "content": _USER_MARKER}, {"role": "assistant", "content": _PROBE_MARKER}],
        # Some templates insist on a system message first.
        [
            {"role": "system", "content": "probe"},
            {"role": "user", "content": _USER_MARKER},
            {"role": "assistant", "content": _PROBE_MARKER},
        ],
    )
    problems: list[str] = []
    for probe in probes:
        try:
            text = tokenizer.apply_chat_template(probe, **kwargs)
        except Exception as e:  # templates raise arbitrary errors (jinja2 exceptions, ValueError, ...)
            problems.append(f"rendering {len(probe)} messages raised {type(e).__name__}: {e}")
            continue
        if not isinstance(text, str) or _PROBE_MARKER not in text:
            problems.append(f"the {len(probe)}-message render does not contain the assistant content")
            continue
        tail = text[text.rindex(_PROBE_MARKER) + len(_PROBE_MARKER) :]
        tail_ids = tokenizer.encode(tail, add_special_tokens=False)
        terminator = next((t for t in tail_ids if t in special_ids), None)
        if terminator is None:
            problems.append(f"no added/special token after the assistant content (template writes {tail!r})")
            continue
        stops = {terminator, *extra_stop_ids}
        eos = getattr(tokenizer, "eos_token_id", None)
        if _is_token_id(eos):
            stops.add(eos)
        texts = tuple(sorted({t for t in (tokenizer.decode([s]) for s in stops) if t}))
        between = text[text.find(_USER_MARKER) + len(_USER_MARKER) : text.rindex(_PROBE_MARKER)]
        closes = _USER_MARKER in text and any(t in stops for t in tokenizer.encode(between, add_special_tokens=False))
        return TurnTemplate(terminator, frozenset(stops), texts, closes, frozenset(special_ids))
    raise TokenAlignmentError("cannot find the assistant-turn terminator in the chat template: " + "; ".join(problems))


def _is_token_id(value: object) -> bool:
    # bool is an int subclass; True is never a meaningful token id in a JSON payload.
    return type(value) is int and value >= 0


def _added_token_ids(tokenizer: Any) -> set[int]:
    """Ids of added and special tokens: where chat templates' structural tokens live."""
    ids: set[int] = set(getattr(tokenizer, "all_special_ids", None) or ())
    get_added_vocab = getattr(tokenizer, "get_added_vocab", None)
    if callable(get_added_vocab):
        ids.update(get_added_vocab().values())
    ids.update(getattr(tokenizer, "added_tokens_decoder", None) or {})
    return ids
