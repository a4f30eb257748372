"""The output budget of a patched request: prompt + output must fit the context, or the engine's context-length 400.

Backend-neutral and pure: the vLLM hook (:mod:`nemo_gym_adapter.vllm.hooks`) and the SGLang hook
(:mod:`nemo_gym_adapter.sglang.hooks`) read the request's ``max_completion_tokens``/``max_tokens`` their own way and
call :func:`clamp_output_budget` with the final (spliced) prompt length and their server's context length. A prompt
that leaves no room for one output token raises :class:`ContextLengthExceeded` worded as vLLM words it ("This model's
maximum context length is N tokens..."): Gym's ``vllm_model`` matches "context length" in a 400 and maps it to
``incomplete_details`` instead of failing the rollout. Imports only the flat ``errors``.
"""

from __future__ import annotations

from nemo_gym_adapter.errors import AdapterError

# OpenAI's two names for the output budget, in the order vLLM and SGLang read them (the first one set wins).
BUDGET_FIELDS = ("max_completion_tokens", "max_tokens")
# The largest budget that is a token count at all: the engines count tokens in 32-bit ints. A larger one (2**63, a
# client's bug or a probe) is refused; any budget up to it that the context cannot hold is clamped (issue 19).
MAX_OUTPUT_TOKENS = 2**31 - 1


class BudgetOutOfRange(AdapterError, ValueError):
    """An output budget that is no token count (above :data:`MAX_OUTPUT_TOKENS`). A ``ValueError``: both engines
    answer 400."""


def check_budget(requested: int | None, field: str) -> None:
    """Raise :class:`BudgetOutOfRange` naming ``field`` for a budget above :data:`MAX_OUTPUT_TOKENS`; smaller ones
    (and None) pass, to be clamped to the context by :func:`clamp_output_budget`."""
    if requested is not None and requested > MAX_OUTPUT_TOKENS:
        raise BudgetOutOfRange(
            f"{field}={requested} is not a token count (at most {MAX_OUTPUT_TOKENS}); a budget larger than the room "
            "the context leaves is served clamped to it, so send the most you want, or omit it"
        )


class ContextLengthExceeded(AdapterError, ValueError):
    """The (spliced) prompt leaves no room for a single output token. A ``ValueError``: both engines answer 400."""


def clamp_output_budget(
    prompt_len: int, max_model_len: int | None, requested: int | None, *, spliced: bool = True
) -> int | None:
    """The output budget for a ``prompt_len``-token prompt: ``min(requested, max_model_len - prompt_len)``.

    ``requested`` None stays None (the engine then uses the rest of the context itself). Raises
    ``ContextLengthExceeded`` with vLLM's own wording when the prompt leaves no room for one output token
    (``spliced``: the message says the prompt length is the one after the token-ID splice).
    """
    if max_model_len is None:
        return requested
    if prompt_len >= max_model_len:
        out = max(requested or 0, 1)
        after = " (after the token-ID splice)" if spliced else ""
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested {out} output "
            f"tokens and your prompt contains {prompt_len} input tokens{after}, for a total of {prompt_len + out} "
            "tokens. Please reduce the length of the input prompt or the number of requested output tokens."
        )
    room = max_model_len - prompt_len
    return requested if requested is None else min(requested, room)
