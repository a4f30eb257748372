"""Gym JSONL → validated rows → a verl dataset (``data.custom_cls``).

:func:`load_gym_jsonl` reads one or more Gym JSONL files (mixed environments allowed), validates every row up
front and returns :class:`GymRow` objects; it needs neither verl nor torch. Every problem is reported with its
``file:line``; all problems of all files are collected into one :class:`DatasetError` (the first
:data:`MAX_REPORTED_ERRORS` are listed) so a bad dataset is fixed in one pass, not one error per launch.

``GymJsonlDataset`` is the verl 0.9.1 ``data.custom_cls``. verl builds it as
``cls(data_files=, tokenizer=, processor=, config=data_config, max_samples=)`` (``verl/trainer/ppo/utils.py``
``create_rl_dataset``) and requires a ``torch.utils.data.Dataset`` subclass. Its rows go through verl's
``collate_fn`` (tensors stacked, everything else into object arrays) and ``DataProto.from_single_dict``, which
needs at least one tensor per row: like verl's own ``RLHFDataset`` we return a 1-element ``dummy_tensor`` and no
token ids (Gym renders the prompt with the tools itself, so the prompt is first tokenized by vLLM; an over-long
prompt becomes a masked sample in :mod:`trajectory`, not a loader error). The trainer keeps the non-tensor keys
``data_source``/``reward_model``/``extra_info``/``uid`` on its side and hands all others to the rollout manager.

Each row dict carries: ``gym_row`` (the row exactly as read: ``responses_create_params`` and every verifier
field, a fresh copy per access), ``gym_env`` (the normalised environment name, see :mod:`routing`),
``data_source`` (= ``gym_env``, so verl's validation metrics group by environment), ``index`` and ``extra_info``.

Options for the verl path come from ``data.nemo_gym`` (``+data.nemo_gym.known_agents=[...]``,
``+data.nemo_gym.task_source_map={...}``, ``+data.nemo_gym.default_agent=...``) or constructor keywords.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nemo_gym_adapter.errors import DatasetError
from nemo_gym_adapter.routing import env_name_of
from nemo_gym_adapter.wire import RESPONSES_CREATE_PARAMS_FIELDS, describe_validation_error, parse_dataset_row

MAX_REPORTED_ERRORS = 20
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


def _as_path_list(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    if isinstance(paths, str | os.PathLike):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


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
    if isinstance(value, str):
        if not value:
            raise DatasetError(f"{where}: {_PARAMS_KEY}.input is an empty string")
    elif isinstance(value, list):
        if not value:
            raise DatasetError(f"{where}: {_PARAMS_KEY}.input is an empty list")
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                raise DatasetError(
                    f"{where}: {_PARAMS_KEY}.input[{i}] must be an object, got {type(item).__name__} {item!r:.60}"
                )
    else:
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


def _read_lines(path: str) -> Iterable[tuple[int, str]]:
    """``(line number, text)`` of every non-blank line; a file that cannot be read raises DatasetError."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{path}: dataset file not found" + (" (it is a directory)" if p.is_dir() else ""))
    with p.open("rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{path}:{number}: not UTF-8 ({e.reason} at byte {e.start})") from e
            if text.strip():
                yield number, text


def load_gym_jsonl(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    known_agents: Collection[str] | None = None,
    *,
    task_source_map: Mapping[str, str] | None = None,
    default_agent: str | None = None,
) -> list[GymRow]:
    """Read and validate Gym JSONL files (in order) into :class:`GymRow` objects.

    Args:
        paths: one path or several; rows of all files are concatenated in order.
        known_agents: when given, every row must route to one of these names.
        task_source_map: ``{task_source: agent}`` for Gym 0.7 collated rows (see :mod:`routing`).
        default_agent: environment for rows with neither ``agent_ref`` nor ``task_source``.

    Raises:
        DatasetError: listing every bad row as ``file:line: problem`` (bad JSON with its column, non-object rows,
            missing or misspelt ``responses_create_params`` and its fields, bad ``input``/``tools``, malformed
            or unknown routing), a missing file, or no rows at all.
    """
    files = _as_path_list(paths)
    if not files:
        raise DatasetError("no dataset files given")
    rows: list[GymRow] = []
    errors: list[str] = []
    for path in files:
        try:
            for number, text in _read_lines(path):
                where = f"{path}:{number}"
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as e:
                    errors.append(f"{where}: invalid JSON: {e.msg} (column {e.colno})")
                    continue
                try:
                    env = validate_row(
                        row,
                        where,
                        known_agents=known_agents,
                        task_source_map=task_source_map,
                        default_agent=default_agent,
                    )
                except DatasetError as e:
                    errors.append(str(e))
                    continue
                rows.append(GymRow(data=row, env_name=env, path=path, line=number))
        except DatasetError as e:  # unreadable file: report it with the others
            errors.append(str(e))
    if errors:
        shown = "\n  ".join(errors[:MAX_REPORTED_ERRORS])
        more = f"\n  ... and {len(errors) - MAX_REPORTED_ERRORS} more" if len(errors) > MAX_REPORTED_ERRORS else ""
        raise DatasetError(f"{len(errors)} invalid row(s)/file(s) in Gym dataset:\n  {shown}{more}")
    if not rows:
        raise DatasetError(f"no rows in Gym dataset file(s) {files}")
    return rows


