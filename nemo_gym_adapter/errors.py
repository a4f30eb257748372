"""The adapter's small error taxonomy.

Every error carries enough context to act on (file and line, dotted config key, server name, row index);
callers ``raise ... from e`` so the root cause stays visible.
"""

from __future__ import annotations


class AdapterError(Exception):
    """Base class of every error this package raises on purpose."""


class AdapterConfigError(AdapterError, ValueError):
    """A configuration value is missing or invalid. The message names the full dotted key."""


class DatasetError(AdapterError, ValueError):
    """A dataset row is invalid. The message names the file and line."""


class SetupError(AdapterError, RuntimeError):
    """The machine is not set up for this (missing venv, Python, model). The message says what to run."""


class ServerError(AdapterError, RuntimeError):
    """A server we started or attached to failed, did not become ready, or answered badly.

    The message names the server and includes the tail of its log when we own the process.
    """


class GymServerError(ServerError):
    """A NeMo Gym server (head, agent, resources, model proxy) failed."""


class ServerDownError(GymServerError):
    """A Gym server or vLLM replica is down and ``nemo_gym.on_server_down`` cannot go on: ``fail``, restarts ran out,
    no replica left, or an attached Gym did not come back (``gym.liveness``). The message names what was lost."""


class TokenAlignmentError(AdapterError, ValueError):
    """Token history cannot be matched exactly (edited or summarised conversation, broken contiguity).

    Never guessed around: the vLLM patch turns it into an HTTP 400, the trajectory code into a masked sample.
    """


class StorageError(AdapterError, OSError):
    """A file the run must write could not be written (a full disk). The message names the path, what the failure
    left behind (the previous checkpoint) and how to go on."""
