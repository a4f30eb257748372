"""Gym 0.7's token-ID capture (``token_id_capture:``), as far as the adapter takes part in it (issue 19).

Gym's model server can record every model call of a rollout (prompt and generation ids, log-probs, how its parent call
was resolved) and supply the parent's exact tokens as ``required_prefix_token_ids`` (``vllm_model``
``supply_prefix_token_ids: true``). Both key their records by the rollout id of the ``/run`` body
(``_ng_rollout_id``), which the rollout client stamps fresh on every dispatch (:mod:`nemo_gym_adapter.rollouts.client`):
Gym's store *appends*, so an id that repeated across steps or GRPO samples would mix rollouts.

What this module decides from Gym's config (``/global_config_dict_yaml``, read when the routes are built,
:meth:`nemo_gym_adapter.gym.head.GymHead.routes`):

- **External staging is refused** (``token_id_capture.external_staging: true``, the "vLLM adapter ``token_in``"
  mode): the inference worker would have to fetch Gym's staged deltas, serve them as the prompt and stage its own
  canonical delta into framework storage, returning commit coordinates. The token-ID patch does none of that, so
  Gym would poison every call (``worker_response_missing_commit_coordinates``); an ``AdapterConfigError`` names the
  key at start-up instead. The built-in path (file store, Gym's default) works with the patched server as is.
- **The default file store's records are retired** after each rollout: ``<dir>/<rollout_id>.tokens.{jsonl,
  incomplete,intents,state.json,lock}`` (``dir``, else Gym's ``model_call_capture_dir``). Gym never retires them for
  a ``/run`` called directly (only its own collector does), so the directory would grow by one set per rollout. A
  custom ``sink`` is left to its owner. Files of a Gym on another host are not there to remove (nothing happens).

Imported by :mod:`nemo_gym_adapter.gym.head` (the check) and the rollout client (the retirement).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import AdapterConfigError

logger = logging.getLogger(__name__)

ROLLOUT_ID_KEY = "_ng_rollout_id"  # the /run body field Gym keys capture and prefix supply by (rollout_correlation)
BLOCK = "token_id_capture"
_SUFFIXES = (".tokens.jsonl", ".tokens.incomplete", ".tokens.intents", ".tokens.state.json", ".tokens.lock")


def new_rollout_id() -> str:
    """A ``_ng_rollout_id`` no other dispatch has (Gym's pattern: ``^[A-Za-z0-9][A-Za-z0-9._-]*$``)."""
    return f"ngv-{uuid.uuid4().hex}"


def capture_dir(global_config: Mapping[str, Any]) -> str | None:
    """The directory of Gym's default capture file store when capture is on, else None. Raises
    ``AdapterConfigError`` naming ``token_id_capture.external_staging`` when Gym's config enables it."""
    block = global_config.get(BLOCK)
    if not isinstance(block, Mapping):
        return None
    if _true(block.get("external_staging")):
        raise AdapterConfigError(
            f"Gym's config sets {BLOCK}.external_staging: true (its 'token_in' capture mode): the inference worker "
            "would have to serve Gym's staged token deltas and stage its own, which the nemo-gym-verl vLLM patch does "
            f"not do, so Gym would mask every call. Set {BLOCK}.external_staging: false (Gym's built-in capture and "
            "prefix supply work with the patched server), or remove the token_id_capture block"
        )
    if not _true(block.get("enabled")) or block.get("sink"):
        return None
    where = block.get("dir") or global_config.get("model_call_capture_dir")
    return str(where) if where else None


def retire(directory: str | None, rollout_ids: Iterable[str]) -> int:
    """Remove the capture files of ``rollout_ids`` under ``directory`` (the rollouts are over); returns how many."""
    if not directory:
        return 0
    removed = 0
    root = Path(directory)
    for rollout_id in rollout_ids:
        for suffix in _SUFFIXES:
            try:
                (root / f"{rollout_id}{suffix}").unlink()
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as e:  # never fail a rollout over its bookkeeping files
                logger.warning("could not remove Gym's capture file %s: %r", root / f"{rollout_id}{suffix}", e)
    return removed


def _true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))
