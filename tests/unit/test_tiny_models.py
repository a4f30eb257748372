"""Unit tests of the deterministic tiny test models (real tokenizers/transformers, no servers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym_adapter.demo_models import templates as T
from nemo_gym_adapter.demo_models import tiny_models as tm
from tests.support.conversations import TOOLS


def _call(city, as_string: bool) -> dict:
    args = {"city": city}
    return {
        "id": f"call_{city}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(args) if as_string else args},
    }


def conversation(as_string: bool = True) -> list[dict]:
    """user → assistant(tool call, with reasoning) → tool → assistant(answer, with reasoning) → user → ..."""
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "OLD-R1", "tool_calls": [_call("Paris", as_string)]},
        {"role": "tool", "tool_call_id": "call_Paris", "content": '{"temperature": 18}'},
        {"role": "assistant", "content": "<think>\nOLD-R2\n</think>\n\nIt is 18 degrees."},
        {"role": "user", "content": "And Tokyo?"},
        {"role": "assistant", "content": "", "reasoning_content": "NEW-R3", "tool_calls": [_call("Tokyo", as_string)]},
        {"role": "tool", "tool_call_id": "call_Tokyo", "content": '{"temperature": 25}'},
    ]


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _render(path: Path, messages, **kwargs) -> str:
    return _tokenizer(path).apply_chat_template(messages, tools=TOOLS, tokenize=False, **kwargs)


# ------------------------------------------------------------------------------------------ build mechanics


def test_unknown_family_raises_value_error_naming_valid_families(tmp_path):
    with pytest.raises(ValueError) as info:
        tm.build_tiny_model("mistral", tmp_path)
    for family in tm.FAMILIES:
        assert family in str(info.value)
    assert not list(tmp_path.iterdir()), "nothing may be written for an unknown family"


@pytest.fixture(scope="module")
def fresh_root(tmp_path_factory) -> Path:
    """All families built in this process into an empty root (independent of the shared cache)."""
    root = tmp_path_factory.mktemp("tiny-a")
    for family in tm.FAMILIES:
        tm.build_tiny_model(family, root)
    return root


def test_concurrent_builds_in_other_processes_are_byte_identical(fresh_root, tmp_path):
    # Two interpreters (different hash seeds) race to build every family into one empty root: both must
    # return the same complete directories, no temporary directory may remain, and the published bytes
    # must equal this process's own build.
    cmd = [sys.executable, "-m", "nemo_gym_adapter.demo_models", "--root", str(tmp_path)]
    procs = [
        subprocess.Popen(
            cmd,
            env=dict(os.environ, PYTHONHASHSEED=str(seed)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err
        assert out.splitlines() == [f"{family}\t{tmp_path / family}" for family in tm.FAMILIES]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(tm.FAMILIES), "temporary build directories left"
    for family in tm.FAMILIES:
        assert tm.is_complete(tmp_path / family, family)
        first, second = tm.file_hashes(fresh_root / family), tm.file_hashes(tmp_path / family)
        assert set(first) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
        assert first == second, f"{family}: builds differ"
        assert (fresh_root / family / tm.STAMP_NAME).read_bytes() == (tmp_path / family / tm.STAMP_NAME).read_bytes()


def test_complete_build_is_reused_and_stale_one_replaced(fresh_root):
    model_dir = fresh_root / "qwen25"
    weights = model_dir / "model.safetensors"
    before = weights.stat().st_ino, weights.stat().st_mtime_ns
    assert tm.build_tiny_model("qwen25", fresh_root) == model_dir
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == before, "a complete build must not be rewritten"

    # A build stamped by another builder is stale: it must be replaced, not reused.
    stamp_path = model_dir / tm.STAMP_NAME
    expected_stamp = stamp_path.read_text()
    stale = json.loads(expected_stamp) | {"recipe": "0" * 64}
    stamp_path.write_text(json.dumps(stale))
    assert not tm.is_complete(model_dir, "qwen25")
    assert tm.build_tiny_model("qwen25", fresh_root) == model_dir
    assert tm.is_complete(model_dir, "qwen25")
    assert weights.stat().st_ino != before[0]
    assert stamp_path.read_text() == expected_stamp
    assert sorted(p.name for p in fresh_root.iterdir()) == sorted(tm.FAMILIES), "temp or stale dirs left behind"


def test_cli_builds_one_family_without_touching_the_callers_rng(tmp_path, capsys):
    import torch

    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    assert tm.main(["--family", "llama3", "--root", str(tmp_path)]) == 0
    assert torch.equal(torch.rand(4), expected), "building reseeded the global torch RNG"
    assert capsys.readouterr().out == f"llama3\t{tmp_path / 'llama3'}\n"
    assert tm.is_complete(tmp_path / "llama3", "llama3")


# ---------------------------------------------------------------------------------- tokenizer and model


@pytest.mark.parametrize("family", tm.FAMILIES)
def test_tokenizer_has_family_tokens_and_stop_ids(tiny_model_dir, family):
    path = tiny_model_dir(family)
    tok = _tokenizer(path)
    spec = tm.family_spec(family)
    assert 2000 <= len(tok) <= 4200
    for text in spec.special + spec.added:
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == 1, f"{text} must be one token, got {ids}"
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids(t) for t in spec.generation_eos]
    assert tok.eos_token == spec.eos and tok.pad_token == spec.pad
    if family == "llama3":
        eot = tok.convert_tokens_to_ids("<|eot_id|>")
        assert tok.eos_token_id != eot and eot in gen["eos_token_id"], "llama3: turn end differs from EOS"
        assert tok("hi").input_ids[0] == tok.bos_token_id, "plain encoding adds BOS like Llama 3"
    else:
        assert gen["eos_token_id"][1] == tok.convert_tokens_to_ids("<|endoftext|>")
        assert tok("hi").input_ids == tok.encode("hi", add_special_tokens=False), "no BOS for Qwen"


def test_qwen_families_share_token_ids(tiny_model_qwen25, tiny_model_qwen3):
    a, b = _tokenizer(tiny_model_qwen25), _tokenizer(tiny_model_qwen3)
    shared = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_response>", " weather"]
    assert [a.encode(t, add_special_tokens=False) for t in shared] == [
        b.encode(t, add_special_tokens=False) for t in shared
    ]
    assert len(b) == len(a) + 2  # <think>, </think>


@pytest.mark.parametrize("family", tm.FAMILIES)
def test_transformers_tokenizer_matches_raw_tokenizer_json(tiny_model_dir, family):
    # transformers 5 rebuilds Qwen tokenizers from vocab/merges (Qwen2Tokenizer): it must agree with the file.
    from tokenizers import Tokenizer

    path = tiny_model_dir(family)
    raw, tok = Tokenizer.from_file(str(path / "tokenizer.json")), _tokenizer(path)
    for line in T.training_corpus()[::97] + ["Ünïcödé café 12345 <tool_call>\n{}</tool_call><|im_end|>"]:
        assert tok.encode(line, add_special_tokens=False) == raw.encode(line, add_special_tokens=False).ids, line


@pytest.mark.parametrize("family", tm.FAMILIES)
@pytest.mark.parametrize("word", ["Skinny", " Skinny", " weather", " temperature"])
def test_single_token_word_has_a_two_token_spelling_that_reencodes_to_one(tiny_model_dir, family, word):
    # The retokenization drift: the model may emit the two halves of a merge; re-encoding yields one id.
    path = tiny_model_dir(family)
    tok = _tokenizer(path)
    (whole,) = tok.encode(word, add_special_tokens=False)
    merges = json.loads((path / "tokenizer.json").read_text())["model"]["merges"]
    target = tok.convert_ids_to_tokens(whole)
    left, right = next(_pair(m) for m in merges if "".join(_pair(m)) == target)  # the merge that made it
    pieces = tok.convert_tokens_to_ids([left, right])
    assert whole not in pieces and len(set(pieces)) == 2
    text = tok.decode(pieces)
    assert text == word
    assert tok.encode(text, add_special_tokens=False) == [whole]


def _pair(merge) -> list[str]:
    return merge if isinstance(merge, list) else merge.split(" ")


@pytest.mark.parametrize("family", tm.FAMILIES)
def test_model_config_and_forward_pass(tiny_model_dir, family):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tiny_model_dir(family)
    config = AutoConfig.from_pretrained(path)
    spec = tm.family_spec(family)
    assert config.architectures == [spec.architecture]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, head_dim) == (64, 2, 2, 32)
    assert config.max_position_embeddings == 16384 and config.tie_word_embeddings
    tok = _tokenizer(path)
    assert config.vocab_size == len(tok)  # no padding rows: see test_softmax_over_every_row_is_verls_rollout_softmax
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == spec.architecture
    assert next(model.parameters()).dtype == torch.float32
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), config.vocab_size)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("family", tm.FAMILIES)
def test_softmax_over_every_row_is_verls_rollout_softmax(tiny_model_dir, family):
    """verl's actor normalises over every LM-head row; verl's vLLM server only over the first len(tokenizer) rows
    (``monkey_patch_compute_logits`` sets the rest to -inf). On our models both must be the same distribution:
    with the old padding to a multiple of 64 the rollout log-probs sat 3.4e-4 (qwen25) / 2.1e-2 (qwen3) above."""
    import torch
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir(family)
    tok = _tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = tok.apply_chat_template(conversation(), add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    actor = torch.log_softmax(logits, dim=-1)[:, : len(tok)]
    rollout = torch.log_softmax(logits[:, : len(tok)], dim=-1)
    gap = (rollout - actor).abs().max().item()
    assert gap < 1e-6, f"{family}: rollout softmax {gap:.1e} above the actor's ({model.config.vocab_size} rows)"


# ------------------------------------------------------------------------------------------ chat templates


def test_qwen25_template_structure(tiny_model_qwen25):
    text = _render(tiny_model_qwen25, conversation(), add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
    ) in text
    assert '<|im_start|>user\n<tool_response>\n{"temperature": 18}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == text.count("<|im_end|>") + 1
    # Qwen2.5 knows no reasoning: reasoning_content is ignored, a <think> text in content is kept verbatim.
    assert "OLD-R1" not in text and "NEW-R3" not in text
    assert "<|im_start|>assistant\n<think>\nOLD-R2\n</think>\n\nIt is 18 degrees.<|im_end|>" in text
    # Without a system message Qwen2.5 inserts a default one; developer is treated as system.
    plain = _render(tiny_model_qwen25, [{"role": "user", "content": "hi"}])
    assert plain.startswith("<|im_start|>system\n") and "<|im_start|>user\nhi<|im_end|>\n" in plain
    dev = [{"role": "developer", "content": "Rules."}, {"role": "user", "content": "hi"}]
    assert _render(tiny_model_qwen25, dev) == _render(tiny_model_qwen25, [dev[0] | {"role": "system"}, dev[1]])


def test_qwen3_template_strips_reasoning_before_last_query_only(tiny_model_qwen3):
    msgs = conversation()
    text = _render(tiny_model_qwen3, msgs, add_generation_prompt=True)
    assert "OLD-R1" not in text and "OLD-R2" not in text, "reasoning before the last user query is dropped"
    assert "<|im_start|>assistant\nIt is 18 degrees.<|im_end|>" in text, "<think> prefix stripped from content"
    assert "<|im_start|>assistant\n<think>\nNEW-R3\n</think>\n\n<tool_call>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    # Before the second user query existed, the same earlier turn kept its reasoning (the last-query rule).
    prefix = _render(tiny_model_qwen3, msgs[:5])
    assert "<think>\nOLD-R1\n</think>\n\n<tool_call>" in prefix and "<think>\nOLD-R2\n</think>\n\nIt is 18" in prefix
    no_think = _render(tiny_model_qwen3, msgs[:2], add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_llama3_template_structure(tiny_model_llama3):
    tok = _tokenizer(tiny_model_llama3)
    msgs = conversation()
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    assert text.count("<|begin_of_text|>") == 1
    # Every message is closed by <|eot_id|>; the generation prompt opens one more header.
    assert text.count("<|eot_id|>") == len(msgs)
    assert text.count("<|start_header_id|>") == len(msgs) + 1
    assert '"name": "get_weather"' in text.split("What is the weather in Paris?")[0], "tools in the first user turn"
    assert (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        in text
    )
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n{"temperature": 18}<|eot_id|>' in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    in_system = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, tools_in_user_message=False)
    assert '"name": "get_weather"' in in_system.split("<|eot_id|>")[0]
    # Token ids from the template carry exactly one BOS (no double BOS from the tokenizer's post-processor).
    ids = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id


@pytest.mark.parametrize("family", tm.FAMILIES)
def test_templates_accept_vllm_style_inputs(tiny_model_dir, family):
    # vLLM may hand tool-call arguments as parsed dicts and content as OpenAI parts: same text either way.
    path = tiny_model_dir(family)
    as_string = _render(path, conversation(as_string=True), add_generation_prompt=True)
    assert _render(path, conversation(as_string=False), add_generation_prompt=True) == as_string
    parts = [m | {"content": [{"type": "text", "text": m["content"]}]} if m["content"] else m for m in conversation()]
    assert _render(path, parts, add_generation_prompt=True) == as_string
    # No tools, no generation prompt, assistant content None: still renders.
    bare = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [_call("Oslo", True)]},
    ]
    assert "Oslo" in _tokenizer(path).apply_chat_template(bare, tokenize=False)
