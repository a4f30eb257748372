"""tests/support/sigterm.py: a pytest session sent SIGTERM tears its fixtures down (what they started is stopped).

A real pytest in a subprocess runs one test whose fixture starts a child process and stops it at teardown; the
session gets SIGTERM while the test runs. With the plugin the child is gone and pytest says it was interrupted; the
control, without it, shows why it exists: pytest dies at once and the child is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]

INNER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path

    import pytest

    @pytest.fixture
    def child():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(os.environ["CHILD_PID_FILE"]).write_text(str(proc.pid))
        yield proc
        proc.terminate()
        proc.wait()

    def test_runs_until_stopped(child):
        time.sleep(600)
    """
)


def _wait_for(path: Path, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"the inner test never started its child ({path})"
        time.sleep(0.05)
    return int(path.read_text())


@pytest.mark.parametrize("plugin", [True, False], ids=["plugin", "control-without"])
def test_sigterm_to_the_session_runs_fixture_teardown(tmp_path, plugin):
    (tmp_path / "test_inner.py").write_text(INNER)
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CHILD_PID_FILE": str(pid_file)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"]
    if plugin:
        cmd[3:3] = ["-p", "tests.support.sigterm"]
    session = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    child = None
    try:
        child = psutil.Process(_wait_for(pid_file))
        time.sleep(0.3)  # the test body is sleeping now
        session.send_signal(signal.SIGTERM)
        out, _ = session.communicate(timeout=30)
        if plugin:
            assert session.returncode == 2, (session.returncode, out)  # pytest's "interrupted"
            assert "KeyboardInterrupt" in out and "SIGTERM" in out, out
            assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, "the fixture's child survived"
        else:
            assert session.returncode == -signal.SIGTERM, (session.returncode, out)
            assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE  # left behind: the reason for it
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        if child is not None and child.is_running():
            child.kill()
