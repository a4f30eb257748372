"""A small tmpfs for disk-full tests: a real filesystem that runs out of space after a few MB (root only).

``mount -t tmpfs -o size=<n>m`` on a directory of the test's own; unmounted (lazily, should a process of the test
still hold a file there) when the context ends. Tests skip where it cannot be made (not root, no ``mount``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def why_no_tmpfs() -> str | None:
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount command"
    return None


@contextlib.contextmanager
def small_tmpfs(where: Path, size_mb: float) -> Iterator[Path]:
    """``where`` (created) with a tmpfs of ``size_mb`` MiB mounted on it; skips the test when that cannot be done."""
    why = why_no_tmpfs()
    if why is not None:
        pytest.skip(why)
    where.mkdir(parents=True, exist_ok=True)
    size_kb = max(int(size_mb * 1024), 64)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs on {where}: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(where: Path, leave_bytes: int = 0, name: str = "filler") -> Path:
    """A file under ``where`` that takes all its filesystem's free space but ``leave_bytes``."""
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize
    path = where / name
    with open(path, "wb") as f:
        remaining = max(free - leave_bytes, 0)
        block = b"\0" * (1 << 20)
        while remaining > 0:
            try:
                remaining -= f.write(block[: min(len(block), remaining)])
            except OSError:
                break
    return path
