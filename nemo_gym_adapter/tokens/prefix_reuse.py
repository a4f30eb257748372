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

One more condition is checked rather than assumed, once per tokenizer: that a segment tokenizes the same alone as after
a stop token (:func:`_segments_independent`). A SentencePiece ``Metaspace`` pre-tokenizer with ``prepend_scheme:
first`` breaks it (only the text's first piece gets the word-start marker, so a segment alone would get one it does
not get inside the render): such a tokenizer takes the slow path.

Cost, linear in the conversation and kept small because this runs on every spliced request: both texts split at stop
texts (C regex), the leading run where the prefix agrees with the full render part for part taken as one slice of the
full render's ids (at agentic length that is everything but the last turn), the rest segment by segment. The result
is a :class:`~nemo_gym_adapter.tokens.stops.Stops` whose stop positions come from the full render's (found once per
request) and need no scan of their own.

Backend-neutral and pure (text and ids in, ids out; ``tokenizer`` is only inspected and probed): the vLLM hook
(:mod:`nemo_gym_adapter.vllm.prefix_render`) and the SGLang hook (:mod:`nemo_gym_adapter.sglang.hooks`) render the
two texts their own way and call :func:`prefix_render_by_segments`. Imports only :mod:`stops`.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.tokens.stops import Stops, stop_positions


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

    Exact when the tokenizer is a fast (Rust) Hugging Face tokenizer, every stop id is an added token matched
    verbatim (not normalized, no lstrip/rstrip/single_word, which would let it absorb neighbouring text), and a
    segment tokenizes the same after a stop token as alone (:func:`_segments_independent`, probed once).
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
    result = StopTexts.of(verbatim) if exact and _segments_independent(tokenizer, verbatim) else None
    try:
        _CACHE[tokenizer] = (stop_ids, result)
    except TypeError:
        pass
    return result


# Text after a stop token that a position-dependent pre-tokenizer would tokenize differently alone: a word (the
# word-start marker of SentencePiece), a space, a newline, text right after the stop token.
_PROBES = ("Hello", " world", "\nline two", "x y")


def _segments_independent(tokenizer: Any, verbatim: Mapping[str, int]) -> bool:
    """Does text tokenize the same alone as right after each stop token (and before it)? False also when the
    tokenizer cannot be asked (no ``encode``): the caller then tokenizes whole, which is always exact."""
    try:
        for text, stop in verbatim.items():
            for probe in _PROBES:
                whole = tokenizer.encode(f"{probe}{text}{probe}", add_special_tokens=False)
                alone = tokenizer.encode(probe, add_special_tokens=False)
                if list(whole) != [*alone, stop, *alone]:
                    return False
    except Exception:  # an unusual tokenizer: no exactness claim
        return False
    return True


def prefix_render_by_segments(
    prefix_text: str,
    full_text: str,
    full: Sequence[int] | Stops,
    stops: StopTexts,
    encode: Callable[[str], list[int]],
) -> Stops | None:
    """Token ids of ``prefix_text`` with their stop positions, reusing ``full`` (the ids of ``full_text``, as
    ``Stops`` when the caller found its stop positions already) segment by segment.

    ``encode(text)`` tokenizes without adding special tokens. Returns None when the stop texts of ``full_text`` and
    the stop ids of ``full`` do not correspond one to one, in order (a stop text inside another added token, or
    ids that are not this text's). Pure: inputs are not modified.
    """
    stop_ids = frozenset(stops.ids.values())
    full = Stops.for_stops(full, stop_ids)
    full_ids, positions = full.ids, full.at
    full_parts = stops.pattern.split(full_text)  # [segment, stop, segment, ..., segment]
    if [stops.ids[t] for t in full_parts[1::2]] != [full_ids[p] for p in positions]:
        return None
    parts = stops.pattern.split(prefix_text)
    # The leading run of parts (segments and stop texts alternate) the prefix shares with the full render: its ids
    # are the full render's up to the run's last shared stop, one slice, positions included.
    limit = min(len(parts), len(full_parts))
    same = 0
    while same < limit and parts[same] == full_parts[same]:
        same += 1
    first = same // 2  # segments 0 .. first-1 and the stops after them are shared
    out = full_ids[: positions[first - 1] + 1] if first else []
    at = positions[:first]
    bounds = [-1, *positions, len(full_ids)]
    full_segments = full_parts[::2]
    for i in range(first, len(parts[::2])):
        segment = parts[2 * i]
        if i < len(full_segments) and segment == full_segments[i]:
            out += full_ids[bounds[i] + 1 : bounds[i + 1]]  # between two stops of the full render: none inside
        elif segment:
            piece = encode(segment)
            at += [len(out) + p for p in stop_positions(piece, stop_ids)]
            out += piece
        if 2 * i + 1 < len(parts):
            at.append(len(out))
            out.append(stops.ids[parts[2 * i + 1]])
    return Stops(out, at, stop_ids)


def prefix_ids_by_segments(
    prefix_text: str,
    full_text: str,
    full_ids: Sequence[int] | Stops,
    stops: StopTexts,
    encode: Callable[[str], list[int]],
) -> list[int] | None:
    """:func:`prefix_render_by_segments`, the ids alone."""
    found = prefix_render_by_segments(prefix_text, full_text, full_ids, stops, encode)
    return None if found is None else found.ids
