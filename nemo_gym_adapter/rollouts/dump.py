"""Readable rollouts: one JSON line per rollout that a person can read, written off the hot path.

Why: verl's own dump (``trainer.rollout_data_dir``) writes the padded prompt and response decoded with the special
tokens stripped, the summed score and the TransferQueue key -- no environment, no masked reason, none of Gym's
verifier fields, and a tool call whose text is all special tokens reads as nothing (NeMo Gym users report dumps of
token ids with empty content: nemo-platform #1735). This dump is built from what the rollout side already holds for
each row (:class:`~nemo_gym_adapter.rollouts.core.RowResult`: the environment, Gym's raw ``/run`` result, the
``Trajectory``), identically on both trainers and for validation.

Files: ``<dir>/train/step_000123.jsonl`` and ``<dir>/val/step_000120.jsonl`` (``step``: the trainer step the rows were
dispatched at). One line per rollout:

* ``step``, ``partition``, ``env``, ``uid`` (verl's prompt group), ``session`` (its sample), ``row_index`` (the
  dataset row), ``weight_version`` (``{min, max}`` of the policy weights it was generated with, when known);
* ``reward`` (what training used: 0 when masked), ``gym_reward`` (what Gym said), ``masked_reason`` + ``detail``,
  ``failure_kind``, ``num_turns``, ``prompt_tokens``, ``response_tokens``, ``generated_tokens``, ``truncated``,
  ``contiguous``, ``latency_s``;
* ``result``: every numeric field of Gym's result (``wire.payloads.GymRunResult.numeric_fields``), and ``reward_components``;
* ``prompt``: the first model call's prompt, decoded with special tokens kept (what the model saw, exactly);
* ``turns``: Gym's own ``response.output`` items rendered by type -- ``message`` (role + text), ``tool_call`` (name +
  arguments), ``tool_output`` (output), ``reasoning`` (summary text) -- never empty for a tool call;
* ``model_calls``: per model call the decoded tokens added to the context before it (tool outputs, template) and the
  decoded generation (special tokens kept), with token counts.

Texts longer than ``max_text_chars`` are cut (the cut says how much). :class:`RolloutDump` never blocks its caller:
:meth:`RolloutDump.add` queues the row (a bounded queue; a full queue drops the row and counts it), a daemon thread
decodes, formats and appends (each file opened and closed per batch of lines: no handle outlives a write), and
:meth:`RolloutDump.close` flushes everything queued and joins the thread. ``python -m nemo_gym_adapter.rollouts.
dump_view <dir>`` prints the worst and best rollouts of a step.

A full disk (:func:`nemo_gym_adapter.runtime.disk.full_disk`) stops the dump, not the run: the batch being appended is
truncated away (the file stays whole JSON lines), one error names the file and the free space, and every later row is
counted as not written (``gym/dump/failed_total``). Training goes on; a checkpoint on the same full disk then ends the
run with its own message (``recipe.nemo_gym.trainer.storage``). Any other write error is logged and the next batch tried.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_adapter.rollouts.core import RowResult
from nemo_gym_adapter.runtime import disk
from nemo_gym_adapter.wire.payloads import REWARD_COMPONENTS, reward_components

logger = logging.getLogger(__name__)

PARTITIONS = ("train", "val")
Decode = Callable[[Sequence[int]], str]


def step_file(root: Path, partition: str, step: int) -> Path:
    """``<root>/<partition>/step_<step, 6 digits>.jsonl``."""
    return root / partition / f"step_{int(step):06d}.jsonl"


@dataclass(frozen=True)
class DumpConfig:
    """Where and how much: ``validation`` also dumps validation rollouts; ``queue_size`` rows may wait."""

    dir: Path
    validation: bool = True
    max_text_chars: int = 4000
    queue_size: int = 4096


@dataclass(frozen=True)
class SampleContext:
    """What the trainer side knows about a row that the row itself does not."""

    step: int
    partition: str = "train"
    uid: str | None = None
    session: int | None = None
    row_index: int | None = None
    weight_version: tuple[int, int] | None = None


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (0: no limit), saying how many were left out."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}...[+{len(text) - limit} chars]"


def _content_text(content: Any) -> str:
    """A Responses-API ``content`` (a string, or parts with ``text``/``refusal``) as one string."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text") or part.get("refusal") or "") for part in content if isinstance(part, Mapping)
        )
    return ""


