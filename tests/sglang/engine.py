"""SGLang 0.5.12's server with only the model forward scripted: the scheduler process replaced, nothing else.

Test support of the SGLang cases (``tests/sglang/*_cases.py``, run in ``.cache/sglang-venv``); imports SGLang inside
its functions.

SGLang serves a chat request with three processes: the TokenizerManager (in the HTTP server's process: chat template,
tokenization, length checks, request state, logprob conversion), the Scheduler (batching and the model forward, a
subprocess) and the DetokenizerManager (incremental detokenization and stop trimming, a subprocess), talking over ZMQ
IPC sockets. verl 0.9.1's ``SGLangHttpServer.launch_server`` starts them through ``Engine._launch_subprocesses``.

Here :func:`launch_in_process` takes ``Engine._launch_subprocesses``' place: the real ``init_tokenizer_manager`` (the
function verl passes), the real ``DetokenizerManager`` on the real sockets (in a thread instead of a process) and a
:class:`ScriptedScheduler` (a thread) that answers each ``TokenizedGenerateReqInput`` with a ``BatchTokenIDOutput`` the
way the real scheduler's ``stream_output`` builds it: output ids through the stop token, per-token log-probs, the
finish reason as JSON, and the incremental-detokenization fields. So the OpenAI handler, the tokenizer manager (with
its context-length checks and abort handling) and the detokenizer (with its stop-token trim) are SGLang's own code.

What the scheduler "generates" is scripted (``ScriptedScheduler.script``): text spelled piecewise (every word in two
pieces, as a model may spell it but the template never encodes it) plus the family's terminator, cut at
``max_new_tokens``. An entry ``Hold(text)`` is held until an ``AbortReq`` arrives (``pause_generation(mode="abort")``,
what verl's ``abort_all_requests`` calls), then finished with ``FINISH_ABORT`` and the partial output, as the real
scheduler finishes a running request it was told to abort.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from tests.support.conversations import TERMINATOR, piecewise

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hold:
    """A script entry that is held (partial output ``text``) until the scheduler is told to abort."""

    text: str


@dataclass
class Call:
    """One request as the scheduler received it."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int | None
    return_logprob: bool
    skip_special_tokens: bool


def logprob_of(position: int, token_id: int) -> float:
    """The scripted log-probability of ``token_id`` at output ``position`` (distinct, checkable)."""
    return -round(0.001 * (position + 1) + 0.000001 * token_id, 9)


