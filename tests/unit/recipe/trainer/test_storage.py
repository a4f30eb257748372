"""A full disk at a checkpoint or verl's rollout dump (``recipe.nemo_gym.trainer.storage``), on a real tmpfs of a few MiB.

The saves here are fakes of verl's ``_save_checkpoint`` that write the way it does (``torch.save`` into
``global_step_<N>/``, then ``latest_checkpointed_iteration.txt`` with ``open(..., "w")``); verl's own dump writer
(``_write_generations``) is the real one, through both trainers' classes. The whole run is
``tests/e2e/test_recipe_disk_full.py``."""

from __future__ import annotations

import errno
import gc
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_gym_adapter.errors import StorageError
from recipe.nemo_gym.trainer import storage
from tests.support.tmpfs import fill, small_tmpfs


def trainer_at(root: Path, step: int) -> SimpleNamespace:
    return SimpleNamespace(
        config=SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(root))), global_steps=step
    )


def previous_checkpoint(root: Path, step: int = 1) -> None:
    (root / f"global_step_{step}" / "actor").mkdir(parents=True)
    (root / f"global_step_{step}" / "actor" / "model.pt").write_bytes(b"w" * 1000)
    (root / storage.TRACKER).write_text(str(step))


def verl_like_save(root: Path, step: int, tensor_mb: float):
    """What verl's ``_save_checkpoint`` writes, in its order: the actor's shard, ``data.pt``, the tracker."""

    def save() -> None:
        import torch

        folder = root / f"global_step_{step}"
        (folder / "actor").mkdir(parents=True, exist_ok=True)
        torch.save(torch.zeros(int(tensor_mb * 2**20 / 4)), folder / "actor" / "model_world_size_1_rank_0.pt")
        torch.save({"epoch": 0}, folder / "data.pt")
        with open(root / storage.TRACKER, "w") as f:
            f.write(str(step))

    return save


def test_a_checkpoint_that_fills_the_disk_leaves_the_previous_one_and_names_the_path(tmp_path):
    with small_tmpfs(tmp_path / "fs", 4) as fs:
        root = fs / "ckpt"
        previous_checkpoint(root)
        with pytest.raises(StorageError) as raised:
            storage.save_checkpoint(trainer_at(root, 2), verl_like_save(root, 2, tensor_mb=8))
        message = str(raised.value)
        print(f"\n[disk full] {message}")
        assert "step 2 could not be written" in message and str(root / "global_step_2") in message
        assert "MiB free of 4.0 MiB" in message and f"{root / 'global_step_1'} is intact" in message
        assert "resume_mode=auto" in message
        assert isinstance(raised.value.__cause__, RuntimeError)  # torch.save's "unexpected pos": no errno at all
        assert (root / storage.TRACKER).read_text() == "1" and (root / "global_step_1" / "actor" / "model.pt").exists()
        assert not (root / "global_step_2").exists()  # the partial checkpoint gave its space back
        del raised  # its traceback holds torch's open file: deleted, its blocks stay taken until it is closed
        gc.collect()
        storage.save_checkpoint(trainer_at(root, 2), verl_like_save(root, 2, tensor_mb=0.5))  # now it fits
        assert (root / storage.TRACKER).read_text() == "2"