def render_item(item: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """One Gym ``response.output`` (or input) item as a readable turn (the module docstring's kinds)."""
    kind = item.get("type") or ("message" if "role" in item else "unknown")
    if kind == "message":
        return {"type": "message", "role": item.get("role"), "text": cut(_content_text(item.get("content")), limit)}
    if kind in ("function_call", "custom_tool_call"):
        args = item.get("arguments", item.get("input", ""))
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return {"type": "tool_call", "name": item.get("name"), "arguments": cut(args, limit)}
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output", "")
        output = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        return {"type": "tool_output", "call_id": item.get("call_id"), "output": cut(output, limit)}
    if kind == "reasoning":
        summary = " ".join(_content_text([s]) for s in item.get("summary") or [] if isinstance(s, Mapping))
        return {"type": "reasoning", "text": cut(summary or _content_text(item.get("content")), limit)}
    return {"type": str(kind), "text": cut(json.dumps(item, ensure_ascii=False, default=str), limit)}


def model_call_texts(output: Sequence[Any], decode: Decode | None, limit: int) -> tuple[str | None, list[dict]]:
    """``(decoded first prompt, [per model call: context_added, generated, token counts])`` from the token ids on
    Gym's output items; decoded text only with a ``decode`` (the tokenizer)."""
    calls = [
        item
        for item in output
        if isinstance(item, Mapping)
        and item.get("prompt_token_ids") is not None
        and item.get("generation_token_ids") is not None
    ]
    prompt_text = None
    out: list[dict[str, Any]] = []
    previous: list[int] = []
    for k, item in enumerate(calls):
        prompt, generated = list(item["prompt_token_ids"]), list(item["generation_token_ids"])
        extends = k > 0 and prompt[: len(previous)] == previous
        added = prompt[len(previous) :] if extends else prompt
        entry: dict[str, Any] = {"prompt_tokens": len(prompt), "generated_tokens": len(generated)}
        if k > 0:
            entry["extends_previous"] = extends
        if decode is not None:
            if k == 0:
                prompt_text = cut(decode(prompt), limit)
            else:
                entry["context_added"] = cut(decode(added), limit)
            entry["generated"] = cut(decode(generated), limit)
        out.append(entry)
        previous = prompt + generated
    return prompt_text, out


def rollout_record(row: RowResult, ctx: SampleContext, decode: Decode | None, limit: int) -> dict[str, Any]:
    """The dump line of one row (the module docstring's fields)."""
    t = row.trajectory
    record: dict[str, Any] = {
        "step": ctx.step,
        "partition": ctx.partition,
        "env": row.env,
        "uid": ctx.uid,
        "session": ctx.session,
        "row_index": ctx.row_index if ctx.row_index is not None else t.row_index,
        "weight_version": None
        if ctx.weight_version is None
        else {"min": ctx.weight_version[0], "max": ctx.weight_version[1]},
        "reward": float(t.reward),
        "gym_reward": t.gym_reward,
        "masked_reason": t.masked_reason.value if t.masked_reason else None,
        "detail": cut(t.detail, limit) if t.detail else "",
        "failure_kind": t.failure_kind,
        "num_turns": t.num_turns,
        "prompt_tokens": len(t.prompt_ids),
        "response_tokens": len(t.response_ids),
        "generated_tokens": t.num_generated,
        "truncated": t.truncated,
        "contiguous": not t.contiguity_failure,
        "latency_s": t.latency_s,
        "result": {k: v for k, v in t.numeric.items() if not k.startswith(f"{REWARD_COMPONENTS}/")},
        "reward_components": reward_components(t.numeric),
    }
    result = row.outcome.result
    response = result.get("response") if isinstance(result, Mapping) else None
    output = response.get("output") if isinstance(response, Mapping) else None
    output = output if isinstance(output, list) else []
    prompt_text, calls = model_call_texts(output, decode, limit)
    if prompt_text is None and isinstance(result, Mapping):  # no ids (masked before any model call): Gym's input
        params = result.get("responses_create_params")
        given = params.get("input") if isinstance(params, Mapping) else None
        if isinstance(given, str):
            prompt_text = cut(given, limit)
        elif isinstance(given, list):
            record["input"] = [render_item(i, limit) for i in given if isinstance(i, Mapping)]
    record["prompt"] = prompt_text
    record["turns"] = [render_item(item, limit) for item in output if isinstance(item, Mapping)]
    record["model_calls"] = calls
    return record


_STOP = object()


class RolloutDump:
    """The background writer (module docstring). ``decode``: token ids -> text (special tokens kept), or None for no
    decoded text. Thread-safe: :meth:`add` may be called from any thread."""

    def __init__(self, config: DumpConfig, decode: Decode | None = None) -> None:
        self.config = config
        self.decode = decode
        self.written = 0
        self.dropped = 0
        self.errors = 0  # rows the writer could not format or write
        self.skipped = 0  # rows added after a full disk stopped the dump
        self.failed: str | None = None  # why the dump stopped (a full disk), once it did
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=config.queue_size)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gym-rollout-dump", daemon=True)
        self._thread.start()

    def add(self, row: RowResult, ctx: SampleContext) -> None:
        """Queue one row for writing; never blocks (a full queue drops it, counted and warned once)."""
        if self._closed or (ctx.partition != "train" and not self.config.validation):
            return
        if self.failed is not None:
            self.skipped += 1
            return
        try:
            self._queue.put_nowait((row, ctx))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning(
                    "rollout dump: the writer is %d rows behind; rows are being dropped (counted in "
                    "gym/dump/dropped_total)",
                    self.config.queue_size,
                )

    def add_all(self, rows: Iterable[tuple[RowResult, SampleContext]]) -> None:
        for row, ctx in rows:
            self.add(row, ctx)

    def metrics(self, prefix: str = "gym") -> dict[str, float]:
        """``<prefix>/dump/{written,dropped,failed}_total`` (cumulative; failed: not written, a full disk or a write
        error)."""
        return {
            f"{prefix}/dump/written_total": float(self.written),
            f"{prefix}/dump/dropped_total": float(self.dropped),
            f"{prefix}/dump/failed_total": float(self.errors + self.skipped),
        }

    def close(self, timeout_s: float = 60.0) -> None:
        """Write everything queued, then stop the thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("rollout dump: the writer did not finish within %.0fs", timeout_s)
        logger.info(
            "rollout dump: %d rollouts written to %s (%d dropped, %d failed)",
            self.written,
            self.config.dir,
            self.dropped,
            self.errors,
        )

    def _run(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while len(batch) < 256:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lines: dict[Path, list[str]] = defaultdict(list)
            for item in batch:
                if item is _STOP:
                    stop = True
                    continue
                row, ctx = item
                try:
                    record = rollout_record(row, ctx, self.decode, self.config.max_text_chars)
                    line = json.dumps(record, ensure_ascii=False, default=_jsonable)
                except Exception:  # one bad row never stops the dump
                    self.errors += 1
                    logger.exception("rollout dump: row %s of step %s could not be formatted", row.index, ctx.step)
                    continue
                lines[step_file(self.config.dir, ctx.partition, ctx.step)].append(line)
            for path, texts in lines.items():
                if self.failed is not None:
                    self.errors += len(texts)
                    continue
                try:
                    append_whole(path, ("\n".join(texts) + "\n").encode("utf-8"))
                    self.written += len(texts)
                except OSError as e:
                    self.errors += len(texts)
                    after = disk.space(path)
                    full = disk.full_disk(e, after)
                    if full is None:
                        logger.exception("rollout dump: could not write %s", path)
                        continue
                    self.failed = f"{full} writing {path} ({after})"
                    logger.error(
                        "rollout dump: %s; the readable dump stops here, %d rollout(s) not written and every later "
                        "one counted in gym/dump/failed_total (training goes on)",
                        self.failed,
                        len(texts),
                    )


def append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` (created with its directory), or leave the file as it was: a write that fails
    halfway (a full disk) is truncated away, so the file never ends in half a JSON line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def _jsonable(value: Any) -> Any:
    """numpy scalars and anything else json cannot write."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)
