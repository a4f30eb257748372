"""The prefix render at template cost: token ids of a conversation's head reused from the full render's ids.

The splice (:mod:`nemo_gym_adapter.tokens.splice`) needs the token ids of ``messages[:k+1]`` rendered without a
generation prompt. Tokenizing that text again costs as much as the request's own render, because tokenization
dominates it (an 8-turn, ~8k-token conversation: ~0.3 ms of Jinja, ~40 ms of tokenizing): the patched request would
take ~2x.

Why reuse is exact: a fast Hugging Face tokenizer splits *added* tokens off the text before normalizing,
pre-tokenizing and BPE, so the text between two added tokens tokenizes the same alone as inside a longer text. The
turn-end (stop) tokens of chat templates are such tokens. So we cut the prefix text and the full text at stop tokens:
a prefix segment equal to the full render's segment at the same position reuses that segment's ids; only differing
segments are tokenized (the tail after the last turn end, and a turn the template renders differently at the end of
a conversation, e.g. Qwen3's empty think block). Whenever that reasoning does not provably hold (slow tokenizer, stop
token not matched verbatim, stop texts and stop ids not one-to-one in the full render) the functions here return None
and the caller renders the prefix through its engine instead.

Backend-neutral and pure (text and ids in, ids out; ``tokenizer`` is only inspected): the vLLM hook
(:mod:`nemo_gym_adapter.vllm.prefix_render`) and the SGLang hook (:mod:`nemo_gym_adapter.sglang.hooks`) render the
two texts their own way and call :func:`prefix_ids_by_segments`. Imports only the splice's ``stop_positions``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.tokens.splice import stop_positions


@dataclass(frozen=True)
class StopTexts:
    """The text of each stop id, and a regex that splits text at them (keeping the stop texts)."""

    ids: dict[str, int]
    pattern: re.Pattern

    @classmethod
    def of(cls, ids: Mapping[str, int]) -> StopTexts:
        # Longest first, so a stop text that contains another one wins at the same position.
        alternatives = "|".join(re.escape(t) for t in sorted(ids, key=len, reverse=True))
        return cls(dict(ids), re.compile(f"({alternatives})"))


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stop_texts_for(tokenizer: Any, stop_ids: frozenset[int]) -> StopTexts | None:
    """``StopTexts`` for ``tokenizer`` when segment-wise tokenization is exact, else None. Cached per tokenizer.

    Exact when the tokenizer is a fast (Rust) Hugging Face tokenizer and every stop id is an added token matched
    verbatim (not normalized, no lstrip/rstrip/single_word, which would let it absorb neighbouring text).
    """
    try:
        cached = _CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable: compute every time (cheap, but no cache)
        cached = None
    if cached is not None and cached[0] == stop_ids:
        return cached[1]
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    verbatim = {
        tok.content: i
        for i, tok in decoder.items()
        if i in stop_ids and not (tok.lstrip or tok.rstrip or tok.single_word or tok.normalized)
    }
    exact = getattr(tokenizer, "is_fast", False) and set(verbatim.values()) == set(stop_ids) and stop_ids
    result = StopTexts.of(verbatim) if exact else None
    try:
        _CACHE[tokenizer] = (stop_ids, result)
    except TypeError:
        pass
    return result


def prefix_ids_by_segments(
    prefix_text: str,
    full_text: str,
    full_ids: Sequence[int],
    stops: StopTexts,
    encode: Callable[[str], list[int]],
) -> list[int] | None:
    """Token ids of ``prefix_text``, reusing ``full_ids`` (the ids of ``full_text``) segment by segment.

    ``encode(text)`` tokenizes without adding special tokens. Returns None when the stop texts of ``full_text`` and
    the stop ids of ``full_ids`` do not correspond one to one, in order (a stop text inside another added token, or
    ids that are not this text's). Pure: inputs are not modified.
    """
    full_parts = stops.pattern.split(full_text)  # [segment, stop, segment, ..., segment]
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
