"""Gym JSONL → validated rows → a verl dataset (``data.custom_cls``).

:func:`load_gym_jsonl` reads one or more Gym JSONL files (mixed environments allowed), validates every row up
front (:func:`rows.validate_row`: what a valid row is) and returns them as :class:`rows.GymRows`; it needs
neither verl nor torch. Every problem is reported with its ``file:line``; all problems of all files are collected into
one :class:`DatasetError` (the first :data:`MAX_REPORTED_ERRORS` are listed) so a bad dataset is fixed in one pass,
not one error per launch.
Files may carry a UTF-8 byte-order mark, CRLF line ends, blank or whitespace-only lines and no final newline (what
editors and Windows tools write); line numbers count every line. UTF-16 files are refused with a clear message.

Rows are not held as Python objects: validated rows go to a memory-mapped Arrow table keyed by the files' contents
and the validation settings (:mod:`~nemo_gym_adapter.data.store`: what is stored, where, and why), so a dataset of millions of rows
costs a few MB of resident memory per process, and loading the same files again skips parsing and validation.

``GymJsonlDataset`` is the verl 0.9.1 ``data.custom_cls``. verl builds it as
``cls(data_files=, tokenizer=, processor=, config=data_config, max_samples=)`` (``verl/trainer/ppo/utils.py``
``create_rl_dataset``) and requires a ``torch.utils.data.Dataset`` subclass. Its rows go through verl's
``collate_fn`` (tensors stacked, everything else into object arrays) and ``DataProto.from_single_dict``, which
needs at least one tensor per row: like verl's own ``RLHFDataset`` we return a 1-element ``dummy_tensor`` and no
token ids (Gym renders the prompt with the tools itself, so the prompt is first tokenized by vLLM; an over-long
prompt becomes a masked sample in :mod:`trajectory`, not a loader error -- ``data.filter_overlong_prompts`` does not
apply). The trainer keeps the non-tensor keys ``data_source``/``reward_model``/``extra_info``/``uid`` on its side and
hands all others to the rollout manager.

Each row dict carries: ``gym_row`` (the row exactly as read: ``responses_create_params`` and every verifier
field, a fresh object per access), ``gym_env`` (the normalised environment name, see :mod:`routing`),
``data_source`` (= ``gym_env``, so verl's validation metrics group by environment), ``index`` and ``extra_info``.

Options for the verl path come from ``data.nemo_gym`` (``+data.nemo_gym.known_agents=[...]``,
``+data.nemo_gym.task_source_map={...}``, ``+data.nemo_gym.default_agent=...``, ``+data.nemo_gym.cache_dir=...``)
or constructor keywords.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_adapter.data import store as dataset_store
from nemo_gym_adapter.data.jsonl import json_error_message, read_lines
from nemo_gym_adapter.data.routing import env_name_of
from nemo_gym_adapter.data.rows import GymRows, raw_prompt, validate_row
from nemo_gym_adapter.data.store import StoredRows
from nemo_gym_adapter.errors import DatasetError
from nemo_gym_adapter.wire.payloads import parse_dataset_row

logger = logging.getLogger(__name__)

MAX_REPORTED_ERRORS = 20


def _as_path_list(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    if isinstance(paths, str | os.PathLike):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


@functools.cache
def _validator_fingerprint() -> str:
    """Hash of the code that reads, validates and routes rows: changing it invalidates cached validation results."""
    import xxhash

    hasher = xxhash.xxh3_128()
    functions = (read_lines, _validate_into, validate_row, env_name_of, parse_dataset_row)
    for module in sorted({f.__module__ for f in functions}):
        source = sys.modules[module].__file__
        if source is not None:
            hasher.update(Path(source).read_bytes())
    return hasher.hexdigest()


class _ErrorLog:
    """Counts every error, keeps the first :data:`MAX_REPORTED_ERRORS` messages (bounded memory on huge files)."""

    def __init__(self) -> None:
        self.count = 0
        self.shown: list[str] = []

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.shown) < MAX_REPORTED_ERRORS:
            self.shown.append(message)

    def raise_if_any(self) -> None:
        if self.count:
            shown = "\n  ".join(self.shown)
            more = f"\n  ... and {self.count - len(self.shown)} more" if self.count > len(self.shown) else ""
            raise DatasetError(f"{self.count} invalid row(s)/file(s) in Gym dataset:\n  {shown}{more}")


def _validate_into(
    files: list[str],
    hashes: list[str] | None,
    builder: dataset_store.EntryBuilder | None,
    checks: Mapping[str, Any],
) -> int:
    """Validate every row of every file, streaming good rows into ``builder`` while no error has been seen.

    Returns the number of rows. Raises DatasetError listing every problem (see :func:`load_gym_jsonl`).
    """
    errors = _ErrorLog()
    count = 0
    for index, path in enumerate(files):
        hasher = dataset_store.line_hasher()
        try:
            for number, text, lead in read_lines(path, hasher):
                if isinstance(text, DatasetError):
                    errors.add(str(text))
                    continue
                where = f"{path}:{number}"
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as e:
                    errors.add(f"{where}: {json_error_message(e, text, lead)}")
                    continue
                try:
                    env = validate_row(row, where, **checks)
                except DatasetError as e:
                    errors.add(str(e))
                    continue
                count += 1
                if builder is not None and not errors.count:
                    builder.add(text, env, index, number)
        except DatasetError as e:  # missing or UTF-16 file: report it with the others
            errors.add(str(e))
            continue
        except OSError as e:
            errors.add(f"{path}: cannot read the file ({e.strerror or e})")
            continue
        if hashes is not None and hasher.hexdigest() != hashes[index]:
            errors.add(f"{path}: the file changed while it was being loaded; load it again")
    errors.raise_if_any()
    if not count:
        raise DatasetError(f"no rows in Gym dataset file(s) {files}")
    return count


def load_gym_jsonl(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    known_agents: Collection[str] | None = None,
    *,
    task_source_map: Mapping[str, str] | None = None,
    default_agent: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> GymRows:
    """Read and validate Gym JSONL files (in order) into :class:`GymRows`, through the Arrow cache.

    Args:
        paths: one path or several; rows of all files are concatenated in order.
        known_agents: when given, every row must route to one of these names.
        task_source_map: ``{task_source: agent}`` for Gym 0.7 collated rows (see :mod:`routing`).
        default_agent: environment for rows with neither ``agent_ref`` nor ``task_source``.
        cache_dir: root of the validated-rows cache; default :func:`store.default_cache_root`
            (``$HF_DATASETS_CACHE``, where ``datasets`` caches verl's own datasets).

    Raises:
        DatasetError: listing every bad row as ``file:line: problem`` (bad JSON with its column, non-object rows,
            missing or misspelt ``responses_create_params`` and its fields, bad ``input``/``tools``, malformed
            or unknown routing, bytes that are not UTF-8), a missing or UTF-16 file, no rows at all, or a cache
            directory that cannot be written.
    """
    started = time.perf_counter()
    job = _Job.of(paths, known_agents, task_source_map, default_agent, cache_dir)
    store = dataset_store.open_entry(job.root, job.key, job.files) if job.key is not None else None
    how = "cached"
    if store is None:
        logger.info("Gym dataset: validating %s into the cache under %s", job.files, job.root)
        store, how = StoredRows(_build(job), job.files), "validated"
    rows = GymRows(store)
    elapsed = time.perf_counter() - started
    logger.info("Gym dataset: %d rows, %s in %.1f s (%s)", len(rows), how, elapsed, store.entry)
    return rows


def check_gym_jsonl(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    known_agents: Collection[str] | None = None,
    *,
    task_source_map: Mapping[str, str] | None = None,
    default_agent: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """Validate like :func:`load_gym_jsonl` (same arguments, same cache entry) without mapping the rows, and return
    the cache entry: a committed entry is proof its rows were valid, so a cached check reads no row and imports
    neither ``datasets`` nor pyarrow. Raises :class:`DatasetError` as :func:`load_gym_jsonl` does."""
    job = _Job.of(paths, known_agents, task_source_map, default_agent, cache_dir)
    entry = dataset_store.find_entry(job.root, job.key) if job.key is not None else None
    return entry if entry is not None else _build(job)


@dataclass(frozen=True)
class _Job:
    """One load's files, their content hashes (None: a file could not be hashed), cache root, key and checks."""

    files: list[str]
    hashes: list[str] | None
    root: Path
    key: str | None
    checks: dict[str, Any]
    settings: dict[str, Any]

    @classmethod
    def of(
        cls,
        paths: str | os.PathLike | Iterable[str | os.PathLike],
        known_agents: Collection[str] | None,
        task_source_map: Mapping[str, str] | None,
        default_agent: str | None,
        cache_dir: str | os.PathLike | None,
    ) -> _Job:
        files = _as_path_list(paths)
        if not files:
            raise DatasetError("no dataset files given")
        known = frozenset(known_agents) if known_agents is not None else None
        checks: dict[str, Any] = {
            "known_agents": known,
            "task_source_map": dict(task_source_map) if task_source_map else None,
            "default_agent": default_agent,
        }
        settings = {**checks, "known_agents": sorted(known) if known is not None else None}
        root = Path(cache_dir).expanduser() if cache_dir else dataset_store.default_cache_root()
        try:
            hashes: list[str] | None = [dataset_store.content_hash(p) for p in files]
        except OSError:  # a missing or unreadable file: validation reports it with everything else
            hashes = None
        key = dataset_store.cache_key(hashes, settings, _validator_fingerprint()) if hashes is not None else None
        return cls(files, hashes, root, key, checks, settings)


def _build(job: _Job) -> Path:
    """Validate every row into a new cache entry (committed only when all rows are valid); returns the entry."""
    files, hashes, root, key, checks, settings = job.files, job.hashes, job.root, job.key, job.checks, job.settings
    if key is None:
        _validate_into(files, None, None, checks)  # reports the file(s) that could not be hashed
        raise DatasetError(f"{files}: a file could not be read consistently (changed while loading?); load again")
    try:
        with dataset_store.EntryBuilder(root, key) as builder:
            _validate_into(files, hashes, builder, checks)
            entry = builder.commit({"files": files, "hashes": hashes, "settings": settings})
    except OSError as e:  # reading errors are reported per file by _validate_into: this is the cache's disk
        raise DatasetError(
            f"cannot write the dataset cache under {root} ({e}); free space there or point HF_DATASETS_CACHE or "
            "data.nemo_gym.cache_dir elsewhere"
        ) from e
    return entry


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


def _select(rows: GymRows, max_samples: int, config: Any) -> GymRows:
    """verl's ``max_samples`` semantics: the first N rows, or a seeded random N when ``data.shuffle``."""
    if max_samples is None or max_samples <= 0 or max_samples >= len(rows):
        return rows
    shuffle = bool(config.get("shuffle", False)) if config is not None and hasattr(config, "get") else False
    if not shuffle:
        return rows.select(range(max_samples))
    import numpy as np

    seed = config.get("seed", None)
    rng = np.random.default_rng(*((seed,) if seed is not None else ()))
    return rows.select(rng.choice(len(rows), size=max_samples, replace=False).tolist())


def load_for_config(
    data_files: str | os.PathLike | Iterable[str | os.PathLike],
    config: Any = None,
    *,
    known_agents: Collection[str] | None = None,
    task_source_map: Mapping[str, str] | None = None,
    default_agent: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    check_only: bool = False,
) -> Any:
    """:func:`load_gym_jsonl` with the settings of verl's ``data`` config (its ``nemo_gym`` section) unless given:
    what ``GymJsonlDataset`` loads. ``check_only``: :func:`check_gym_jsonl` instead (the trainer's entry point, before
    anything starts: a bad row costs a second, not a start-up, and verl's later load is a cache hit)."""
    section = _config_section(config)
    known = known_agents if known_agents is not None else section.get("known_agents")
    return (check_gym_jsonl if check_only else load_gym_jsonl)(
        data_files,
        known_agents=set(known) if known is not None else None,
        task_source_map=task_source_map or section.get("task_source_map"),
        default_agent=default_agent or section.get("default_agent"),
        cache_dir=cache_dir or section.get("cache_dir"),
    )


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
            cache_dir: str | os.PathLike | None = None,
        ) -> None:
            self.tokenizer = tokenizer  # unused: Gym/vLLM render and tokenize the prompt
            self.processor = processor
            self.config = config
            self.data_files = _as_path_list(data_files)
            loaded = load_for_config(
                self.data_files,
                config,
                known_agents=known_agents,
                task_source_map=task_source_map,
                default_agent=default_agent,
                cache_dir=cache_dir,
            )
            self.rows: GymRows = _select(loaded, max_samples, config)

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, item: int) -> dict[str, Any]:
            record = self.rows.store.record(item)
            row = json.loads(record.text)  # parsed per access: a fresh object the caller may modify
            return {
                # verl's DataProto needs at least one tensor per row (as in verl's RLHFDataset).
                "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                "gym_row": row,
                # verl's v1 trainer counts a batch's prompts by this column and logs validation inputs from it.
                "raw_prompt": raw_prompt(row),
                "gym_env": record.env,
                "data_source": record.env,
                "index": item,
                "extra_info": {"index": item, "gym_env": record.env, "source": record.where},
            }

        @property
        def env_names(self) -> list[str]:
            """Sorted distinct environment names of the dataset."""
            return sorted(self.rows.env_counts)

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
