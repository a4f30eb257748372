"""What the policy's servers (vLLM or SGLang) say about themselves, over HTTP (no verl, no engine import).

* :func:`read_model_card`: the served model name and ``max_model_len`` from ``GET /v1/models`` of every replica
  (they must all serve the same model; the context length is the smallest any of them reports). verl serves the
  local model path as the name, and Gym must ask for exactly that name.
* :func:`probe_logprob`: the mean log-probability one replica gives a fixed prompt, with the weights it serves right
  now: vLLM's ``/v1/completions`` with ``prompt_logprobs`` (``api="completions"``), or SGLang's native ``/generate``
  with ``logprob_start_len: 0`` (``api="generate"``; its OpenAI API has no prompt log-probs). Read once per step it
  moves only when the trainer's weight sync changed the engine: a step-over-step check that training reaches it.

Addresses are verl's replica keys, ``"host:port"`` (``"[v6]:port"`` for IPv6), or OpenAI base URLs (``…/v1``);
:func:`base_url` turns one into the OpenAI base URL Gym's model server is given. ``api_key``: the run's rollout key
(``nemo_gym_adapter.access``), sent as ``Authorization: Bearer`` on every request; None for a server without one.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import SecretStr

from nemo_gym_adapter.errors import ServerError

logger = logging.getLogger(__name__)

# The engine probe's prompt: plain text every tokenizer splits into a dozen tokens or more.
PROBE_TEXT = "The weather in Paris is sunny and the city is quiet today."


def base_url(address: str) -> str:
    """``"host:port"`` → ``"http://host:port/v1"``; a URL (any OpenAI-compatible ``…/v1``) is kept as it is."""
    return address.rstrip("/") if "://" in address else f"http://{address}/v1"


@dataclass(frozen=True)
class ModelCard:
    """What the replicas serve: the model ``name`` requests must use, and the smallest ``max_model_len`` any of them
    reports (None when none does)."""

    name: str
    max_model_len: int | None


def auth_headers(api_key: SecretStr | str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <key>"}`` for a rollout key, ``{}`` for None."""
    value = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
    return {"Authorization": f"Bearer {value}"} if value else {}


def read_model_card(
    replicas: Mapping[str, str], timeout_s: float = 60.0, *, api_key: SecretStr | str | None = None
) -> ModelCard:
    """``GET /v1/models`` of every replica (``{address: label}``; the label, e.g. the Ray actor name, goes in errors).

    Raises:
        ServerError: a replica does not answer or answers without a model, or the replicas serve different models.
    """
    names, lengths = set(), set()
    for address, label in replicas.items():
        url = f"{base_url(address)}/models"
        try:
            request = urllib.request.Request(url, headers=auth_headers(api_key))
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                card = json.load(response)["data"][0]
        except (OSError, ValueError, KeyError, IndexError) as e:
            raise ServerError(f"rollout replica {address} ({label}): GET {url} failed: {e}") from e
        names.add(card["id"])
        lengths.add(card.get("max_model_len"))
    if len(names) != 1:
        raise ServerError(f"the rollout replicas serve different models: {sorted(names)}")
    return ModelCard(name=names.pop(), max_model_len=min((n for n in lengths if n), default=None))


def effective_max_model_len(configured: int | None, served: int | None) -> int | None:
    """The context length trajectories are budgeted against: the smaller of the configured and the served one."""
    if configured is not None and served is not None:
        return min(configured, served)
    return configured or served


def probe_logprob(
    address: str,
    model: str,
    token_ids: Sequence[int],
    timeout_s: float = 60.0,
    *,
    api: str = "completions",
    api_key: SecretStr | str | None = None,
) -> float | None:
    """Mean log-probability of ``token_ids[1:]`` given their prefix, from the replica at ``address``; ``api``:
    ``completions`` (vLLM) or ``generate`` (SGLang), see the module docstring.

    A failed probe never fails a step: it is logged and None is returned (as for a prompt under two tokens).
    """
    ids = [int(t) for t in token_ids]
    if len(ids) < 2:
        return None
    if api == "generate":
        url = base_url(address).removesuffix("/v1") + "/generate"
        sampling = {"max_new_tokens": 1, "temperature": 0.0}
        body: dict = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True, "logprob_start_len": 0}
    else:
        url = f"{base_url(address)}/completions"
        body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    headers = {"Content-Type": "application/json", **auth_headers(api_key)}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.load(response)
        if api == "generate":  # SGLang: [(logprob, token id, text)] per prompt token, None for the first
            entries = answer["meta_info"]["input_token_logprobs"]
            if [int(e[1]) for e in entries] != ids:
                raise ValueError("input_token_logprobs are not the probe's tokens")
            values = [float(e[0]) for e in entries[1:]]
        else:
            entries = answer["choices"][0]["prompt_logprobs"]
            values = [float(entry[str(tok)]["logprob"]) for tok, entry in zip(ids[1:], entries[1:], strict=True)]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        logger.warning("engine probe on %s failed: %s", address, e)
        return None
    return sum(values) / len(values)
