"""One Gym dataset row: what makes it valid (:func:`validate_row`), the validated row (:class:`GymRow`) and a load's
rows read back from the memory-mapped cache (:class:`GymRows`).

Apart from :mod:`dataset` (reading files into the cache, verl's ``data.custom_cls``) because this is the row's own
contract, the same whoever reads the rows: ``responses_create_params`` as Gym 0.7 accepts it (``extra='forbid'``,
``input`` a string or a list of message objects, empty allowed as in Gym), routing to one environment
(:mod:`routing`), and every message naming ``file:line``, the JSON path, expected vs actual. Its source is part of the cache key (``dataset._validator_fingerprint``): changing a check
here re-validates cached datasets.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from pydantic import ValidationError

from nemo_gym_adapter.data import store as dataset_store
from nemo_gym_adapter.data.routing import env_name_of
from nemo_gym_adapter.data.store import StoredRows
from nemo_gym_adapter.errors import DatasetError
from nemo_gym_adapter.wire.payloads import RESPONSES_CREATE_PARAMS_FIELDS, describe_validation_error, parse_dataset_row

_PARAMS_KEY = "responses_create_params"


@dataclass(frozen=True)
class GymRow:
    """One validated dataset row.

    ``data`` is the JSON object exactly as read (treat as read-only; :meth:`to_dict` gives a private copy).
    ``env_name`` is the normalised environment (agent) name; ``path``/``line`` locate the row (line is 1-based).
    """

    data: Mapping[str, Any]
    env_name: str
    path: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def responses_create_params(self) -> Mapping[str, Any]:
        return self.data[_PARAMS_KEY]

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the row, safe to hand to code that might modify it."""
        return copy.deepcopy(dict(self.data))


class GymRows(Sequence[GymRow]):
    """The validated rows of a load, read from the memory-mapped cache on access (each access parses afresh).

    ``store`` gives the raw records (JSON text, environment, location) without parsing; ``dataset`` is the
    underlying ``datasets.Dataset`` (columns ``row``, ``env``, ``file``, ``line``; all rows, not only a selection).
    """

    def __init__(self, store: StoredRows) -> None:
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    @overload
    def __getitem__(self, item: int) -> GymRow: ...
    @overload
    def __getitem__(self, item: slice) -> GymRows: ...
    def __getitem__(self, item: int | slice) -> GymRow | GymRows:
        if isinstance(item, slice):
            return self.select(range(len(self))[item])
        return _to_row(self.store.record(item))

    def __iter__(self) -> Iterator[GymRow]:
        return map(_to_row, self.store.records())

    def select(self, indices: Iterable[int]) -> GymRows:
        """The rows at these positions, in this order (a view: nothing is copied)."""
        return GymRows(self.store.select(list(indices)))

    @property
    def env_counts(self) -> dict[str, int]:
        """Rows per environment name."""
        return self.store.env_counts()

    @property
    def dataset(self) -> Any:
        return self.store.dataset


def _to_row(record: dataset_store.RowRecord) -> GymRow:
    return GymRow(data=json.loads(record.text), env_name=record.env, path=record.path, line=record.line)


def _suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_params(params: Any, where: str) -> None:
    """Structural checks of ``responses_create_params`` that pydantic alone would report less clearly."""
    if not isinstance(params, Mapping):
        raise DatasetError(f"{where}: {_PARAMS_KEY} must be an object, got {type(params).__name__}")
    unknown = sorted(set(map(str, params)) - RESPONSES_CREATE_PARAMS_FIELDS)
    if unknown:
        details = ", ".join(f"{k!r}{_suggest(k, RESPONSES_CREATE_PARAMS_FIELDS)}" for k in unknown)
        raise DatasetError(f"{where}: {_PARAMS_KEY} has field(s) Gym 0.7 rejects (extra='forbid'): {details}")
    if "input" not in params:
        raise DatasetError(f"{where}: {_PARAMS_KEY}.input is required (a string or a list of message items)")
    value = params["input"]
    # Empty is Gym's contract too (NeMoGymResponseCreateParamsNonStreaming.input: str | list, no minimum): agents that
    # build the dialogue from other row fields (scicode_agent, toolsandbox_agent, aviary, harbor) ship `input: []`.
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                raise DatasetError(
                    f"{where}: {_PARAMS_KEY}.input[{i}] must be an object, got {type(item).__name__} {item!r:.60}"
                )
    elif not isinstance(value, str):
        raise DatasetError(f"{where}: {_PARAMS_KEY}.input must be a string or a list, got {type(value).__name__}")


def validate_row(
    row: Any,
    where: str,
    *,
    known_agents: Collection[str] | None = None,
    task_source_map: Mapping[str, str] | None = None,
    default_agent: str | None = None,
) -> str:
    """Check one decoded row; return its environment name.

    Raises:
        DatasetError: the message starts with ``where`` and names the JSON path, expected vs actual.
    """
    if not isinstance(row, Mapping):
        raise DatasetError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    if _PARAMS_KEY not in row and isinstance(row.get("task_id"), Mapping) and "task_input" in row:
        raise DatasetError(
            f"{where}: materialized task rows (task_id + task_input, routed through environment_server_routes) "
            f"are not supported; use flat Gym rows with {_PARAMS_KEY!r}"
        )
    if _PARAMS_KEY not in row:
        close = difflib.get_close_matches(_PARAMS_KEY, [str(k) for k in row], n=1, cutoff=0.6)
        typo = f" (found {close[0]!r}: a typo?)" if close else ""
        raise DatasetError(
            f"{where}: missing required key {_PARAMS_KEY!r}{typo}; row keys: {sorted(map(str, row))[:10]}"
        )
    _check_params(row[_PARAMS_KEY], where)
    # Routing before the schema parse: its messages for agent_ref/task_source are more precise than pydantic's.
    env = env_name_of(
        row, where=where, task_source_map=task_source_map, known_agents=known_agents, default=default_agent
    )
    try:
        parse_dataset_row(row)
    except ValidationError as e:
        raise DatasetError(f"{where}: {describe_validation_error(e)}") from e
    return env


def raw_prompt(row: Mapping[str, Any]) -> list[Any]:
    """The chat messages a Gym row starts from (``responses_create_params.input``; a plain string becomes one user
    message), as verl's ``raw_prompt`` column. Informational: Gym renders and sends the real prompt."""
    params = row.get("responses_create_params")
    messages = params.get("input") if isinstance(params, Mapping) else None
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return list(messages) if isinstance(messages, list) else []
