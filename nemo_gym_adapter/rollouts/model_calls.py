"""The model calls of one ``/run`` output as a token history: which carry no ids, and how many form one contiguous
history (the prompt of call k+1 starts with prompt_k + generation_k exactly).

These are the two questions :mod:`trajectory` asks of ``response.output`` before it builds a trajectory; apart from it
because they read Gym's output items (:mod:`wire`) and say what is wrong with them, with the JSON path, while
:mod:`trajectory` decides what a row becomes (masked, truncated, raised). Linear in the tokens, compared in C.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nemo_gym_adapter.wire.payloads import ModelCall, OutputItem


def calls_without_ids(output: Sequence[OutputItem]) -> list[int]:
    """Output indices ending a model call that carries no token ids.

    Ids sit on the *last* item of each call, so model items after the last id item, or followed by a non-model
    item (a tool output, a user message) before any id item, belong to a call without ids.
    """
    missing, pending = [], None
    for i, item in enumerate(output):
        if item.has_token_ids:
            pending = None
        elif item.is_model_output:
            pending = i
        elif pending is not None:
            missing.append(pending)
            pending = None
    if pending is not None:
        missing.append(pending)
    return missing


def _first_mismatch(actual: Sequence[int], expected: Sequence[int]) -> int:
    """First index where ``actual`` does not continue ``expected`` (``len(actual)`` if it is too short)."""
    n = min(len(actual), len(expected))
    diff = np.flatnonzero(np.asarray(actual[:n], dtype=np.int64) != np.asarray(expected[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


def contiguous_prefix(calls: list[tuple[int, ModelCall]], where: str) -> tuple[int, str]:
    """How many leading calls form a contiguous history, and the first break described ("" when none)."""
    for k in range(1, len(calls)):
        (i_prev, prev), (i_cur, cur) = calls[k - 1], calls[k]
        p_prev, g_prev, p_cur = prev.prompt_token_ids, prev.generation_token_ids, cur.prompt_token_ids
        need = len(p_prev) + len(g_prev)
        # List slices compare in C; no per-token Python loop on the hot path.
        if len(p_cur) >= need and p_cur[: len(p_prev)] == p_prev and p_cur[len(p_prev) : need] == g_prev:
            continue
        expected = p_prev + g_prev
        j = _first_mismatch(p_cur, expected)
        got = p_cur[j : j + 4] if j < len(p_cur) else "<end of prompt>"
        return k, (
            f"{where}: model call {k} is not contiguous: response.output[{i_cur}].prompt_token_ids[{j}:] = {got} "
            f"but call {k - 1} (response.output[{i_prev}]) prompt+generation has {expected[j : j + 4]} there "
            f"(expected the {need} tokens of prompt_{k - 1} + generation_{k - 1} as prefix; prompt_{k} has "
            f"{len(p_cur)} tokens)"
        )
    return len(calls), ""


def _extends(prompt: Sequence[int], prev: ModelCall) -> bool:
    """Does ``prompt`` start with ``prev``'s prompt + generation (list slices: compared in C)?"""
    p, g = prev.prompt_token_ids, prev.generation_token_ids
    need = len(p) + len(g)
    return len(prompt) >= need and prompt[: len(p)] == p and prompt[len(p) : need] == g


def prefix_segments(calls: list[tuple[int, ModelCall]]) -> list[list[int]]:
    """Split a rollout's model calls into prefix-consistent segments (``nemo_gym.trajectory.contiguity: split``).

    Returns lists of positions into ``calls``; every call is in exactly one segment, in call order, and within a
    segment each call's prompt starts with the previous call's prompt + generation (one contiguous history). A call
    joins the open segment whose *last* call it extends (the longest such one when several do); otherwise it starts
    a new segment, whose prompt then holds the tokens it shares with earlier calls (their generations included) as
    prompt, mask 0. So every generated token is trained in exactly one segment, and no token the model did not
    generate is ever trained. A call that extends an *earlier* call of a segment (a branch: a reflection or a
    compaction that resumed from an older state) starts its own segment rather than re-training the shared part.
    Cost: one prefix comparison per open segment per call (segments are few: one per context rewrite).
    """
    segments: list[list[int]] = []
    for k, (_, call) in enumerate(calls):
        best, best_len = None, -1
        for s, segment in enumerate(segments):
            tail = calls[segment[-1]][1]
            size = len(tail.prompt_token_ids) + len(tail.generation_token_ids)
            if size > best_len and _extends(call.prompt_token_ids, tail):
                best, best_len = s, size
        if best is None:
            segments.append([k])
        else:
            segments[best].append(k)
    return segments
