"""What a request may ask of the patched server: an output budget that fits, and log-probs that are really returned.

Two request checks of the token-ID patch, separate from the splice (:mod:`nemo_gym_adapter.vllm.hooks` calls them):

- **The output budget is clamped to the context on every request** (issue 19 item 3; NeMo RL #2514 does the same):
  ``max_tokens``/``max_completion_tokens`` larger than ``max_model_len - prompt`` becomes exactly that room instead
  of vLLM's 400 ("max_tokens=10000 cannot be greater than max_model_len", or prompt + budget over the context),
  which Gym turns into an empty reply. The budget is lifted while vLLM renders (its own length check would judge the
  unclamped value, and for a spliced request a prompt about to be replaced), restored, then clamped to the room the
  final prompt leaves (:class:`OutputBudget`). Chat (``preprocess_chat``, through the hook) and ``/v1/completions``
  (``preprocess_completion``, :func:`make_completion_wrapper`; the same class as the chat hook in vLLM 0.20-0.24 and
  0.25+). A request without a budget (``/tokenize``, chat without ``max_tokens``) goes to vLLM untouched. A prompt
  that leaves no room at all is vLLM's context-length 400 ("This model's maximum context length is N tokens...",
  which Gym maps to ``incomplete_details``), worded with the budget the client asked for. A budget that is no token
  count at all (above 2**31 - 1, e.g. 2**63) is a 400 naming the field (``tokens.budget.check_budget``).
- **Log-probs are never silently dropped** (issue 19 item 4; Gym #1612): vLLM reads ``logprobs: true`` with
  ``top_logprobs: null`` as "no log-probs" and answers 200 with ``logprobs: null``, so a trainable turn would lose
  them. :func:`check_logprobs_request` answers 400 naming ``top_logprobs`` instead, as NeMo RL's server does.

The budget arithmetic and the context-length wording are the backend-neutral :mod:`nemo_gym_adapter.tokens.budget`
(SGLang's hook clamps with it too); what is here is vLLM's: its request objects, its render methods and its 400. No
vLLM import at module level (vLLM's validation error is imported when raised); imported by ``vllm.hooks`` and
``vllm.patch``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from nemo_gym_adapter.tokens.budget import (
    BUDGET_FIELDS,
    BudgetOutOfRange,
    ContextLengthExceeded,
    check_budget,
    clamp_output_budget,
)

SENTINEL = "__ngv_original__"  # attribute on an installed wrapper, pointing at the original method (= hooks.SENTINEL)
_T = TypeVar("_T")


def bad_request(message: str, parameter: str) -> Exception:
    """vLLM's validation error: its exception handlers answer HTTP 400 with this message."""
    from vllm.exceptions import VLLMValidationError

    return VLLMValidationError(message, parameter=parameter)


