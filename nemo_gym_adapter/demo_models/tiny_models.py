"""Deterministic tiny test models (tokenizer + random weights) for the three chat families we support.

``build_tiny_model(family)`` returns a directory that ``transformers`` (AutoTokenizer /
AutoModelForCausalLM) and vLLM load offline. Each family mirrors the real model's *token-level* traits that
the on-policy splice must survive, at a size that builds in about a second and serves on CPU:

========  ==================  =========================================================================
family    architecture        traits
========  ==================  =========================================================================
qwen25    Qwen2ForCausalLM    ChatML, hermes tools, eos ``<|im_end|>``; generation may also stop at
                              ``<|endoftext|>`` (generation_config eos = [im_end, endoftext])
qwen3     Qwen3ForCausalLM    qwen25 + ``<think>``/``</think>``, reasoning stripped before the last query
llama3    LlamaForCausalLM    header turns closed by ``<|eot_id|>`` while tokenizer EOS is
                              ``<|end_of_text|>``; tokenizer adds ``<|begin_of_text|>`` to plain text
========  ==================  =========================================================================

The tokenizer is a real byte-level BPE trained at build time on a small embedded corpus, so common words
("weather", "Skinny") are single tokens that a model can also produce as two pieces.

Builds are deterministic (fixed seeds, no timestamps: same bytes every time), idempotent (a complete
directory carries a stamp with ``BUILDER_VERSION`` and is reused) and safe under concurrency (each builder
writes a private temporary directory and publishes it with an atomic rename).

CLI: ``python -m nemo_gym_adapter.demo_models [--family all|qwen25|qwen3|llama3] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nemo_gym_adapter.demo_models import templates as T
from nemo_gym_adapter.errors import AdapterConfigError, SetupError
from nemo_gym_adapter.runtime import paths

FAMILIES = ("qwen25", "qwen3", "llama3")
# Bump on any intentional change of the produced models. Cached builds are also rebuilt automatically when
# this module, the templates module or a library that writes the files changes (see ``recipe_fingerprint``).
BUILDER_VERSION = 3
STAMP_NAME = "tiny_model_stamp.json"

BASE_VOCAB_SIZE = 3000  # BPE target before special tokens; the model has exactly one row per token (see _write_model)
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 2
NUM_KV_HEADS = 1  # grouped-query attention like the real families
HEAD_DIM = 32  # vLLM's CPU attention only supports some head sizes (32, 64, 80, 96, 112, 128, ...)
INTERMEDIATE_SIZE = 128
MAX_POSITIONS = 16384

# Split regexes of the pre-tokenizer: letters with an optional leading non-letter, then digits one at a
# time (Qwen) or up to three at a time (Llama 3), punctuation runs, newlines and other whitespace.
_SPLIT_QWEN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_SPLIT_LLAMA = _SPLIT_QWEN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


@dataclass(frozen=True)
class _Family:
    """What differs between families. Tokens are appended after the BPE vocab in this order."""

    architecture: str
    tokenizer_class: str  # as the real checkpoints name it; transformers 5 picks its loader class from it
    special: tuple[str, ...]  # added as special tokens (skipped by ``skip_special_tokens``)
    added: tuple[str, ...]  # added as normal, non-special single-id tokens (kept in decoded text)
    bos: str | None
    eos: str
    pad: str
    generation_eos: tuple[str, ...]
    chat_template: str
    split_regex: str
    add_bos: bool  # the tokenizer's post-processor prepends BOS when encoding with special tokens
    seed: int
    rope_theta: float


_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN_TOOLS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

_SPECS: dict[str, _Family] = {
    "qwen25": _Family(
        architecture="Qwen2ForCausalLM",
        tokenizer_class="Qwen2Tokenizer",
        special=_QWEN_SPECIAL,
        added=_QWEN_TOOLS,
        bos=None,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        generation_eos=("<|im_end|>", "<|endoftext|>"),
        chat_template=T.CHATML_TOOLS,
        split_regex=_SPLIT_QWEN,
        add_bos=False,
        seed=2501,
        rope_theta=1_000_000.0,
    ),
    "qwen3": _Family(
        architecture="Qwen3ForCausalLM",
        tokenizer_class="Qwen2Tokenizer",
        special=_QWEN_SPECIAL,
        added=_QWEN_TOOLS + ("<think>", "</think>"),
        bos=None,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        generation_eos=("<|im_end|>", "<|endoftext|>"),
        chat_template=T.CHATML_THINK,
        split_regex=_SPLIT_QWEN,
        add_bos=False,
        seed=3001,
        rope_theta=1_000_000.0,
    ),
    "llama3": _Family(
        architecture="LlamaForCausalLM",
        tokenizer_class="PreTrainedTokenizerFast",
        special=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eom_id|>",
            "<|eot_id|>",
            "<|python_tag|>",
            "<|finetune_right_pad_id|>",
        ),
        added=(),
        bos="<|begin_of_text|>",
        eos="<|end_of_text|>",
        pad="<|finetune_right_pad_id|>",
        generation_eos=("<|end_of_text|>", "<|eot_id|>"),
        chat_template=T.LLAMA3_JSON,
        split_regex=_SPLIT_LLAMA,
        add_bos=True,
        seed=3101,
        rope_theta=500_000.0,
    ),
}


def family_spec(family: str) -> _Family:
    """The spec of ``family``; raises ``AdapterConfigError`` (a ``ValueError``) naming the valid families."""
    try:
        return _SPECS[family]
    except (KeyError, TypeError):
        raise AdapterConfigError(
            f"unknown tiny model family {family!r}; valid families: {', '.join(FAMILIES)}"
        ) from None


# -------------------------------------------------------------------------------------------- tokenizer


@functools.cache
def _trained_bpe(split_regex: str) -> str:
    """Train the byte-level BPE for one pre-tokenizer regex; returns its JSON (cached: qwen25/qwen3 share it)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()  # as the real tokenizers (and transformers' Qwen2Tokenizer) do
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(T.training_corpus(), trainer=trainer)
    return tok.to_str()