def _config_section(config: Any) -> Mapping[str, Any]:
    """``config.nemo_gym`` as a plain mapping (config may be an OmegaConf DictConfig, a dict or None)."""
    if config is None:
        return {}
    section = config.get("nemo_gym", None) if hasattr(config, "get") else None
    if section is None:
        return {}
    try:  # OmegaConf containers → plain Python, without importing omegaconf when it is not in use
        from omegaconf import OmegaConf

        if OmegaConf.is_config(section):
            return OmegaConf.to_container(section, resolve=True)
    except ImportError:
        pass
    return section


def _select(rows: list[GymRow], max_samples: int, config: Any) -> list[GymRow]:
    """verl's ``max_samples`` semantics: the first N rows, or a seeded random N when ``data.shuffle``."""
    if max_samples is None or max_samples <= 0 or max_samples >= len(rows):
        return rows
    shuffle = bool(config.get("shuffle", False)) if config is not None and hasattr(config, "get") else False
    if not shuffle:
        return rows[:max_samples]
    import numpy as np

    seed = config.get("seed", None)
    rng = np.random.default_rng(*((seed,) if seed is not None else ()))
    picked = rng.choice(len(rows), size=max_samples, replace=False)
    return [rows[i] for i in picked.tolist()]


def _make_dataset_class() -> type:
    """Build ``GymJsonlDataset``; torch is imported here, not at module import (it takes seconds)."""
    import torch
    from torch.utils.data import Dataset

    class GymJsonlDataset(Dataset):
        """verl ``data.custom_cls`` over Gym JSONL files; see the module docstring for the row contract."""

        def __init__(
            self,
            data_files: str | os.PathLike | Iterable[str | os.PathLike],
            tokenizer: Any = None,
            config: Any = None,
            processor: Any = None,
            max_samples: int = -1,
            *,
            known_agents: Collection[str] | None = None,
            task_source_map: Mapping[str, str] | None = None,
            default_agent: str | None = None,
        ) -> None:
            section = _config_section(config)
            known = known_agents if known_agents is not None else section.get("known_agents")
            self.tokenizer = tokenizer  # unused: Gym/vLLM render and tokenize the prompt
            self.processor = processor
            self.config = config
            self.data_files = _as_path_list(data_files)
            self.rows: list[GymRow] = _select(
                load_gym_jsonl(
                    self.data_files,
                    known_agents=set(known) if known is not None else None,
                    task_source_map=task_source_map or section.get("task_source_map"),
                    default_agent=default_agent or section.get("default_agent"),
                ),
                max_samples,
                config,
            )

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, item: int) -> dict[str, Any]:
            row = self.rows[item]
            return {
                # verl's DataProto needs at least one tensor per row (as in verl's RLHFDataset).
                "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                "gym_row": row.to_dict(),
                "gym_env": row.env_name,
                "data_source": row.env_name,
                "index": item,
                "extra_info": {"index": item, "gym_env": row.env_name, "source": row.where},
            }

        @property
        def env_names(self) -> list[str]:
            """Sorted distinct environment names of the dataset."""
            return sorted({r.env_name for r in self.rows})

    GymJsonlDataset.__module__ = __name__
    GymJsonlDataset.__qualname__ = "GymJsonlDataset"
    return GymJsonlDataset


def __getattr__(name: str) -> Any:
    # Lazy class so that importing this module (config validation, ``load_gym_jsonl``) does not import torch.
    # verl's ``load_extern_object`` and pickle both resolve the class through ``getattr(module, name)``.
    if name == "GymJsonlDataset":
        cls = _make_dataset_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
