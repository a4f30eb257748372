"""A full disk at a checkpoint, end to end (hydra, CPU, verl's v1 trainer; issue 27, item 5).

The README demo on 8 rows with a checkpoint every step (``trainer.save_freq=1``), checkpoints and both rollout dumps
(verl's ``trainer.rollout_data_dir`` and the adapter's readable one under it) on a 64 MiB tmpfs. Once step 1's
checkpoint is complete (``latest_checkpointed_iteration.txt`` says 1) the test fills the tmpfs to the last byte:

- launch 1 goes on into step 2, whose rollout dump stops with one error naming its file (training goes on), and whose
  checkpoint fails (``torch.save``: "unexpected pos"): the run ends, exit status 1, with one line ``error: the
  checkpoint of step 2 could not be written: ... at <tmpfs>/ckpt/global_step_2 ...`` naming the previous checkpoint;
  the tracker still says 1, the partial ``global_step_2`` is gone;
- the space freed (the filler removed), launch 2 (same command, ``resume_mode=auto``) resumes from ``global_step_1``
  and trains steps 2 and 3, checkpointing both; nothing of either launch is left.

Needs root (the tmpfs). Slow tier (two launches per trainer); the default tier has the same mechanism on a real tmpfs
with verl's own dump writer in ``tests/unit/recipe/trainer/test_storage.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.e2e import test_recipe_cpu_smoke as smoke
from tests.e2e.test_recipe_cpu_smoke import _parse_steps
from tests.e2e.test_recipe_resume import ROWS, Launch, _rows, reaping_orphans
from tests.support.tmpfs import fill, small_tmpfs

reaped_children = smoke.reaped_children
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
]  # two launches of its own: slow tier (ci.md); unit: tests/unit/recipe/trainer/test_storage.py

BATCH, N, TOTAL = 4, 4, 3
TRACKER = "latest_checkpointed_iteration.txt"


class FillAfterFirstCheckpoint:
    """Fills the tmpfs once the tracker names step 1 (polled every 50 ms from a thread): step 2 then has no space."""

    def __init__(self, fs: Path, tracker: Path) -> None:
        self.fs, self.tracker = fs, tracker
        self.filler: Path | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                if self.tracker.read_text().strip() == "1":
                    self.filler = fill(self.fs)
                    return
            except OSError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.parametrize("trainer", ["v1", "legacy"])
def test_a_full_disk_at_a_checkpoint_ends_the_run_naming_the_path_and_the_relaunch_resumes(
    tmp_path, reaped_children, trainer
):
    _rows(tmp_path / "rows.jsonl")
    with small_tmpfs(tmp_path / "fs", 64) as fs:
        ckpt, dumps = fs / "ckpt", fs / "rollouts"
        common = [
            "trainer.use_v1=true" if trainer == "v1" else "trainer.use_v1=false",
            f"data.train_files={tmp_path / 'rows.jsonl'}",
            f"data.val_files={tmp_path / 'rows.jsonl'}",
            *smoke.batch_overrides(BATCH, N),
            f"trainer.total_training_steps={TOTAL}",
            "trainer.save_freq=1",
            "trainer.resume_mode=auto",
            f"trainer.default_local_dir={ckpt}",
            "trainer.logger=[console]",
        ]
        launches = [Launch(tmp_path, n, common) for n in (1, 2)]
        for launch in launches:  # the rollout dumps on the tmpfs too
            launch.cmd = [a for a in launch.cmd if not a.startswith("trainer.rollout_data_dir=")]
            launch.cmd.append(f"trainer.rollout_data_dir={dumps}")
        with reaping_orphans(launches):
            filling = FillAfterFirstCheckpoint(fs, ckpt / TRACKER)
            try:
                status1, text1, wall1 = launches[0].run()
            finally:
                filling.stop()
            assert filling.filler is not None, f"step 1 never checkpointed\n{text1[-4000:]}"
            assert status1 == 1, f"launch 1: exit {status1}\n{text1[-6000:]}"
            errors = [line for line in text1.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1, errors
            error = errors[0]
            assert "the checkpoint of step 2 could not be written" in error and str(ckpt / "global_step_2") in error
            assert f"{ckpt / 'global_step_1'} is intact" in error and "resume_mode=auto" in error, error
            assert sorted(_parse_steps(text1)) == [1], sorted(_parse_steps(text1))
            assert (ckpt / TRACKER).read_text().strip() == "1"
            assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_1"]
            dump_error = [line for line in text1.splitlines() if "rollout dump:" in line and "No space left" in line]
            assert dump_error and str(dumps / "gym" / "train") in dump_error[0], dump_error

            filling.filler.unlink()  # the space is back
            status2, text2, wall2 = launches[1].run()
            assert status2 == 0, f"launch 2: exit {status2}\n{text2[-6000:]}"
            left = reaped_children(60.0)
        assert "Resuming from" in text2 and "global_step_1" in text2, text2[-4000:]
        assert sorted(_parse_steps(text2)) == [2, 3], sorted(_parse_steps(text2))
        assert (ckpt / TRACKER).read_text().strip() == str(TOTAL)
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"
    print(
        f"\n[disk full] ({trainer}, {ROWS} rows): launch 1 ended after {wall1:.0f}s with: {error[:400]}\n"
        f"  dump: {dump_error[0][:300]}\n  launch 2 resumed from step 1 and trained steps 2-3 in {wall2:.0f}s; "
        f"processes left: {len(left)}"
    )