def test_a_tracker_emptied_by_the_failing_write_is_put_back(tmp_path):
    """``open(tracker, "w")`` truncates before the write fails: left so, every resume dies on ``int("")``."""
    root = tmp_path / "ckpt"
    previous_checkpoint(root, 4)

    def save() -> None:
        verl_like_save(root, 5, tensor_mb=0.01)()
        with open(root / storage.TRACKER, "w"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(StorageError, match="No space left on device") as raised:
        storage.save_checkpoint(trainer_at(root, 5), save)
    assert (root / storage.TRACKER).read_text() == "4" and "restored" in str(raised.value)
    assert not (root / "global_step_5").exists() and "global_step_4 is intact" in str(raised.value)


def test_another_failure_is_raised_as_it_was_after_the_same_clean_up(tmp_path):
    root = tmp_path / "ckpt"

    def save() -> None:
        (root / "global_step_1").mkdir(parents=True)
        raise ValueError("a worker died")

    with pytest.raises(ValueError, match="a worker died"):
        storage.save_checkpoint(trainer_at(root, 1), save)
    assert not (root / "global_step_1").exists() and not (root / storage.TRACKER).exists()


def test_a_failure_after_verl_named_the_new_checkpoint_keeps_it(tmp_path):
    root = tmp_path / "ckpt"
    previous_checkpoint(root, 1)

    def save() -> None:
        verl_like_save(root, 2, tensor_mb=0.01)()
        raise OSError(errno.ENOSPC, "No space left on device")  # e.g. a callback after the tracker was written

    with pytest.raises(StorageError, match="global_step_2 is intact"):
        storage.save_checkpoint(trainer_at(root, 2), save)
    assert (root / storage.TRACKER).read_text() == "2" and (root / "global_step_2" / "data.pt").exists()


def _trainer_classes():
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from recipe.nemo_gym.trainer.task_runner import NemoGymPPOTrainer
    from recipe.nemo_gym.trainer.task_runner_v1 import nemo_gym_trainer_cls

    return {"legacy": NemoGymPPOTrainer, "v1": nemo_gym_trainer_cls(PPOTrainer)}


@pytest.mark.parametrize("trainer", ["legacy", "v1"])
def test_verls_rollout_dump_on_a_full_disk_stops_with_one_error_and_the_run_goes_on(tmp_path, caplog, trainer):
    cls = _trainer_classes()[trainer]
    storage._STOPPED_DUMPS.clear()
    rows = ["x" * 50_000] * 40  # ~2 MB of outputs: more than the disk holds
    with small_tmpfs(tmp_path / "fs", 1) as fs:
        dump = fs / "rollouts"
        cls._write_generations(["in"], ["out"], [None], [1.0], {}, str(dump), 1)  # fits
        assert (dump / "1.jsonl").exists()
        fill(fs, leave_bytes=8192)
        with caplog.at_level("ERROR", logger="recipe.nemo_gym.trainer.storage"):
            cls._write_generations(["in"] * 40, rows, [None] * 40, [0.0] * 40, {}, str(dump), 2)
            cls._write_generations(["in"], ["out"], [None], [1.0], {}, str(dump), 3)  # the dump stopped: skipped
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and str(dump / "2.jsonl") in errors[0] and "training goes on" in errors[0], errors
        assert not (dump / "2.jsonl").exists() and not (dump / "3.jsonl").exists()
    storage._STOPPED_DUMPS.clear()


def test_where_a_checkpoint_goes_and_where_a_run_resumes_from_are_said_when_verls_info_is_off(tmp_path):
    import logging

    from omegaconf import OmegaConf

    verl_logger = logging.getLogger(storage.VERL_V1_TRAINER_LOGGER)
    original = verl_logger.level
    cfg = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto"}})
    trainer = SimpleNamespace(config=cfg, global_steps=3)
    try:
        verl_logger.setLevel(logging.WARNING)  # the recipe's VERL_LOGGING_LEVEL=WARN
        assert storage.saving_line(trainer) == f"Saving checkpoint to {tmp_path / 'global_step_3'}"
        assert storage.resuming_line(trainer) == f"Resuming from {tmp_path / 'global_step_3'}, setting global step to 3"
        assert storage.resuming_line(SimpleNamespace(config=cfg, global_steps=0)) is None  # a fresh start: nothing
        cfg.trainer.resume_mode, cfg.trainer.resume_from_path = "resume_path", str(tmp_path / "elsewhere/global_step_2")
        assert storage.resuming_line(SimpleNamespace(config=cfg, global_steps=2)).startswith(
            f"Resuming from {tmp_path / 'elsewhere/global_step_2'}, "
        )
        verl_logger.setLevel(logging.INFO)  # verl says it itself: no second line
        assert storage.saving_line(trainer) is None and storage.resuming_line(trainer) is None
    finally:
        verl_logger.setLevel(original)
