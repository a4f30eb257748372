"""A minimal valid whole recipe config (verl keys the adapter reads + the ``nemo_gym:`` section) for unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_gym_adapter.errors import AdapterConfigError
from recipe.nemo_gym.config.load import DATASET_NAME, DATASET_PATH, MANAGER_CLASS, load_config

GYM_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"


def minimal_recipe_config(tmp_path: Path) -> dict[str, Any]:
    """A minimal valid whole config (the verl keys we read + our section), as plain dicts; data in ``tmp_path``."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"responses_create_params": {"input": "hi"}, "agent_ref": {"name": "a"}}\n')
    return {
        "trainer": {"use_v1": False},
        "algorithm": {"adv_estimator": "masked_grpo"},
        "data": {
            "train_files": [str(data)],
            "val_files": str(data),
            "custom_cls": {"path": DATASET_PATH, "name": DATASET_NAME},
        },
        "actor_rollout_ref": {
            "model": {"path": "Qwen/Qwen2.5-1.5B-Instruct"},
            "rollout": {
                "name": "vllm",
                "n": 4,
                "prompt_length": 256,
                "response_length": 128,
                "max_model_len": None,
                "temperature": 1.0,
                "top_p": 1,
                "val_kwargs": {"temperature": 0, "top_p": 1.0},
                "agent": {"agent_loop_manager_class": MANAGER_CLASS},
            },
        },
        "nemo_gym": {"config_paths": [GYM_CONFIG]},
    }


def config_error(cfg: Any) -> str:
    """The message of the ``AdapterConfigError`` :func:`load_config` raises for ``cfg`` (fails the test if none)."""
    with pytest.raises(AdapterConfigError) as e:
        load_config(cfg)
    return str(e.value)
