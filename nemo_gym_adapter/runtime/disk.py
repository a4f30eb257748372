"""Is a failed write a full disk? The answer for the messages of everything a run writes (checkpoints, dumps).

A full disk does not always say so: Python's ``write`` raises ``OSError(ENOSPC)`` without a file name, ``torch.save``
raises ``RuntimeError('[enforce fail at inline_container.cc:...] unexpected pos 576 vs 534')`` (seen here, torch
2.x on a full tmpfs), a write inside a Ray worker reaches the caller as a ``RayTaskError`` whose text is all that
is left. So :func:`full_disk` looks for ENOSPC/EDQUOT in the exception chain (``__cause__``, ``__context__``, Ray's
``cause``), for the C library's words in its text, and, failing both, at the free space left on the path's
filesystem right after the failure (a write that failed for lack of space leaves almost none). Imports nothing of
ours.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
FULL_WORDS = ("No space left on device", "Disk quota exceeded")
LOW_FREE_BYTES = 16 * 1024 * 1024  # below this after a failed write, the filesystem is taken to be full
MIB = 1024 * 1024


@dataclass(frozen=True)
class Space:
    """Free and total bytes of the filesystem holding ``path`` (None when it cannot be read)."""

    path: Path
    free: int | None
    total: int | None

    def __str__(self) -> str:
        if self.free is None or self.total is None:
            return f"free space of {self.path} unknown"
        return f"{self.free / MIB:.1f} MiB free of {self.total / MIB:.1f} MiB on the filesystem of {self.path}"


def existing_parent(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (statvfs needs one)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def space(path: Path) -> Space:
    """The free space (for an unprivileged writer: ``f_bavail``) of the filesystem holding ``path``."""
    where = existing_parent(path)
    try:
        st = os.statvfs(where)
    except OSError:
        return Space(where, None, None)
    return Space(where, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception behind it: ``__cause__``, ``__context__`` and Ray's ``RayTaskError.cause``."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (e.__cause__, e.__context__, getattr(e, "cause", None)) if isinstance(x, BaseException))


def failed_path(error: BaseException) -> str | None:
    """The file an ``OSError`` in the chain names, if any (``open`` names it; ``write`` does not)."""
    for e in chain(error):
        if isinstance(e, OSError) and e.filename:
            return str(e.filename)
    return None


def full_disk(error: BaseException, after: Space | None = None) -> str | None:
    """Why ``error`` is taken for a full disk (one line), or None. ``after``: the free space measured right after the
    failure, before anything was cleaned up (the module docstring says why the three signs)."""
    for e in chain(error):
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return f"{os.strerror(e.errno)} (errno {errno.errorcode.get(e.errno, e.errno)})"
        words = next((w for w in FULL_WORDS if w in str(e)), None)
        if words is not None:
            return words
    if after is not None and after.free is not None and after.free < LOW_FREE_BYTES:
        return f"the write failed with {after.free / MIB:.1f} MiB left on its filesystem"
    return None
