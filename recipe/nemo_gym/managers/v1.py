"""``NemoGymAgentLoopManagerTQ``: verl 0.9.1's v1 (TransferQueue) rollout manager, with NeMo Gym doing the rollouts.

Selected with ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=recipe.nemo_gym.managers.v1.
NemoGymAgentLoopManagerTQ`` (the shipped configs pick it from ``trainer.use_v1``) and created by verl's v1 task runner
exactly like verl's own ``AgentLoopManagerTQ``::

    TaskRunnerV1.init_agent_loop_manager                                   (verl/trainer/main_ppo.py)
      -> NemoGymAgentLoopManagerTQ.create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)

Start-up and shutdown are :class:`~recipe.nemo_gym.managers.base.GymManagerBase`'s. The v1 contract
(``verl/trainer/ppo/v1/agent_loop_tq.py`` ``AgentLoopWorkerTQ``) is:

* ``generate_sequences(TensorDict) -> None`` returns at once: the batch's prompts run in the background, on this
  manager's event-loop thread, through the shared :class:`~nemo_gym_adapter.rollouts.core.RolloutCore` (each prompt's
  ``gym_row`` ``n`` times: ``__rollout_n__`` or ``rollout.n`` / ``val_kwargs.n``).
* Each prompt ``uid`` is tagged ``running``; **each sample is put into TransferQueue the moment Gym returns it**
  (``RolloutCore.run_step``'s ``on_row``): key ``{uid}_{session}_0``, the unpadded tensors of
  :func:`nemo_gym_adapter.rollouts.samples.sample_tensors` (from the same ``Trajectory`` the legacy path pads) plus the
  prompt's own columns, as verl's ``_agent_loop_postprocess`` writes them; tags ``status``, ``prompt_len``,
  ``response_len``, ``seq_len``, ``global_steps``, ``min_global_steps``/``max_global_steps``. A rollout split into
  segments (``nemo_gym.trajectory.contiguity: split``) is put as ``{uid}_{session}_{i}``, one key per segment, as
  verl's own agent loops put several outputs of one session; the session stays one member of its GRPO group
  (``recipe.nemo_gym.algorithms.masked_grpo``: masked GRPO over sessions). Validation puts one sample per rollout (its first
  segment), so verl's validation means stay per rollout.
* The uid's terminal status is published once all its ``n`` samples settled: ``finished``; ``failure`` only when
  this adapter itself failed (a put raised, a bug), as verl does when an agent loop raises.

**Masked rollouts** (Gym or the client failed, the history broke, too long; ``trajectory.MaskReason``) are put like
any other sample, as a one-pad-token response with ``response_mask`` 0 and reward 0 (what ``padding`` makes of them),
and their group is ``finished``. Why not drop them and mark the group ``failure``: in sync mode verl's replay buffer
keeps a ``failure`` group sampleable and raises once a batch has no trajectory at all (every sample masked: a
config error such as prompts longer than ``data.max_prompt_length`` would end the run), and in async modes it evicts
and refills ``failure`` groups, which never ends when every prompt fails. Put as masked samples they give exactly
zero gradient, ``masked_grpo`` leaves them out of their group's baseline (identified by ``response_mask.sum() == 0``),
every input row still yields an output row, they are counted by reason in ``gym/all/masked_rate/<reason>``, and no
mode can stall on them. A masked *training* sample is put when its group settles, carrying the group's
``reward_extra_info`` fill instead of its own (``recipe.nemo_gym.algorithms.outcomes``): verl's group filter
(``algorithm.filter_groups``) then decides on the valid samples' Gym outcomes only; every training sample carries
``gym_outcome`` and its reward components there. Each group's verdict is counted (``gym/<env>/groups/...``), and with
``nemo_gym.rollout_dump`` every rollout is also written as a readable JSON line (``rollouts.dump``).

**Weight versions** (``min_global_steps``/``max_global_steps``; verl stamps them in its own LLM client, which Gym
bypasses): the ``global_steps`` the vLLM servers hold (verl's ``ServerAdapter.update_weights`` sets it after every
weight sync) when the batch is dispatched and when the sample comes back (read afresh in the async trainer modes).
They bracket every token's weights, a turn resumed across a sync included (partial rollouts, ``vllm.resume``: its
segments' versions lie between the two).

**Metrics**: the rollouts finished since the last call of :meth:`drain_metrics` (the recipe's v1 trainer calls it
once per step and puts the result into the step's metric dict under their own names: ``gym/<env>/reward_mean``,
``gym/all/masked_rate/<reason>``, ``gym/timing/*``, ``gym/engine/probe_logprob_mean``; the last validation pass's
timings as ``val-aux/gym/timing/*``). **Validation** samples (partition ``val``, ``rollout.val_kwargs`` sampling and
``n``) are also collected, as the legacy manager's, into ``GymManagerBase``'s
:class:`~nemo_gym_adapter.rollouts.validation.ValidationPass` before their group is published ``finished``; the recipe's v1
trainer takes its per-environment metrics and Gym's ``/aggregate_metrics`` after verl's ``_validate``
(``task_runner_v1.NemoGymTrainerMixin._validate``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from nemo_gym_adapter.errors import AdapterError, ServerDownError
from nemo_gym_adapter.rollouts.core import RowResult, resends
from nemo_gym_adapter.rollouts.dump import SampleContext
from nemo_gym_adapter.rollouts.groups import masked_fill
from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.trajectory import Trajectory
from nemo_gym_adapter.runtime.loop_thread import LoopThread
from recipe.nemo_gym.algorithms.outcomes import GroupLedger, sample_extras
from recipe.nemo_gym.managers.base import GymManagerBase
from recipe.nemo_gym.managers.tq_records import sample_record, split_prompts, task_index
from recipe.nemo_gym.servers.replicas import weight_versions, weight_versions_async

logger = logging.getLogger(__name__)

VERSION_CACHE_S = 0.25  # how long a read of the servers' weight version is reused


@dataclass
class RolloutWindow:
    """The rollouts finished since the last drain (one per partition), for the step's metrics."""

    trajectories: list[Trajectory | tuple[Trajectory, ...]] = field(default_factory=list)  # one per rollout
    first_dispatch: float | None = None
    last_done: float | None = None
    build_s: float = 0.0  # summed: building each sample's record (event-loop time, never overlapping)
    put_s: float = 0.0  # summed latency of the TransferQueue puts (they overlap: not wall time)
    dispatch_s: float = 0.0  # generate_sequences itself (the trainer's thread)
    resends: int = 0  # the rollouts' re-sends after connection errors (core.resends)

    def metrics(self, prefix: str, success_threshold: float | None, *, rollouts: bool = True) -> dict[str, float]:
        """Timings, and with ``rollouts`` the rollouts' own metrics (``metrics.compute_metrics``)."""
        out = compute_metrics(self.trajectories, prefix=prefix, success_threshold=success_threshold) if rollouts else {}
        if self.trajectories and self.first_dispatch is not None and self.last_done is not None:
            span = max(self.last_done - self.first_dispatch, 1e-9)
            out[f"{prefix}/timing/rollout_s"] = span
            out[f"{prefix}/timing/rollouts_per_s"] = len(self.trajectories) / span
            out[f"{prefix}/timing/build_s"] = self.build_s
            out[f"{prefix}/timing/tq_put_s"] = self.put_s
            out[f"{prefix}/timing/tq_put_mean_s"] = self.put_s / len(self.trajectories)
            out[f"{prefix}/timing/dispatch_s"] = self.dispatch_s
        return out