@dataclass
class ScriptedScheduler:
    """SGLang's scheduler as far as the tokenizer and detokenizer see it (ZMQ in, ``BatchTokenIDOutput`` out)."""

    port_args: Any
    tokenizer: Any
    family: str
    script: list[Any] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)  # the output ids of each finished request, in order
    finish_abort: bool = False  # answer every request with FINISH_ABORT (an abort racing a request)
    _held: list[tuple[Any, list[int]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="scripted-scheduler", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    @property
    def held(self) -> bool:
        """A request is running (held) in the engine."""
        return bool(self._held)

    def _run(self) -> None:
        import zmq
        from sglang.srt.utils.network import get_zmq_socket

        context = zmq.Context(1)
        recv = get_zmq_socket(context, zmq.PULL, self.port_args.scheduler_input_ipc_name, False)
        self._send = get_zmq_socket(context, zmq.PUSH, self.port_args.detokenizer_ipc_name, False)
        poller = zmq.Poller()
        poller.register(recv, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            obj = recv.recv_pyobj()
            try:
                self._handle(obj)
            except Exception:  # a broken fake must not hang the test: log, and the request times out loudly
                logger.exception("scripted scheduler failed on %s", type(obj).__name__)

    def _handle(self, obj: Any) -> None:
        from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput

        if isinstance(obj, TokenizedGenerateReqInput):
            sp = obj.sampling_params
            self.calls.append(
                Call(obj.rid, list(obj.input_ids), sp.max_new_tokens, obj.return_logprob, sp.skip_special_tokens)
            )
            entry = self.script.pop(0) if self.script else "Skinny"
            if isinstance(entry, Hold):
                self._held.append((obj, piecewise(self.tokenizer, entry.text)))
                return
            ids = entry if isinstance(entry, list) else self._spell(entry)
            if self.finish_abort:
                self._finish(obj, ids[: max(len(ids) // 2, 1)], _abort_reason())
                return
            limit = sp.max_new_tokens
            if limit is not None and len(ids) > limit:
                self._finish(obj, ids[:limit], {"type": "length", "length": limit})
            else:
                self._finish(obj, ids, {"type": "stop", "matched": ids[-1]})
        elif isinstance(obj, AbortReq):
            keep = []
            for req, ids in self._held:
                if obj.abort_all or req.rid.startswith(obj.rid or "\0"):
                    self._finish(req, ids, _abort_reason())
                else:
                    keep.append((req, ids))
            self._held = keep
        # everything else (ContinueGenerationReqInput, ...) needs no answer from a scheduler that never pauses

    def _spell(self, text: str) -> list[int]:
        tok = self.tokenizer
        return piecewise(tok, text) + [tok.convert_tokens_to_ids(TERMINATOR[self.family])]

    def _finish(self, req: Any, ids: list[int], reason: dict) -> None:
        """Send the finished request as the real scheduler's ``stream_output`` does (one output, finished)."""
        from sglang.srt.managers.io_struct import BatchTokenIDOutput

        self.outputs.append(list(ids))
        surr = max(len(req.input_ids) - 5, 0)  # INIT_INCREMENTAL_DETOKENIZATION_OFFSET
        logprob = req.return_logprob
        per_req_empty = [[]] if logprob else None
        # Prompt log-probs (native /generate with logprob_start_len >= 0, the engine probe) as the real scheduler
        # shapes them: None for the first token (scheduler_output_processor_mixin.py:720), ids from the start on.
        start = getattr(req, "logprob_start_len", -1)
        prompt_ids = list(req.input_ids[start:]) if logprob and start is not None and start >= 0 else []
        prompt_vals = [None] + [logprob_of(i, t) for i, t in enumerate(prompt_ids[1:], start=1)] if prompt_ids else []
        out = BatchTokenIDOutput(
            rids=[req.rid],
            http_worker_ipcs=[None],
            spec_verify_ct=[],
            spec_num_correct_drafts=[],
            spec_correct_drafts_histogram=[],
            time_stats=None,
            finished_reasons=[reason],
            decoded_texts=[""],
            decode_ids=[list(req.input_ids[surr:]) + list(ids)],
            read_offsets=[len(req.input_ids) - surr],
            output_ids=[list(ids)],
            skip_special_tokens=[req.sampling_params.skip_special_tokens],
            spaces_between_special_tokens=[req.sampling_params.spaces_between_special_tokens],
            no_stop_trim=[req.sampling_params.no_stop_trim],
            prompt_tokens=[len(req.input_ids)],
            reasoning_tokens=[0],
            completion_tokens=[len(ids)],
            cached_tokens=[0],
            cached_tokens_details=[None],
            input_token_logprobs_val=[prompt_vals] if logprob else None,
            input_token_logprobs_idx=[prompt_ids] if logprob else None,
            output_token_logprobs_val=[[logprob_of(i, t) for i, t in enumerate(ids)]] if logprob else None,
            output_token_logprobs_idx=[list(ids)] if logprob else None,
            input_top_logprobs_val=per_req_empty,
            input_top_logprobs_idx=per_req_empty,
            output_top_logprobs_val=[[None] * len(ids)] if logprob else None,
            output_top_logprobs_idx=[[None] * len(ids)] if logprob else None,
            input_token_ids_logprobs_val=per_req_empty,
            input_token_ids_logprobs_idx=per_req_empty,
            output_token_ids_logprobs_val=[[None] * len(ids)] if logprob else None,
            output_token_ids_logprobs_idx=[[None] * len(ids)] if logprob else None,
            output_token_entropy_val=None,
            output_hidden_states=None,
            routed_experts=None,
            indexer_topk=None,
            placeholder_tokens_idx=[None],
            placeholder_tokens_val=[None],
            retraction_counts=[0],
            dp_ranks=[0],
        )
        self._send.send_pyobj(out)


def _abort_reason() -> dict:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return FINISH_ABORT().to_json()  # what a running request aborted by pause_generation(mode="abort") finishes with


@dataclass
class Launched:
    """What :func:`launch_in_process` started (kept on the module so a test or an actor can reach the scheduler)."""

    scheduler: ScriptedScheduler
    detokenizer: Any
    tokenizer_manager: Any


LAUNCHED: list[Launched] = []


def launch_in_process(
    server_args: Any,
    init_tokenizer_manager_func: Any,
    run_scheduler_process_func: Any = None,
    run_detokenizer_process_func: Any = None,
    port_args: Any = None,
    *,
    family: str,
    max_req_input_len: int | None = None,
):
    """``Engine._launch_subprocesses`` with the scheduler scripted and the detokenizer in a thread.

    Same signature and return value as SGLang 0.5.12's (``(tokenizer_manager, template_manager, port_args,
    scheduler_init_result, subprocess_watchdog)``); bind ``family`` with ``functools.partial``.
    """
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager
    from sglang.srt.server_args import PortArgs

    server_args.check_server_args()
    port_args = port_args or PortArgs.init_new(server_args)
    detokenizer = DetokenizerManager(server_args, port_args)  # binds its PULL socket before anyone sends
    threading.Thread(target=detokenizer.event_loop, name="sglang-detokenizer", daemon=True).start()
    tokenizer_manager, template_manager = init_tokenizer_manager_func(server_args, port_args)
    scheduler = ScriptedScheduler(port_args, tokenizer_manager.tokenizer, family)
    scheduler.start()
    context_len = tokenizer_manager.context_len
    tokenizer_manager.max_req_input_len = max_req_input_len or context_len - 1
    LAUNCHED.append(Launched(scheduler, detokenizer, tokenizer_manager))
    scheduler_init_result = {"max_req_input_len": tokenizer_manager.max_req_input_len}
    return tokenizer_manager, template_manager, port_args, scheduler_init_result, None
