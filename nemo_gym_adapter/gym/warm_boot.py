"""The warm Gym launcher's own program (:mod:`nemo_gym_adapter.gym.warm`), run by Gym's interpreter; stdlib only.

    <Gym's python> warm_boot.py <Gym's `gym` script> <module,module,...>

1. Look like the ``gym`` script would to the modules it imports: ``sys.path[0]`` is the script's (resolved)
   directory, ``sys.argv[0]`` the script.
2. Import the listed modules (third-party ones Gym's launcher imports anyway, which read neither the working
   directory nor ``sys.argv`` at import: numpy, scipy.stats, pandas, openai, wandb, ...; ``nemo_gym`` itself is
   never among them: ``nemo_gym/__init__`` derives ``WORKING_DIR``/``CACHE_DIR``/``RESULTS_DIR``, ``sys.path`` and
   ``HF_HOME`` from the cwd, and other modules copy those constants). A module that fails to import is noted in
   the log and skipped (the launch imports it again and fails as a cold one would). If a module that must see
   the cwd-derived ``HF_HOME`` first (Hugging Face libraries) got imported along the way, exit with
   :data:`EXIT_TAINTED`: the trainer then launches cold and says why.
3. Wait for one JSON line on stdin: ``{"argv": [...], "cwd": ..., "log": ...}``. End of input (the trainer stopped
   us or died) exits 0 at once: nothing is left behind.
4. Become that launch: chdir to ``cwd``, stdout/stderr appended to ``log``, stdin from /dev/null, then run the
   ``gym`` script as ``__main__`` with ``argv`` (``runpy.run_path``). The environment is the one we were started
   with; the trainer checked it equals the launch's (``warm.env_mismatch``).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and len(sys.argv) > 1:  # before any other import: the path the gym script runs with
    sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[1]))

import importlib  # noqa: E402
import json  # noqa: E402
import runpy  # noqa: E402
import time  # noqa: E402

EXIT_TAINTED = 3  # a module that reads the cwd-derived HF_HOME at import was pre-imported: launch cold instead
READY_LINE = "warm Gym launcher: imports done"  # printed once step 2 is over (the trainer's log reader waits for it)
LAUNCH_LINE = "warm Gym launcher: launch received"  # the launch ran warm (e2e tests look for it)
CWD_SENSITIVE = ("huggingface_hub", "datasets", "transformers", "tokenizers", "nemo_gym")


def preload(modules: list[str]) -> list[str]:
    """Import ``modules``; return the ones that failed (each noted on stdout)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # the launch imports it again and fails the way a cold launch would
            print(f"warm Gym launcher: could not pre-import {name}: {e!r}", flush=True)
            failed.append(name)
    return failed


def tainted() -> list[str]:
    """Modules imported by now that must first see what ``nemo_gym/__init__`` sets from the launch's cwd."""
    return sorted(m for m in sys.modules if m.split(".")[0] in CWD_SENSITIVE)


def become_launch(message: dict[str, object]) -> None:
    """Step 4 (module docstring): the process from here on is Gym's launcher."""
    argv = [str(a) for a in message["argv"]]  # type: ignore[attr-defined]
    os.chdir(str(message["cwd"]))
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(str(message["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")  # the script calls sys.exit(main())


def main() -> int:
    script, modules = sys.argv[1], [m for m in sys.argv[2].split(",") if m] if len(sys.argv) > 2 else []
    sys.argv = [script]  # sys.path[0] was set at the top, as Python sets it when it runs the script itself
    t0 = time.monotonic()
    failed = preload(modules)
    bad = tainted()
    if bad:
        print(f"warm Gym launcher: pre-imports pulled in {bad}, which must be imported after nemo_gym", flush=True)
        return EXIT_TAINTED
    done = f"{len(modules) - len(failed)} modules in {time.monotonic() - t0:.2f}s"
    print(f"{READY_LINE} at t={time.time():.3f} ({done})", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        print("warm Gym launcher: no launch came (stopped); exiting", flush=True)
        return 0
    message = json.loads(line)
    print(f"{LAUNCH_LINE}: cwd {message['cwd']}, output to {message['log']}", flush=True)  # here, not in Gym's log
    become_launch(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