@dataclass
class GroupState:
    """One prompt of a batch while its samples come back: how many are still out, the trajectories back so far, and
    the masked training samples held until the group settles (they carry the group's fill, ``outcomes``)."""

    remaining: int
    members: list[Trajectory] = field(default_factory=list)
    held: list[tuple[int, int, Trajectory, tuple[int, int]]] = field(default_factory=list)  # (session, k, t, versions)


class NemoGymAgentLoopManagerTQ(GymManagerBase, AgentLoopManagerTQ):
    """verl v1 rollout manager whose rollouts are NeMo Gym ``/run`` calls (see the module docstring)."""

    # Async trainer modes sync weights while rollouts run: a sample's newest weight version is read after it came
    # back (never a cached read from before a sync whose resumed turns it carries). Set from the trainer mode.
    _fresh_versions = False

    def start(self) -> None:
        super().start()
        self._loop = LoopThread("gym-rollout-tq")
        core = self.core
        assert core is not None  # start() built it
        self.on_shutdown("rollout loop", lambda: self._loop.close(core.aclose()))
        self.on_shutdown("rollouts in flight", self._cancel_inflight)
        self._inflight: set[concurrent.futures.Future[None]] = set()
        self._lock = threading.Lock()
        self._windows = {"train": RolloutWindow(), "val": RolloutWindow()}
        self._probe: dict[str, float] = {}
        self._version: tuple[float, tuple[int, int]] | None = None
        self._fresh_versions = OmegaConf.select(self.config, "trainer.v1.trainer_mode", default="sync") != "sync"
        self._groups = GroupLedger()
        # A batch that ended with ServerDownError (every replica or the attached Gym lost): raised at the next
        # dispatch and by the trainer's replay buffer (task_runner_v1), so the run ends with its message.
        self.fatal: ServerDownError | None = None

    # ---- verl's v1 contract -------------------------------------------------------------------------------------

    def generate_sequences(self, prompts: TensorDict) -> None:
        """Dispatch the batch's Gym rollouts and return at once (samples reach TransferQueue as they finish)."""
        self.check_open()
        if self.fatal is not None:
            raise self.fatal
        t0 = time.perf_counter()
        validate = bool(prompts["validate"]) if "validate" in prompts.keys() else False
        rows = split_prompts(prompts)
        if not rows:
            raise AdapterError("generate_sequences: empty batch")
        partition = "val" if validate else "train"
        if not validate and not self._probe:  # once per metrics window: the weights served for its first batch
            self._probe = self.engine_probe_metrics()
        version = self._read_versions()
        future = self._loop.submit(self._run_batch(rows, partition, version[0]))
        with self._lock:
            self._inflight.add(future)
            window = self._windows[partition]
            window.first_dispatch = window.first_dispatch or t0
            window.dispatch_s += time.perf_counter() - t0
        future.add_done_callback(self._batch_done)

    def drain_metrics(self) -> dict[str, float]:
        """Metrics of the rollouts finished since the last call (module docstring), and reset them."""
        threshold = self.recipe.gym.metrics.success_threshold
        with self._lock:
            windows, self._windows = self._windows, {"train": RolloutWindow(), "val": RolloutWindow()}
            probe, self._probe = self._probe, {}
            inflight = len(self._inflight)
        prefix = self.core.metrics_prefix if self.core is not None else "gym"
        out = windows["train"].metrics(prefix, threshold)
        out.update(windows["val"].metrics(f"val-aux/{prefix}", threshold, rollouts=False))
        total = self.core.client.resends if self.core is not None else 0  # re-sends after connection errors
        out[f"{prefix}/client/resends"] = float(windows["train"].resends)
        out[f"{prefix}/client/resends_total"] = float(total)
        out.update(probe)
        out.update(self._groups.drain(prefix))
        if self.dump is not None:
            out.update(self.dump.metrics(prefix))
        out[f"{prefix}/v1/batches_in_flight"] = float(inflight)
        return out

    # ---- the background work ------------------------------------------------------------------------------------

    async def _run_batch(self, prompts: list[dict[str, Any]], partition: str, dispatched_version: int) -> None:
        validate = partition == "val"
        with self._lock:
            window = self._windows[partition]
            window.first_dispatch = window.first_dispatch or time.perf_counter()
        default_n = int(self.config.actor_rollout_ref.rollout.val_kwargs.n) if validate else self.recipe.n
        groups: list[tuple[dict[str, Any], int, bool]] = []
        for prompt in prompts:
            n = int(prompt.pop("__rollout_n__", default_n))
            do_sample = bool(prompt.pop("__do_sample__", True))
            groups.append((prompt, n, do_sample or validate))
        settling = [GroupState(n) for _, n, _ in groups]
        published: set[int] = set()

        async def publish(i: int, status: str) -> None:
            if i not in published:
                published.add(i)
                await tq.async_kv_put(key=groups[i][0]["uid"], partition_id=partition, tag={"status": status})

        try:
            await asyncio.gather(
                *(
                    tq.async_kv_put(key=p["uid"], partition_id=partition, tag={"status": "running"})
                    for p, _, _ in groups
                )
            )
            for i, (_, n, _) in enumerate(groups):
                if n == 0:
                    await publish(i, "finished")
            runs = []
            for sampled in (True, False):
                slots = [(i, s) for i, (_, n, d) in enumerate(groups) if d is sampled for s in range(n)]
                if slots:
                    runs.append(self._run_slots(groups, slots, partition, dispatched_version, settling, publish))
            await asyncio.gather(*runs)
        except Exception:  # not on cancellation (shutdown): nothing may wait on TransferQueue then
            for i in range(len(groups)):
                try:
                    await publish(i, "failure")
                except Exception:
                    logger.exception("could not publish failure for prompt %s", groups[i][0]["uid"])
            raise

    async def _run_slots(
        self,
        groups: list[tuple[dict[str, Any], int, bool]],
        slots: list[tuple[int, int]],
        partition: str,
        dispatched_version: int,
        settling: list[GroupState],
        publish: Any,
    ) -> None:
        """Run the (prompt, session) ``slots`` sharing one sampling mode through the core, putting each sample."""
        assert self.core is not None
        validate = partition == "val"
        sampling = self.sampling(validate)
        if not groups[slots[0][0]][2]:  # __do_sample__ = False: greedy, as verl's apply_greedy_sampling_params
            sampling = sampling.greedy()

        async def put(
            prompt: dict[str, Any], items: list[tuple[int, int, Trajectory, tuple[int, int]]], fill: Any
        ) -> None:
            """Put samples ``(session, output index, trajectory, versions)``; training samples carry their
            ``reward_extra_info`` (a masked one its group's ``fill``)."""
            t0 = time.perf_counter()
            records = [
                sample_record(
                    prompt,
                    session,
                    t,
                    pad_token_id=self.pad_token_id,
                    versions=versions,
                    output_index=k,
                    reward_extra_info=None if validate else sample_extras(t, fill),
                )
                for session, k, t, versions in items
            ]
            keys, fields, tags = (list(column) for column in zip(*records, strict=True))
            record = list_of_dict_to_tensordict(fields)
            t1 = time.perf_counter()
            await tq.async_kv_batch_put(keys=keys, fields=record, tags=tags, partition_id=partition)
            now = time.perf_counter()
            with self._lock:
                window = self._windows[partition]
                window.build_s += t1 - t0
                window.put_s += now - t1
                window.last_done = now

        async def on_row(row: RowResult) -> None:
            i, session = slots[row.index]
            prompt, state = groups[i][0], settling[i]
            latest = await self._read_versions_async(fresh=self._fresh_versions)
            versions = (dispatched_version, max(latest[1], dispatched_version))
            # A split rollout (contiguity: split, training only) is several samples, each with the rollout's outcome.
            samples = (row.trajectory,) if validate else row.samples
            state.members.extend(samples)
            if self.dump is not None:
                step = int(prompt.get("global_steps") or 0)
                where = SampleContext(step, partition, str(prompt["uid"]), session, task_index(prompt, i), versions)
                self.dump.add(row, where)
            ready = [(session, k, t, versions) for k, t in enumerate(samples) if validate or not t.masked]
            if ready:
                await put(prompt, ready, None)
            # masked ones held until the group settles: verl's group filter must see its valid samples' outcome
            state.held.extend((session, k, t, versions) for k, t in enumerate(samples) if not validate and t.masked)
            with self._lock:
                self._windows[partition].trajectories.append(row.segments or row.trajectory)
                self._windows[partition].resends += resends([row.outcome])
            if validate:  # before the group is published finished, so verl's _validate returns after it
                self.add_validation_rows([row], [task_index(prompt, i)])
            state.remaining -= 1
            if state.remaining == 0:
                if state.held:  # the filter's metric and GDPO's keys present, whatever the valid members carry
                    keys = [m for m in (self.recipe.filter_groups_metric,) if m] + list(
                        self.recipe.required_reward_components
                    )
                    await put(prompt, state.held, masked_fill(state.members, keys))
                if not validate:
                    self._groups.add(str(prompt["gym_env"]), state.members)
                await publish(i, "finished")

        rows = [groups[i][0]["gym_row"] for i, _ in slots]
        envs = [str(groups[i][0]["gym_env"]) for i, _ in slots]
        desc = "Gym validation rollouts" if validate else "Gym rollouts"
        await self.core.run_step(rows, envs, sampling.overrides(), on_row=on_row, desc=desc)

    def _batch_done(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._inflight.discard(future)
        error = None if future.cancelled() else future.exception()
        if error is not None:
            logger.error("a Gym rollout batch failed (its groups are marked failure)", exc_info=error)
            if isinstance(error, ServerDownError):  # nothing left to roll out on: the run's end
                self.fatal = error

    def _cancel_inflight(self) -> None:
        with self._lock:
            inflight = list(self._inflight)
        for future in inflight:
            future.cancel()

    # ---- weight versions ----------------------------------------------------------------------------------------

    def _read_versions(self) -> tuple[int, int]:
        """(min, max) ``global_steps`` over the replicas now (0 before the first sync)."""
        return self._remember(weight_versions(self.live_replica_handles()))

    async def _read_versions_async(self, fresh: bool = False) -> tuple[int, int]:
        """Like :meth:`_read_versions`, reusing a read younger than ``VERSION_CACHE_S`` unless ``fresh``."""
        cached = self._version
        if not fresh and cached is not None and time.monotonic() - cached[0] < VERSION_CACHE_S:
            return cached[1]
        return self._remember(await weight_versions_async(self.live_replica_handles()))

    def _remember(self, values: list[int | None]) -> tuple[int, int]:
        known = [int(v) for v in values if v is not None] or [0]
        versions = (min(known), max(known))
        self._version = (time.monotonic(), versions)
        return versions