def _train_tokenizer(spec: _Family):
    """The family's tokenizer: the trained BPE plus its special/added tokens. Returns a ``tokenizers.Tokenizer``."""
    from tokenizers import AddedToken, Tokenizer, processors

    tok = Tokenizer.from_str(_trained_bpe(spec.split_regex))
    # Added after training so the ids follow the BPE vocab (as in the real tokenizers), in spec order.
    for text in spec.special + spec.added:
        token = AddedToken(text, special=text in spec.special, normalized=False, single_word=False)
        if text in spec.special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    if spec.add_bos:
        bos_id = tok.token_to_id(spec.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B", special_tokens=[(spec.bos, bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _write_tokenizer(out: Path, spec: _Family, tok) -> None:
    """Write tokenizer.json and tokenizer_config.json (chat template inside, as older checkpoints ship it)."""
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    config: dict[str, object] = {
        "tokenizer_class": spec.tokenizer_class,
        "bos_token": spec.bos,
        "eos_token": spec.eos,
        "pad_token": spec.pad,
        "unk_token": None,
        "add_bos_token": spec.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "extra_special_tokens": {},
        "chat_template": spec.chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ model


def _write_model(out: Path, spec: _Family, tok) -> None:
    """Random float32 weights from a fixed seed, tied embeddings, plus config and generation config."""
    import torch
    import transformers

    ids = {t: tok.token_to_id(t) for t in spec.special + spec.added}
    # One row per token, not padded to a multiple of 64 as real checkpoints are: verl's vLLM server sets the logits
    # beyond len(tokenizer) to -inf (monkey_patch_compute_logits) while verl's actor normalises over every row, so
    # each random padding row put the rollout log-probs above the actor's, by ~rows/vocab per token (3.4e-4 for
    # qwen25's one row, 2.1e-2 for qwen3's 63). benchmarks/probe_logprob_offset.py measures it.
    vocab = tok.get_vocab_size(with_added_tokens=True)
    common = dict(
        vocab_size=vocab,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        rope_theta=spec.rope_theta,
        bos_token_id=ids[spec.bos] if spec.bos else ids[spec.pad],
        eos_token_id=ids[spec.eos],
        pad_token_id=ids[spec.pad],
        architectures=[spec.architecture],
    )
    if spec.architecture == "Qwen2ForCausalLM":
        config = transformers.Qwen2Config(**common)  # head_dim is hidden_size / heads = 32
    elif spec.architecture == "Qwen3ForCausalLM":
        config = transformers.Qwen3Config(head_dim=HEAD_DIM, **common)
    else:
        config = transformers.LlamaConfig(head_dim=HEAD_DIM, **common)
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):  # seed our init without disturbing the caller's RNG stream
        torch.manual_seed(spec.seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=common["bos_token_id"],
        eos_token_id=[ids[t] for t in spec.generation_eos],
        pad_token_id=ids[spec.pad],
    )
    # save_pretrained draws a progress bar per shard; noise in set-up logs and pytest output.
    progress = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if progress:
            transformers.utils.logging.enable_progress_bar()


# ------------------------------------------------------------------------------------------------ build


def file_hashes(model_dir: Path) -> dict[str, str]:
    """sha256 of every file of a built model except the stamp, keyed by relative path (sorted)."""
    out = {}
    for p in sorted(model_dir.rglob("*")):
        if p.is_file() and p.name != STAMP_NAME:
            out[p.relative_to(model_dir).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@functools.cache
def recipe_fingerprint() -> str:
    """sha256 of everything that determines the bytes of a build: this code, the templates, library versions.

    Cheap (no heavy imports), so the cached path stays fast; editing the builder invalidates every cache.
    """
    from nemo_gym_adapter.runtime import versions

    h = hashlib.sha256(str(BUILDER_VERSION).encode())
    for module_file in (Path(__file__), Path(T.__file__)):
        h.update(module_file.read_bytes())
    for dist in ("tokenizers", "transformers", "torch", "safetensors"):
        h.update(f"{dist}=={versions.installed(dist) or '?'}".encode())
    return h.hexdigest()


def is_complete(model_dir: Path, family: str) -> bool:
    """True when ``model_dir`` holds a finished build of ``family`` made by the current builder."""
    try:
        stamp = json.loads((model_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        stamp.get("builder_version") == BUILDER_VERSION
        and stamp.get("family") == family
        and stamp.get("recipe") == recipe_fingerprint()
    )


def build_tiny_model(family: str, root: Path | None = None) -> Path:
    """Build (or reuse) the tiny model of ``family`` under ``root`` and return its directory.

    ``root`` defaults to ``paths.tiny_models_dir()``; the result is ``root / family``. Safe to call from
    several processes at once: the first complete build to be renamed into place wins, the others reuse it.
    """
    spec = family_spec(family)
    root = Path(root) if root is not None else paths.tiny_models_dir()
    final = root / family
    if is_complete(final, family):
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{family}.building-", dir=root))
    try:
        tok = _train_tokenizer(spec)
        _write_tokenizer(tmp, spec, tok)
        _write_model(tmp, spec, tok)
        stamp = {
            "builder_version": BUILDER_VERSION,
            "family": family,
            "recipe": recipe_fingerprint(),
            "files": file_hashes(tmp),
        }
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        # mkdtemp makes the directory 0700 and safetensors writes 0600; other users' services may read it.
        os.chmod(tmp, 0o755)
        for p in tmp.iterdir():
            os.chmod(p, 0o644)
        _publish(tmp, final, family)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _publish(tmp: Path, final: Path, family: str) -> None:
    """Atomically move ``tmp`` to ``final``, replacing a stale build but never a complete one."""
    for _ in range(5):
        try:
            os.rename(tmp, final)  # atomic; fails if ``final`` is a non-empty directory
            return
        except OSError:
            if is_complete(final, family):
                return  # another builder won the race: its bytes are identical to ours
            # Stale or half-built by an older builder version: move it aside, then retry the rename.
            aside = final.with_name(f".{family}.stale-{os.getpid()}-{random.getrandbits(32):08x}")
            try:
                os.rename(final, aside)
            except FileNotFoundError:
                continue
            shutil.rmtree(aside, ignore_errors=True)
    raise SetupError(f"could not publish tiny model {family!r} at {final}: another process keeps replacing it")


def main(argv: list[str] | None = None) -> int:
    """CLI: build the requested families and print one ``family<TAB>path`` line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="all", choices=("all",) + FAMILIES)
    parser.add_argument("--root", type=Path, default=None, help="default: $NGV_TINY_MODELS or .cache/tiny-models")
    args = parser.parse_args(argv)
    for family in FAMILIES if args.family == "all" else (args.family,):
        print(f"{family}\t{build_tiny_model(family, args.root)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
