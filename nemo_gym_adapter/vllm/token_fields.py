"""NeMo RL's token fields on ``choices[].message`` (issue 19 item 5): ``prompt_token_ids``, ``generation_token_ids``
and ``generation_log_probs``, where NeMo RL's OpenAI server puts them, next to vLLM's own ``return_token_ids`` fields
(top-level ``prompt_token_ids``, ``choices[].token_ids``) that Gym 0.7 reads too.

Attached to a non-streaming chat completion whose request asked for log-probs (``logprobs: true``), from the engine's
final ``RequestOutput`` (the prompt ids after the splice: what Gym's prefix supply checks; each choice's sampled ids)
and the response's own ``logprobs.content`` (the values the client sees, vLLM's -9999.0 floor for -inf included, the
same floor as NeMo RL's). All three or none per choice: Gym 0.7's ``vllm_model`` reads a message-level bundle first and
refuses a partial one (``_validate_token_bundle``), and checks it against ``return_token_ids`` when both are present
(the same engine output, so they agree). A choice whose log-probs do not match its ids one to one gets no bundle.
Streaming is not covered (Gym never streams; NeMo RL's server does not either).

Called by the abort guard's wrapper of ``OpenAIServingChat.chat_completion_full_generator``
(:mod:`nemo_gym_adapter.vllm.abort`; the same method in vLLM 0.24 and 0.31); imports nothing of vLLM.
"""

from __future__ import annotations

from typing import Any

FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def attach_token_fields(request: Any, response: Any, final_output: Any) -> Any:
    """Set :data:`FIELDS` on the message of every choice of ``response`` (a ``ChatCompletionResponse``, modified in
    place: it is the object vLLM is about to serialise) when the request asked for log-probs; returns ``response``."""
    if getattr(request, "logprobs", None) is not True or final_output is None:
        return response
    prompt = getattr(final_output, "prompt_token_ids", None)
    if prompt is None:
        return response
    outputs = {getattr(o, "index", i): o for i, o in enumerate(getattr(final_output, "outputs", None) or ())}
    for choice in getattr(response, "choices", None) or ():
        output = outputs.get(getattr(choice, "index", None))
        content = getattr(getattr(choice, "logprobs", None), "content", None)
        if output is None or content is None or len(content) != len(output.token_ids):
            continue
        message = choice.message
        message.prompt_token_ids = list(prompt)
        message.generation_token_ids = list(output.token_ids)
        message.generation_log_probs = [float(entry.logprob) for entry in content]
    return response
