"""A validation pass through Gym, per environment: our metrics plus each environment's own ``/aggregate_metrics``.

verl runs validation as a series of ``generate_sequences`` calls (``meta_info["validate"]``) and logs only what it
computes from the returned rewards (``val-core/<data_source>/reward/mean@N``, with a masked sample counted as 0). A
:class:`ValidationPass` collects every validation row's result across those calls; :meth:`ValidationPass.metrics`
then returns, under verl's own naming for validation metrics (``val-core/<env>/...`` for the headline numbers,
``val-aux/<env>/...`` for the rest; ``<env>`` as in ``metrics``, ``all`` for every environment):

* ``val-core/<env>/gym/reward_mean`` and ``success_rate`` (over unmasked samples, ``metrics.compute_metrics``),
  ``val-aux/<env>/gym/<name>`` for the other metrics of that module (masked rate by reason, turns, tokens, ...);
* Gym's own numbers (``gym_aggregate=True``): the results of each environment are POSTed, stripped as Gym's own
  collector strips them (no ``response`` but its ``usage``/``incomplete_details``, each with ``_ng_task_index`` =
  the dataset row and ``_ng_rollout_index`` = its repeat), to ``/aggregate_metrics`` of the environment server that
  served them (Gym 0.7: what ``ng_collect_rollouts`` logs). Its ``key_metrics`` become
  ``val-core/<env>/gym_aggregate/<key>``, the other numeric ``agent_metrics`` ``val-aux/<env>/gym_aggregate/<key>``.
  A failed call is logged as a warning and ``val-aux/<env>/gym_aggregate/failed`` = 1; it never fails a run.

Rows Gym could not serve have no result to aggregate; they count in our masked rates.
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemo_gym_adapter.access.gym_guard import client_headers
from nemo_gym_adapter.data.routing import GymRoutes
from nemo_gym_adapter.rollouts.core import RowResult
from nemo_gym_adapter.rollouts.metrics import compute_metrics, scope_name

logger = logging.getLogger(__name__)

CORE_METRICS = ("reward_mean", "success_rate")
TASK_INDEX_KEY = "_ng_task_index"  # = nemo_gym.global_config.TASK_INDEX_KEY_NAME
ROLLOUT_INDEX_KEY = "_ng_rollout_index"  # = nemo_gym.global_config.ROLLOUT_INDEX_KEY_NAME
# What Gym's collector leaves out of a result before /aggregate_metrics (rollout_collection._call_aggregate_metrics).
_HEAVY_FIELDS = (
    "response",
    "responses_create_params",
    "ng_agent_observations",
    "ng_model_call_capture",
    "_ng_trajectory",
)


def strip_result(result: Mapping[str, Any], task_index: int, rollout_index: int) -> dict[str, Any]:
    """A ``/run`` result as Gym's collector sends it to ``/aggregate_metrics``."""
    entry = {k: v for k, v in result.items() if k not in _HEAVY_FIELDS}
    response = result.get("response")
    if isinstance(response, Mapping):
        kept = {k: response[k] for k in ("usage", "incomplete_details") if response.get(k) is not None}
        if kept:
            entry["response"] = kept
    entry[TASK_INDEX_KEY] = int(task_index)
    entry[ROLLOUT_INDEX_KEY] = int(rollout_index)
    return entry


def aggregate_metric_names(env: str, aggregate: Mapping[str, Any]) -> dict[str, float]:
    """Gym's ``AggregateMetrics`` answer → flat validation metrics (numbers only; bools as 0/1)."""
    out: dict[str, float] = {}
    key_metrics = aggregate.get("key_metrics") or {}
    for section, values in (("val-core", key_metrics), ("val-aux", aggregate.get("agent_metrics") or {})):
        for name, value in values.items():
            if section == "val-aux" and name in key_metrics:
                continue
            number = _number(value)
            if number is not None:
                out[f"{section}/{env}/gym_aggregate/{name}"] = number
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def post_aggregate_metrics(base_url: str, verify_responses: Sequence[Mapping[str, Any]], timeout_s: float) -> Any:
    """``POST <environment server>/aggregate_metrics`` (blocking); raises ``OSError``/``ValueError`` on failure."""
    body = json.dumps({"verify_responses": list(verify_responses)}).encode()
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}/aggregate_metrics",
        data=body,
        headers={"Content-Type": "application/json", **client_headers()},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


class ValidationPass:
    """Results of one validation pass, collected over several ``generate_sequences`` calls (module docstring)."""

    def __init__(
        self,
        routes: GymRoutes,
        *,
        success_threshold: float | None = None,
        gym_aggregate: bool = True,
        timeout_s: float = 120.0,
    ) -> None:
        self.routes = routes
        self.success_threshold = success_threshold
        self.gym_aggregate = gym_aggregate
        self.timeout_s = timeout_s
        self.rows: list[RowResult] = []
        self.task_indices: list[int] = []

    def add(self, rows: Iterable[RowResult], task_indices: Sequence[int]) -> None:
        """Rows of one validation batch; ``task_indices[i]``: the dataset row of ``rows[i]`` (its repeats share it)."""
        rows = list(rows)
        if len(rows) != len(task_indices):
            raise ValueError(f"ValidationPass.add: {len(rows)} rows but {len(task_indices)} task indices")
        self.rows.extend(rows)
        self.task_indices.extend(int(t) for t in task_indices)

    def __len__(self) -> int:
        return len(self.rows)

    def metrics(self) -> dict[str, float]:
        """The pass's validation metrics (module docstring); ``{}`` when nothing was collected."""
        if not self.rows:
            return {}
        ours = compute_metrics(
            [r.segments or r.trajectory for r in self.rows], prefix="val", success_threshold=self.success_threshold
        )
        out: dict[str, float] = {}
        for key, value in ours.items():
            _, scope, name = key.split("/", 2)
            section = "val-core" if name in CORE_METRICS else "val-aux"
            out[f"{section}/{scope}/gym/{name}"] = value
        if self.gym_aggregate:
            out.update(self._aggregate())
        return out

    def _aggregate(self) -> dict[str, float]:
        by_env: dict[str, list[dict[str, Any]]] = defaultdict(list)
        repeats: dict[tuple[str, int], int] = defaultdict(int)
        for row, task in zip(self.rows, self.task_indices, strict=True):
            result, agent = row.outcome.result, row.outcome.agent
            if result is None or agent is None:
                continue
            rollout = repeats[(agent, task)]
            repeats[(agent, task)] += 1
            by_env[agent].append(strip_result(result, task, rollout))
        out: dict[str, float] = {}
        for agent, responses in sorted(by_env.items()):
            env = scope_name(agent)
            routes = self.routes.servers_by_agent.get(agent, ())
            if len(routes) != 1:
                continue  # such rows were unroutable: nothing came back to aggregate
            try:
                answer = post_aggregate_metrics(routes[0].base_url, responses, self.timeout_s)
                if not isinstance(answer, Mapping):
                    raise ValueError(f"expected a JSON object, got {type(answer).__name__}")
            except (OSError, ValueError, urllib.error.URLError) as e:
                logger.warning("%s/aggregate_metrics for %s failed: %s", routes[0].base_url, agent, e)
                out[f"val-aux/{env}/gym_aggregate/failed"] = 1.0
                continue
            out.update(aggregate_metric_names(env, answer))
        return out
