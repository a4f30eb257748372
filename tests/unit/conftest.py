"""Unit-tier fixtures: an empty datasets cache per test, no watchdog processes, fake Gym servers (``tests/support/fake_gym.py``), a fake
Gym venv (``tests/support/fake_gym_venv.py``), and the tiny families' tokenizers for the splice/edit-check tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_gym import FakeEnvServer
from tests.support.fake_gym_venv import make_fake_gym_venv


@pytest.fixture
def fake_server() -> Iterator[FakeEnvServer]:
    """A fake environment server serving ``POST /run`` on a free port; stopped after the test."""
    server = FakeEnvServer()
    yield server
    server.stop()


@pytest.fixture
def fake_gym_venv(tmp_path: Path) -> Path:
    """A directory shaped like the Gym venv: bin/python, bin/gym (the fake Gym), site-packages with nemo_gym/."""
    return make_fake_gym_venv(tmp_path)


@pytest.fixture(autouse=True)
def light_warm_launchers(monkeypatch):
    """Warm Gym launchers (``gym_warm``, on by default) started by unit tests run the fake Gym with the trainer's
    Python: they pre-import one stdlib module, not Gym's third-party stack (seconds of imports per test)."""
    from nemo_gym_adapter.gym import warm as gym_warm

    monkeypatch.setattr(gym_warm, "PRELOAD", ("json",))


@pytest.fixture(autouse=True)
def watchdog_requests(monkeypatch, tmp_path_factory) -> list[Path]:
    """The unit tier starts no watchdog process in its own process (``reaper.start_watchdog``: one would live as long
    as pytest): the run dirs asked for are recorded here instead. The node's registry of trainers is a private one
    (``NGV_STATE_DIR``), for subprocesses too (``tests/unit/runtime/test_reaper.py`` starts real watchdogs there)."""
    from nemo_gym_adapter.runtime import reaper

    requested: list[Path] = []
    monkeypatch.setattr(reaper, "start_watchdog", lambda run_dir, owner_pid=None: requested.append(run_dir))
    monkeypatch.setenv("NGV_STATE_DIR", str(tmp_path_factory.mktemp("ngv_state")))
    return requested


@pytest.fixture(autouse=True)
def isolated_datasets_cache(tmp_path_factory, monkeypatch):
    """Every unit test gets an empty ``HF_DATASETS_CACHE``: the Gym dataset's validated-rows cache
    (:mod:`nemo_gym_adapter.data.store`) never reads or fills the user's, and no test hits another's entries."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets")))


FAMILIES = ("qwen25", "qwen3", "llama3")


@pytest.fixture(scope="module")
def family_tokenizers(tiny_model_dir):
    """family -> (tokenizer, TurnTemplate with the generation-config stop ids, terminator text)."""
    from transformers import AutoTokenizer

    from nemo_gym_adapter.tokens.turn_template import turn_template_from_tokenizer

    out = {}
    for family in FAMILIES:
        path = tiny_model_dir(family)
        tok = AutoTokenizer.from_pretrained(path)
        eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
        template = turn_template_from_tokenizer(tok, eos if isinstance(eos, list) else [eos])
        out[family] = (tok, template, tok.convert_ids_to_tokens(template.terminator_id))
    return out
