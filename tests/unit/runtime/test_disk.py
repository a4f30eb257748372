"""``nemo_gym_adapter.runtime.disk``: a failed write is taken for a full disk from its errno, its words, or the space left."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from nemo_gym_adapter.runtime import disk
from tests.support.tmpfs import fill, small_tmpfs


def test_errno_anywhere_in_the_chain_is_a_full_disk():
    try:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as e:
        assert disk.full_disk(e) == "No space left on device (errno ENOSPC)"
    assert "Disk quota exceeded" in disk.full_disk(OSError(errno.EDQUOT, "quota"))


def test_the_words_of_a_remote_error_and_rays_cause_attribute_count_too():
    remote = RuntimeError("Traceback ...\nOSError: [Errno 28] No space left on device")
    assert disk.full_disk(remote) == "No space left on device"

    class FakeRayTaskError(Exception):  # Ray keeps the worker's exception as .cause
        cause = OSError(errno.ENOSPC, "no space")

    assert "ENOSPC" in disk.full_disk(FakeRayTaskError("a task failed"))


def test_other_errors_are_not_a_full_disk_unless_the_disk_is_nearly_full(tmp_path):
    torch_like = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert disk.full_disk(torch_like) is None
    assert disk.full_disk(torch_like, disk.space(tmp_path)) is None or disk.space(tmp_path).free < disk.LOW_FREE_BYTES
    nearly_full = disk.Space(tmp_path, free=4096, total=1 << 30)
    assert "0.0 MiB left" in disk.full_disk(torch_like, nearly_full)
    assert disk.full_disk(PermissionError(errno.EACCES, "denied"), disk.Space(tmp_path, 1 << 40, 1 << 41)) is None


def test_a_real_full_tmpfs_is_measured_and_the_failing_file_named_when_known(tmp_path):
    with small_tmpfs(tmp_path / "fs", 1) as fs:
        fill(fs)
        with pytest.raises(OSError) as raised:
            with open(fs / "x.bin", "wb") as f:
                f.write(b"x" * 65536)
                f.flush()
        after = disk.space(fs / "not" / "there")  # the nearest existing parent is measured
        assert after.path == fs and after.free is not None and after.free < 64 * 1024
        assert "MiB free of 1.0 MiB" in str(after)
        assert disk.full_disk(raised.value, after) is not None
    assert disk.failed_path(FileNotFoundError(errno.ENOENT, "missing", "/a/b")) == "/a/b"
    assert disk.failed_path(RuntimeError("x")) is None
    assert disk.existing_parent(Path("/definitely/not/here")) == Path("/")
