"""Validated Gym rows in a content-addressed, memory-mapped Arrow cache (the storage behind :mod:`dataset`).

Why Arrow holding each row's *JSON text*, not Arrow columns per field: Gym rows are heterogeneous (every environment
has its own verifier fields; ``input`` is a string in one row and a list in the next; ``1`` and ``1.0`` both occur).
``datasets.load_dataset("json")`` on such rows changes every one of them (measured on 20k synthetic Gym rows:
20000/20000 differ after the round trip -- absent keys come back as ``null``, ``0.95`` as ``0.9500000000000001``,
mixed columns as JSON-encoded blobs) and parses at ~230 µs/row. Storing the line's text and ``json.loads``-ing it
on access gives back exactly the row that was validated, costs ~10 µs per access, and is a fresh object each time
(no deep copy needed).

One table per (file contents, validation settings, validator code): columns ``row`` (the line's JSON text, stripped of
its line end and any byte-order mark), ``env`` (the routed environment name), ``file`` (index into the load's file
list) and ``line`` (1-based, counting every ``\\n``-terminated line, blank ones included). The table is written only
when *every* row validated, so an entry's existence means "validated": a second load of the same contents with the
same settings hashes the files (xxh3, I/O-bound) and memory-maps the table, skipping parsing and validation. The
path a file was loaded from is not part of the key -- ``file:line`` is rebuilt from the current call's paths.

Where: ``<HF_DATASETS_CACHE>/nemo_gym_jsonl/<key>/`` by default, i.e. next to the Arrow caches ``datasets`` writes
for verl's own ``RLHFDataset`` (``datasets.load_dataset`` → ``HF_DATASETS_CACHE``; verl's ``data.cache_dir`` only
holds local copies of remote files). Clusters already point that variable at a large local or shared disk; the
checkout's ``.cache/`` may not exist (installed package) or sit on a slow shared file system. Entries are built in a
temporary directory and renamed into place, so concurrent builders (several nodes on a shared disk) never see a
half-written table. Old entries are not evicted (like ``datasets``' own cache): delete the directory to reclaim space.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import DatasetError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the table layout or the meaning of a column changes
CACHE_SUBDIR = "nemo_gym_jsonl"
_TABLE = "rows.arrow"
_META = "meta.json"
# Record batches of ~8 MB: bounded memory while building (rows run from 100 B to 100s of kB), and few batches, because
# opening the memory-mapped table touches every batch's header and the kernel reads ~100 kB around each such page
# fault (1000-row batches, datasets' default, made a 5M-row table resident by ~8 % of its size just by opening it).
_BATCH_BYTES = 8 << 20
_BATCH_MAX_ROWS = 1 << 16
_HASH_CHUNK = 1 << 20


def default_cache_root() -> Path:
    """``$HF_DATASETS_CACHE`` (read at call time), else ``datasets``' default, ``$HF_HOME/datasets`` with ``HF_HOME``
    defaulting to ``$XDG_CACHE_HOME/huggingface`` (``~/.cache/huggingface``) as ``datasets.config`` computes it:
    importing ``datasets`` only to read it costs seconds."""
    value = os.environ.get("HF_DATASETS_CACHE")
    if value:
        return Path(value).expanduser()
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expanduser(hf_home)) / "datasets"


def content_hash(path: str | os.PathLike) -> str:
    """xxh3-128 of the file's bytes (~20 GB/s in memory, so the cost is reading the file; xxhash comes with
    ``datasets``, which requires it)."""
    import xxhash

    hasher = xxhash.xxh3_128()
    buffer = bytearray(_HASH_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            hasher.update(view[:n])
    return hasher.hexdigest()


def line_hasher() -> Any:
    """A hasher giving :func:`content_hash`'s digest when fed a file's bytes in pieces (to notice a file that
    changed between hashing and validating)."""
    import xxhash

    return xxhash.xxh3_128()


def cache_key(file_hashes: Sequence[str], settings: Mapping[str, Any], validator: str) -> str:
    """The entry's name: files' contents in order, validation settings (JSON-able) and the validator's code hash."""
    import xxhash

    material = json.dumps(
        {"format": FORMAT_VERSION, "files": list(file_hashes), "settings": settings, "validator": validator},
        sort_keys=True,
    )
    return xxhash.xxh3_128_hexdigest(material.encode())


