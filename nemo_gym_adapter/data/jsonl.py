"""Reading Gym JSONL files line by line as editors and tools write them.

Accepted like plain UTF-8/LF files: a UTF-8 byte-order mark, CRLF line ends, blank or whitespace-only lines, and a
last line without a newline. Line numbers count every ``\\n``-terminated line, so ``file:line`` in an error is the
line an editor shows. Refused with a message naming the encoding: UTF-16/32 files (Windows "Unicode").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import DatasetError

_UTF8_BOM = b"\xef\xbb\xbf"
# Byte-order marks of encodings Gym JSONL cannot be in (longest first: UTF-32 LE starts like UTF-16 LE).
_FOREIGN_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32 LE"),
    (b"\x00\x00\xfe\xff", "UTF-32 BE"),
    (b"\xff\xfe", "UTF-16 LE"),
    (b"\xfe\xff", "UTF-16 BE"),
)


def read_lines(path: str, hasher: Any = None) -> Iterator[tuple[int, str | DatasetError, int]]:
    """``(line number, stripped text, whitespace characters stripped at the start)`` of every non-blank line.

    Lines are split at ``\\n`` only (so CRLF files count lines like LF files, and a U+2028 inside a JSON string
    splits nothing); a UTF-8 byte-order mark is dropped wherever a line starts with one (``cat`` of files saved by
    Windows editors keeps each file's mark); surrounding whitespace (``\\r`` included) is dropped. A line that is not
    UTF-8 yields a :class:`DatasetError` in place of its text and reading goes on. ``hasher`` is fed every byte.

    Raises:
        DatasetError: the file is missing, or is UTF-16/32 (named by its byte-order mark).
    """
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{path}: dataset file not found" + (" (it is a directory)" if p.is_dir() else ""))
    with p.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if hasher is not None:
                hasher.update(raw)
            if number == 1:
                for foreign, encoding in _FOREIGN_BOMS:
                    if raw.startswith(foreign):
                        raise DatasetError(
                            f"{path}:1: the file is {encoding} (byte-order mark {foreign.hex(' ')}); Gym JSONL must be "
                            "UTF-8: re-save it as UTF-8"
                        )
            bom = 1 if raw.startswith(_UTF8_BOM) else 0
            try:
                text = raw[3 * bom :].decode("utf-8")
            except UnicodeDecodeError as e:
                yield number, DatasetError(f"{path}:{number}: not UTF-8 ({e.reason} at byte {e.start + 3 * bom})"), 0
                continue
            stripped = text.strip()
            if stripped:
                yield number, stripped, len(text) - len(text.lstrip())  # an editor shows no BOM: not a column


def json_error_message(e: json.JSONDecodeError, text: str, lead: int) -> str:
    """``invalid JSON: <reason> (column N)`` with N counted in the line as written (``lead``: characters stripped)."""
    hint = ""
    if e.msg == "Extra data" and "\r" in text:
        hint = "; the line holds a bare carriage return: CR-only (classic Mac) line ends? Use LF or CRLF"
    return f"invalid JSON: {e.msg} (column {e.colno + lead}){hint}"


def read_objects(path: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(line number, stripped text, object)`` of every non-blank line, each a JSON object.

    Raises:
        DatasetError: at the first line that is not UTF-8, not JSON or not an object, naming ``file:line``.
    """
    for number, text, lead in read_lines(path):
        if isinstance(text, DatasetError):
            raise text
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{number}: {json_error_message(e, text, lead)}") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}:{number}: a JSON object expected, got {type(obj).__name__}")
        yield number, text, obj
