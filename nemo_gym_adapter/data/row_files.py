"""What the repo's row generators (``scripts/make_*_rows.py``) share: a train/validation split's command line and
the JSONL writer, so every committed row file is written the same way (one JSON object per line, UTF-8, no ASCII
escapes) and its test can regenerate it byte for byte."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from nemo_gym_adapter.runtime import paths


def write_jsonl(rows: Iterable[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def split_parser(doc: str | None, train: int = 256, val: int = 32, seed: int = 2025) -> argparse.ArgumentParser:
    """``--out`` (default ``configs/data``), ``--train``, ``--val``, ``--seed``; the description is ``doc``'s first
    paragraph."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=paths.REPO_ROOT / "configs" / "data")
    p.add_argument("--train", type=int, default=train)
    p.add_argument("--val", type=int, default=val)
    p.add_argument("--seed", type=int, default=seed)
    return p