def _features() -> Any:
    from datasets import Features, Value

    return Features({"row": Value("string"), "env": Value("string"), "file": Value("int32"), "line": Value("int64")})


class EntryBuilder:
    """Writes one cache entry: rows are streamed into Arrow record batches in a private temporary directory;
    :meth:`commit` renames it into place (atomically), :meth:`abort` removes it. Use as a context manager."""

    def __init__(self, root: Path, key: str) -> None:
        self.final = root / CACHE_SUBDIR / key
        self.tmp = root / CACHE_SUBDIR / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            self.tmp.mkdir(parents=True)
        except OSError as e:
            raise DatasetError(
                f"cannot write the dataset cache under {root} ({e.strerror}); point HF_DATASETS_CACHE or "
                "data.nemo_gym.cache_dir at a writable directory"
            ) from e
        from datasets.arrow_writer import ArrowWriter

        self._writer = ArrowWriter(path=str(self.tmp / _TABLE), features=_features(), writer_batch_size=_BATCH_MAX_ROWS)
        self._batch: tuple[list[str], list[str], list[int], list[int]] = ([], [], [], [])
        self._batch_bytes = 0
        self.rows = 0

    def __enter__(self) -> EntryBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()  # no-op after commit

    def add(self, text: str, env: str, file: int, line: int) -> None:
        texts, envs, files, lines = self._batch
        texts.append(text)
        envs.append(env)
        files.append(file)
        lines.append(line)
        self._batch_bytes += len(text)
        if self._batch_bytes >= _BATCH_BYTES or len(self._batch[0]) >= _BATCH_MAX_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._batch[0]:
            return
        import pyarrow as pa

        texts, envs, files, lines = self._batch
        table = pa.table(
            {
                "row": pa.array(texts, pa.string()),
                "env": pa.array(envs, pa.string()),
                "file": pa.array(files, pa.int32()),
                "line": pa.array(lines, pa.int64()),
            }
        )
        self._writer.write_table(table)
        self.rows += len(texts)
        self._batch = ([], [], [], [])
        self._batch_bytes = 0

    def commit(self, meta: Mapping[str, Any]) -> Path:
        """Finish the table, write ``meta.json`` and move the entry into place; returns the entry's directory.

        When another process committed the same key meanwhile, its entry is kept and ours is dropped.
        """
        self._flush()
        self._writer.finalize()
        import pyarrow as pa

        pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed batches' pages otherwise
        (self.tmp / _META).write_text(json.dumps({**meta, "rows": self.rows, "created": time.time()}, indent=1))
        try:
            os.rename(self.tmp, self.final)
        except OSError:
            if not (self.final / _META).is_file():
                raise
            shutil.rmtree(self.tmp, ignore_errors=True)  # a concurrent builder won the race: same contents
        return self.final

    def abort(self) -> None:
        if self.tmp.exists():
            try:
                self._writer.finalize()
            except Exception:  # noqa: BLE001 -- best effort: the directory is deleted anyway
                pass
            shutil.rmtree(self.tmp, ignore_errors=True)


def find_entry(root: Path, key: str) -> Path | None:
    """The committed entry for ``key``, or None. A committed entry always has its ``meta.json``."""
    entry = root / CACHE_SUBDIR / key
    return entry if (entry / _META).is_file() else None


def read_meta(entry: Path) -> dict[str, Any]:
    return json.loads((entry / _META).read_text())


def open_entry(root: Path, key: str, paths: Sequence[str]) -> StoredRows | None:
    """The committed entry for ``key`` mapped for ``paths``, or None when there is none or it is damaged (then it
    is removed, so the caller rebuilds it)."""
    entry = find_entry(root, key)
    if entry is None:
        return None
    try:
        store = StoredRows(entry, paths)
        expected = read_meta(entry)["rows"]
        if len(store) != expected:
            raise ValueError(f"{len(store)} rows, meta.json says {expected}")
        return store
    except Exception as e:  # noqa: BLE001 -- truncated by a full disk, edited by hand, ...: rebuild, never trust
        logger.warning("dataset cache entry %s is unreadable (%s); rebuilding it", entry, e)
        shutil.rmtree(entry, ignore_errors=True)
        return None


