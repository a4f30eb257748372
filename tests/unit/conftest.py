"""Fixtures shared by the unit tests of the splice and the in-place edit check."""

from __future__ import annotations

import json

import pytest

FAMILIES = ("qwen25", "qwen3", "llama3")


@pytest.fixture(scope="module")
def family_tokenizers(tiny_model_dir):
    """family -> (tokenizer, TurnTemplate with the generation-config stop ids, terminator text)."""
    from transformers import AutoTokenizer

    from nemo_gym_adapter.splice import turn_template_from_tokenizer

    out = {}
    for family in FAMILIES:
        path = tiny_model_dir(family)
        tok = AutoTokenizer.from_pretrained(path)
        eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
        template = turn_template_from_tokenizer(tok, eos if isinstance(eos, list) else [eos])
        out[family] = (tok, template, tok.convert_ids_to_tokens(template.terminator_id))
    return out
