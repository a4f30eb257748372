"""What verl's trainers write to disk when the disk is full: a checkpoint that fails leaves the previous one loadable
and ends the run with one message naming the path; verl's rollout dump stops, the run goes on. Both trainers.

verl 0.9.1 saves a checkpoint as ``<trainer.default_local_dir>/global_step_<N>/`` (the actor's shards from its worker
ranks, ``data.pt`` from the trainer) and only then rewrites ``latest_checkpointed_iteration.txt``, which is what a
relaunch with ``trainer.resume_mode=auto`` reads (``find_latest_ckpt_path``: ``int(<tracker text>)``). A full disk
breaks that in two ways: a save that fails halfway leaves a partial ``global_step_<N>`` (harmless to a resume, but it
holds the space), and a failure *at the tracker* -- ``open(..., "w")`` truncates it before the write fails -- leaves
an empty tracker, on which every later resume dies with ``ValueError: invalid literal for int()``. And the error that
ends the run says neither where nor why: ``torch.save`` on a full disk raises ``RuntimeError: ... unexpected pos``.

:func:`save_checkpoint` wraps verl's ``_save_checkpoint`` (``NemoGymTrainerMixin`` on v1, ``NemoGymPPOTrainer`` on
the legacy trainer): when it fails, the tracker is put back as it was, the partial ``global_step_<N>`` removed
(this node's part of it: shards other nodes wrote stay there), and -- when the failure is a full disk
(:func:`nemo_gym_adapter.runtime.disk.full_disk`) -- the run ends with :class:`~nemo_gym_adapter.errors.StorageError`, whose
message names the path, the free space and the checkpoint a relaunch will resume from; ``recipe.nemo_gym.main``
prints it as the run's one error line. Any other failure is re-raised as it was, after the same clean-up.

:func:`write_generations` wraps verl's ``_write_generations`` (``trainer.rollout_data_dir``, a background thread):
a full disk stops that dump for the rest of the run with one error naming the file (the partial file removed), as
the adapter's own readable dump does (``nemo_gym_adapter.rollouts.dump``); training goes on until a checkpoint needs
the space.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import StorageError
from nemo_gym_adapter.runtime import disk

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"  # verl's checkpoint tracker (verl.utils.checkpoint)
_STOPPED_DUMPS: set[str] = set()  # verl rollout-dump directories a full disk stopped (this process)


def checkpoint_root(config: Any) -> Path:
    """``trainer.default_local_dir`` as verl resolves it (relative to the working directory)."""
    return Path(os.path.abspath(str(config.trainer.default_local_dir)))


VERL_V1_TRAINER_LOGGER = "verl.trainer.ppo.v1.trainer_base"


def saving_line(trainer: Any) -> str | None:
    """verl's v1 trainer says where a checkpoint goes and where a run resumes from at INFO only, which the recipe's
    ``VERL_LOGGING_LEVEL=WARN`` keeps off the console (``recipe.nemo_gym.trainer.console``): the line to print
    instead before a save, or None when verl's INFO is on (verl says it itself)."""
    if logging.getLogger(VERL_V1_TRAINER_LOGGER).isEnabledFor(logging.INFO):
        return None
    return f"Saving checkpoint to {checkpoint_root(trainer.config) / f'global_step_{int(trainer.global_steps)}'}"


def resuming_line(trainer: Any) -> str | None:
    """As :func:`saving_line`, after verl's ``_load_checkpoint``: where the run resumed from (None: a fresh start)."""
    step = int(trainer.global_steps)
    if step <= 0 or logging.getLogger(VERL_V1_TRAINER_LOGGER).isEnabledFor(logging.INFO):
        return None
    trainer_cfg = trainer.config.trainer
    if trainer_cfg.get("resume_mode") == "resume_path" and trainer_cfg.get("resume_from_path"):
        folder = Path(os.path.abspath(str(trainer_cfg.resume_from_path)))
    else:
        folder = checkpoint_root(trainer.config) / f"global_step_{step}"
    return f"Resuming from {folder}, setting global step to {step}"


def save_checkpoint(trainer: Any, save: Callable[[], Any]) -> Any:
    """``save()`` (verl's ``_save_checkpoint`` of ``trainer``), or -- when it fails -- the previous checkpoint left as
    the one a resume loads, and a :class:`StorageError` naming the path if the disk is full (module docstring)."""
    root = checkpoint_root(trainer.config)
    step = int(trainer.global_steps)
    folder = root / f"global_step_{step}"
    tracker = root / TRACKER
    before = _read(tracker)
    existed = folder.exists()
    try:
        return save()
    except Exception as e:
        after = disk.space(folder)  # before anything is removed: the space the failed write saw
        full = disk.full_disk(e, after)
        notes = []
        if (_read(tracker) or b"").strip() != str(step).encode():  # else verl finished it: step N is complete
            notes.append(_restore_tracker(tracker, before))
            if not existed:
                shutil.rmtree(folder, ignore_errors=True)
                notes.append(f"the partial {folder.name} was removed" + (" (in part)" if folder.exists() else ""))
        if full is None:
            logger.error("checkpoint of step %d failed (%s); %s", step, folder, "; ".join(n for n in notes if n))
            raise
        where = disk.failed_path(e) or str(folder)
        previous = _previous(root, _read(tracker))
        raise StorageError(
            f"the checkpoint of step {step} could not be written: {full} at {where} ({after}); "
            + "; ".join(n for n in notes if n)
            + f"; {previous}. Free space under {root} (or set trainer.default_local_dir to a larger disk) and relaunch "
            "the same command with trainer.resume_mode=auto"
        ) from e


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _restore_tracker(tracker: Path, before: bytes | None) -> str:
    """Put ``tracker`` back to ``before`` (None: it did not exist); a note when that was needed or failed."""
    now = _read(tracker)
    if now == before:
        return ""
    try:
        if before is None:
            tracker.unlink(missing_ok=True)
        else:
            tracker.write_bytes(before)  # its truncation freed the block this needs
    except OSError as e:
        return f"{tracker} could not be restored ({e!r}): write {before!r} into it before relaunching"
    return f"{tracker.name} restored"


def _previous(root: Path, tracker: bytes | None) -> str:
    """Which checkpoint a relaunch with ``resume_mode=auto`` loads, as verl finds it."""
    if tracker is None:
        return f"no earlier checkpoint under {root}: a relaunch starts from step 0"
    text = tracker.decode(errors="replace").strip()
    folder = root / f"global_step_{text}"
    if not folder.is_dir():
        return f"{TRACKER} names step {text} but {folder} is missing: a relaunch starts from step 0"
    return f"the previous checkpoint {folder} is intact and is what a relaunch resumes from"


def write_generations(write: Callable[..., None], *args: Any) -> None:
    """verl's ``_write_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path, global_steps)``
    through ``write``, unless a full disk stopped this dump already; a full disk now stops it (module docstring)."""
    dump_path, global_steps = str(args[5]), args[6]
    if dump_path in _STOPPED_DUMPS:
        return
    try:
        write(*args)
    except OSError as e:
        path = Path(dump_path) / f"{global_steps}.jsonl"
        after = disk.space(path)
        full = disk.full_disk(e, after)
        if full is None:
            raise
        _STOPPED_DUMPS.add(dump_path)
        path.unlink(missing_ok=True)  # verl writes the step's file in one go: a partial one is useless
        logger.error(
            "verl's rollout dump (trainer.rollout_data_dir): %s writing %s (%s); that dump stops here (training goes on)",
            full,
            path,
            after,
        )