@dataclass(frozen=True)
class RowRecord:
    """One stored row before parsing: its JSON text, environment and location (``path:line``)."""

    text: str
    env: str
    path: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


class StoredRows:
    """A memory-mapped cache entry seen as a sequence of :class:`RowRecord` (optionally a subset, ``indices``).

    Opening maps the table (a few pages of metadata are read); rows are read on access. Pickles as
    (entry, paths, indices) and re-maps the file on unpickling, so DataLoader workers and Ray share the OS page
    cache instead of copying rows.
    """

    def __init__(self, entry: Path, paths: Sequence[str], indices: Any = None) -> None:
        self.entry = Path(entry)
        self.paths = list(paths)
        self.indices = indices  # numpy int64 array of row numbers in the table, or None for all
        self._open()

    def _open(self) -> None:
        import datasets

        # Dataset.from_file memory-maps (in_memory=False); verl's RLHFDataset reaches the same kind of table through
        # datasets.load_dataset.
        self.dataset = datasets.Dataset.from_file(str(self.entry / _TABLE), in_memory=False)
        table = self.dataset.data.table
        self._row, self._env = table.column("row"), table.column("env")
        self._file, self._line = table.column("file"), table.column("line")

    def __getstate__(self) -> dict[str, Any]:
        return {"entry": self.entry, "paths": self.paths, "indices": self.indices}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return len(self._row) if self.indices is None else len(self.indices)

    def _position(self, item: int) -> int:
        n = len(self)
        index = int(item)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"row {item} out of range for a dataset of {n} rows")
        return index if self.indices is None else int(self.indices[index])

    def record(self, item: int) -> RowRecord:
        i = self._position(item)
        return RowRecord(
            self._row[i].as_py(), self._env[i].as_py(), self.paths[self._file[i].as_py()], self._line[i].as_py()
        )

    def records(self, batch_rows: int = 4096) -> Iterator[RowRecord]:
        """All records in order, read a batch at a time (much faster than indexing one by one)."""
        import pyarrow as pa

        n = len(self)
        for start in range(0, n, batch_rows):
            stop = min(start + batch_rows, n)
            if self.indices is None:
                cols = [c.slice(start, stop - start) for c in (self._row, self._env, self._file, self._line)]
            else:
                take = pa.array(self.indices[start:stop])
                cols = [c.take(take) for c in (self._row, self._env, self._file, self._line)]
            texts, envs, files, lines = (c.to_pylist() for c in cols)
            for text, env, file, line in zip(texts, envs, files, lines, strict=True):
                yield RowRecord(text, env, self.paths[file], line)

    def select(self, indices: Sequence[int]) -> StoredRows:
        """A view of the given positions (of this view), in that order; the table is not copied."""
        import numpy as np

        positions = np.asarray(indices, dtype=np.int64)
        chosen = positions if self.indices is None else self.indices[positions]
        return StoredRows(self.entry, self.paths, chosen)

    def env_counts(self) -> dict[str, int]:
        """Rows per environment (of this view)."""
        import pyarrow as pa

        envs = self._env if self.indices is None else self._env.take(pa.array(self.indices))
        counts = envs.value_counts()
        return {str(v): int(c) for v, c in zip(counts.field(0).to_pylist(), counts.field(1).to_pylist(), strict=True)}

    def env_codes(self) -> tuple[list[str], Any]:
        """(environment names, int32 code per row of this view into those names): every row's environment without
        a Python string per row (what ``env_sampling`` needs for millions of rows)."""
        import numpy as np
        import pyarrow as pa

        envs = self._env if self.indices is None else self._env.take(pa.array(self.indices))
        encoded = envs.dictionary_encode().combine_chunks()
        names = [str(v) for v in encoded.dictionary.to_pylist()]
        return names, np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int32)