class OutputBudget:
    """The request's ``max_tokens``/``max_completion_tokens``: lifted while vLLM renders, clamped after it."""

    def __init__(self, request: Any) -> None:
        fields = getattr(type(request), "model_fields", {})
        self.request = request
        self.saved = {f: getattr(request, f) for f in BUDGET_FIELDS if f in fields}

    @property
    def requested(self) -> int | None:
        """The budget the client asked for (the field vLLM reads), or None."""
        return next((v for f in BUDGET_FIELDS if (v := self.saved.get(f)) is not None), None)

    def check(self) -> None:
        """vLLM's 400 naming the field for a budget that is no token count (``tokens.budget.check_budget``)."""
        for field, value in self.saved.items():
            try:
                check_budget(value, field)
            except BudgetOutOfRange as e:
                raise bad_request(str(e), field) from e

    def lift(self) -> None:
        for f in self.saved:
            setattr(self.request, f, None)

    def restore(self) -> None:
        for f, v in self.saved.items():
            setattr(self.request, f, v)

    async def lifted(self, render: Callable[[], Awaitable[_T]], max_model_len: int | None) -> _T:
        """``await render()`` with the budget lifted, restored afterwards. vLLM's context-length 400 for a prompt that
        alone exceeds the context (then worded "you requested 0 output tokens") says the client's budget instead."""
        self.lift()
        try:
            return await render()
        except Exception as e:  # vLLM's VLLMValidationError (a ValueError in 0.24, a VLLMClientError in 0.31)
            length = getattr(e, "value", None)
            if getattr(e, "parameter", None) != "input_tokens" or type(length) is not int:
                raise
            try:
                clamp_output_budget(length, max_model_len, self.requested, spliced=False)
            except ContextLengthExceeded as worded:
                raise bad_request(str(worded), "input_tokens") from e
            raise
        finally:
            self.restore()

    def clamp(self, prompt_len: int, max_model_len: int | None, *, spliced: bool = True) -> None:
        """Set the budget field vLLM reads to what fits after a ``prompt_len``-token prompt; vLLM's context 400 (a
        ``ContextLengthExceeded``) when nothing fits. A request without budget fields (``/tokenize``) is left alone."""
        if not self.saved:  # /tokenize: no output budget, and vLLM does not length-check it either
            return
        field = next((f for f in BUDGET_FIELDS if self.saved.get(f) is not None), None)
        budget = clamp_output_budget(prompt_len, max_model_len, self.requested, spliced=spliced)
        if field is not None:
            setattr(self.request, field, budget)

    def clamp_inputs(self, engine_inputs: Sequence[Any], max_model_len: int | None) -> None:
        """:meth:`clamp` to the room the longest token prompt of ``engine_inputs`` leaves (a 400 when none is left);
        inputs without token ids (embeddings) are left to vLLM's own checks."""
        lengths = [
            len(e["prompt_token_ids"]) for e in engine_inputs if isinstance(e, Mapping) and "prompt_token_ids" in e
        ]
        if not lengths:
            return
        try:
            self.clamp(max(lengths), max_model_len, spliced=False)
        except ContextLengthExceeded as e:
            raise bad_request(str(e), "input_tokens") from e


def check_logprobs_request(request: Any) -> None:
    """Refuse (400 naming ``top_logprobs``) a chat request that asks for log-probs in the shape vLLM answers without
    any: ``logprobs: true`` with ``top_logprobs: null`` (vLLM computes ``logprobs = top_logprobs if logprobs else
    None``). NeMo RL's server answers the same 400. Requests without ``logprobs`` (``/tokenize``, plain chat, the
    Responses API, whose request has no such field) pass. From vLLM 0.32 the request model itself reads the null as 0
    (the sampled token's log-prob), so the request arrives here with ``top_logprobs=0`` and is served with it."""
    fields = getattr(type(request), "model_fields", {})
    if "top_logprobs" in fields and getattr(request, "logprobs", None) is True and request.top_logprobs is None:
        raise bad_request(
            "nemo-gym-verl: logprobs=true with top_logprobs=null returns no log-probs at all (vLLM reads null as "
            "'none'); send top_logprobs: 0 (the sampled token's log-prob only) or a number, or omit it",
            "top_logprobs",
        )


def make_completion_wrapper(original: Any) -> Any:
    """``preprocess_completion`` (``/v1/completions``) with the budget clamped to the room the prompt(s) leave (the
    module docstring); no splice (completion prompts are text or ids already). Carries the original under
    :data:`SENTINEL`."""

    @functools.wraps(original)
    async def preprocess_completion(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        budget = OutputBudget(request)
        budget.check()
        if budget.requested is None:
            return await original(self, request, *args, **kwargs)
        max_model_len = self.model_config.max_model_len
        engine_inputs = await budget.lifted(lambda: original(self, request, *args, **kwargs), max_model_len)
        budget.clamp_inputs(engine_inputs, max_model_len)
        return engine_inputs

    setattr(preprocess_completion, SENTINEL, original)
    return preprocess_completion
