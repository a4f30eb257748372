"""What a converted demo model must satisfy before it is published (the converter's ``verify`` step), as checks that
return the problems they found: the special tokens its manifest names, in the tokenizer, the config and the generation
config alike; the chat template; tokens that must stay one id; text that must survive encode/decode; a greedy answer
(and, for a tool model, a greedy tool call) from the reloaded weights.

The pure checks take any objects with a tokenizer's / config's attributes, so they are unit-tested with fakes;
:func:`verify` reloads the saved directory as any user would (no ``gguf``) and runs them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_gym_adapter.demo_models.manifests import Manifest

#: A tool every tool-model check uses (the shape of Gym's ``example_single_tool_call``).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ROUNDTRIP_SAMPLE = 'Hello , world . 3 + 4 = 7 ! don \'t\n\n  {"a": [1, 2]}'


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def special_token_problems(m: Manifest, tok: Any, config: Any, generation: Any) -> list[str]:
    """What is wrong with a converted model's special tokens (empty when the tokenizer has exactly the manifest's
    tokens, and the config and generation config name the same ids)."""
    problems = []
    for name, want in m.tokens.items():
        got = getattr(tok, f"{name}_token", None)
        if got != want:
            problems.append(f"tokenizer {name}_token is {got!r}, expected {want!r}")
    if len(tok) != m.vocab_size or config.vocab_size != m.vocab_size:
        problems.append(f"len(tokenizer)={len(tok)}, config.vocab_size={config.vocab_size}, expected {m.vocab_size}")
    for name in ("eos", "pad", "bos"):
        token = m.tokens.get(name)
        if token is None:
            continue
        want_id = tok.convert_tokens_to_ids(token)
        found = {
            "tokenizer": getattr(tok, f"{name}_token_id", None),
            "config": getattr(config, f"{name}_token_id", None),
        }
        if name != "eos":  # the generation config's eos is the list of stop ids, checked below
            found["generation_config"] = getattr(generation, f"{name}_token_id", None)
        wrong = {where: got for where, got in found.items() if got != want_id}
        if wrong:
            problems.append(f"{name} id should be {want_id} ({token}) everywhere, found {wrong}")
    want_stops = [tok.convert_tokens_to_ids(t) for t in m.generation_eos]
    got_stops = _as_list(getattr(generation, "eos_token_id", None))
    if got_stops != want_stops:
        problems.append(
            f"generation_config.eos_token_id is {got_stops}, expected {want_stops} {list(m.generation_eos)}"
        )
    return problems


def single_token_problems(tok: Any, tokens: Sequence[str]) -> list[str]:
    """Each of ``tokens`` must encode to one id and decode back to itself even with special tokens skipped when it is
    not special (a tool parser reads it in the detokenized text)."""
    problems = []
    specials = set(getattr(tok, "all_special_tokens", ()))
    for token in tokens:
        ids = tok.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            problems.append(f"{token!r} encodes to {len(ids)} ids {ids}, expected one")
            continue
        if token not in specials and tok.decode(ids, skip_special_tokens=True) != token:
            problems.append(f"{token!r} (id {ids[0]}) does not survive decode(skip_special_tokens=True)")
    return problems


def template_problems(m: Manifest, tok: Any) -> list[str]:
    """The template renders a plain chat as the manifest says; a tool model's renders its tools and a call."""
    problems = []
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], tokenize=False
    )
    if text != m.template_render:
        problems.append(f"the chat template renders {text!r}, expected {m.template_render!r}")
    if m.tool_parser is not None:
        call = {"type": "function", "id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
        text = tok.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=False)
        for marker in ("<tools>", "get_weather", "<tool_call>", "<tool_response>"):
            if marker not in text:
                problems.append(f"the template with tools renders no {marker!r}")
    return problems


def text_problems(tok: Any) -> list[str]:
    problems = []
    if tok.convert_ids_to_tokens(tok.encode("12 + 345", add_special_tokens=False))[:2] != ["1", "2"]:
        problems.append("digits are not split one by one")
    if tok.decode(tok.encode(ROUNDTRIP_SAMPLE, add_special_tokens=False)) != ROUNDTRIP_SAMPLE:
        problems.append(f"decode(encode({ROUNDTRIP_SAMPLE!r})) differs")
    return problems


def _greedy(model: Any, tok: Any, messages: list[dict], tools: list[dict] | None, max_new_tokens: int) -> str:
    import torch

    prompt = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tok.decode(out[0, prompt["input_ids"].shape[1] :]))


def verify(m: Manifest, model_dir: Path) -> tuple[list[str], dict[str, str]]:
    """Reload ``model_dir`` without gguf and run every check: (problems, the smoke answers)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    config, generation = AutoConfig.from_pretrained(model_dir), GenerationConfig.from_pretrained(model_dir)
    problems = special_token_problems(m, tok, config, generation)
    problems += template_problems(m, tok)
    problems += text_problems(tok)
    markers = [t for t in m.tokens.values() if t] + (["<tool_call>", "</tool_call>"] if m.tool_parser else [])
    problems += single_token_problems(tok, sorted(set(markers)))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    answers = {"answer": _greedy(model, tok, [{"role": "user", "content": _QUESTION}], None, 16)}
    eos = m.tokens["eos"] or ""
    if m.smoke_answer not in answers["answer"] or not answers["answer"].endswith(eos):
        problems.append(f"greedy answer {answers['answer']!r} lacks {m.smoke_answer!r} or the {eos} stop")
    if m.smoke_tool_call is not None:
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        answers["tool_call"] = _greedy(model, tok, ask, [WEATHER_TOOL], 40)
        if m.smoke_tool_call not in answers["tool_call"]:
            problems.append(f"greedy answer with a tool {answers['tool_call']!r} lacks {m.smoke_tool_call!r}")
    return problems, answers


_QUESTION = "What is the capital of France? Answer in one word."
