"""What every NeMo Gym rollout manager of verl shares: start-up, the rollout core, the engine probe, shutdown.

verl creates a rollout manager from ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` with
``create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)``: the legacy trainer in
``RayPPOTrainer.init_workers`` (after ``LLMServerManager.create`` started the rollout replicas, e.g.
``vllm_server_{r}_{node}``), the v1 trainer in ``main_ppo.init_agent_loop_manager``. The engine is verl's own
``actor_rollout_ref.rollout.name`` (vLLM or SGLang, :mod:`recipe.nemo_gym.servers.engines`). :class:`GymManagerBase` does,
once, at creation:

1. find the replicas behind ``llm_client``: their "ip:port" from verl's load balancer, their Ray actor handles by
   verl's actor names, matched through each server's own ``get_server_address`` (:func:`~recipe.nemo_gym.servers.replicas.find_replicas`);
2. apply the engine's token-ID patch inside each server actor and check every report (:func:`~recipe.nemo_gym.servers.replicas.patch_replicas`);
   with ``nemo_gym.access.require_key`` (the default) the access guard with the run's rollout key too, and check that
   every replica refuses a request without it (:func:`~recipe.nemo_gym.servers.replicas.guard_replicas`;
   ``nemo_gym_adapter.access``: the key comes from the driver through Ray, and the vLLM plugin already put the guard
   in place before the replica answered anything);
3. read the served model name and ``max_model_len`` from the replicas (``policy.read_model_card``, with the key), the
   tokenizer's pad id and the engine probe's token ids;
4. start NeMo Gym with the replicas as its policy (:func:`~recipe.nemo_gym.config.gym_settings.gym_launch_spec`), or attach to ``nemo_gym.head_url``; the
   launcher's pid goes to ``<run_dir>/gym.pid`` so the driver can sweep Gym if this process is killed outright.
   With ``nemo_gym.ray_head: early`` (the default) Gym joins a Ray head from Gym's venv
   (:mod:`nemo_gym_adapter.gym.ray_head`) that the task runner started before verl's workers (claimed here) or, when
   there is none, that :meth:`GymManagerBase.start` starts before step 1, so it comes up during steps 1-3; Gym's
   launcher likewise runs in a warm launcher started next to that head (``nemo_gym.warm_launcher``,
   :mod:`nemo_gym_adapter.gym.warm`);
5. build the trainer-agnostic :class:`~nemo_gym_adapter.rollouts.core.RolloutCore` over the running Gym, with its
   liveness check (``nemo_gym.on_server_down``; :mod:`nemo_gym_adapter.gym.liveness`).

verl's own AgentLoopWorkers are never started: Gym is the agent. :meth:`GymManagerBase.shutdown` (idempotent, never
raises for cleanup errors) undoes what start-up did, newest first; it runs from the recipe's TaskRunner on success
and on exceptions, at interpreter exit, and Gym's launcher is also stopped on SIGTERM (``procs``).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ray
from verl.utils.ray_utils import auto_await

from nemo_gym_adapter.access.key import RunKey, rollout_key
from nemo_gym_adapter.console.startup import TIMELINE
from nemo_gym_adapter.errors import AdapterError
from nemo_gym_adapter.gym.addresses import HostChoice, ReplicaEndpoint, check_policy_urls, choose_gym_host, policy_urls
from nemo_gym_adapter.gym.liveness import Liveness
from nemo_gym_adapter.gym.ray_head import GymRayHead, claim_early_head, start_head_for, wants_head
from nemo_gym_adapter.gym.servers import PID_FILE, GymServers
from nemo_gym_adapter.gym.warm import WarmLauncher, claim_early_warm, start_warm_for, wants_warm
from nemo_gym_adapter.rollouts.core import RolloutCore, RowResult
from nemo_gym_adapter.rollouts.dump import RolloutDump
from nemo_gym_adapter.rollouts.sampling import Sampling
from nemo_gym_adapter.rollouts.validation import ValidationPass
from nemo_gym_adapter.runtime import reaper
from nemo_gym_adapter.wire.policy import effective_max_model_len, probe_logprob, read_model_card
from recipe.nemo_gym.algorithms.outcomes import rollout_dump
from recipe.nemo_gym.config.gym_settings import client_config, gym_launch_spec, liveness_config, trajectory_config
from recipe.nemo_gym.config.load import RecipeConfig, load_config
from recipe.nemo_gym.servers.engines import Engine, engine_named
from recipe.nemo_gym.servers.replicas import (
    find_replicas,
    guard_replicas,
    load_tokenizer,
    patch_replicas,
    tokenizer_ids,
)

logger = logging.getLogger(__name__)


class GymManagerBase:
    """Mixin for verl rollout managers: put it before verl's manager class, e.g.
    ``class M(GymManagerBase, AgentLoopManager)``. verl's ``__init__`` sets ``config``, ``llm_client`` and
    ``model_config``; :meth:`create` then runs :meth:`start` (the module docstring's steps)."""

    # Set by verl's manager __init__ (the class this mixin is combined with).
    config: Any
    llm_client: Any
    model_config: Any

    def __init__(
        self,
        config: Any,
        llm_client: Any,
        teacher_client: Any = None,
        reward_loop_worker_handles: list[Any] | None = None,
    ) -> None:
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)  # type: ignore[call-arg]
        if teacher_client:
            raise AdapterError("distillation (a teacher model) is not supported with NeMo Gym rollouts; disable it")
        # Validated at start-up by the recipe already; again here because the trainer may be started another way.
        self.recipe: RecipeConfig = load_config(config, check_files=False)
        self.engine: Engine = engine_named(self.recipe.rollout_name)  # verl's rollout.name: vLLM or SGLang
        self.gym: GymServers | None = None
        self.ray_head: GymRayHead | None = None  # Gym's Ray head (nemo_gym.ray_head: early), stopped at shutdown
        self.warm: WarmLauncher | None = None  # Gym's launcher, pre-imported (nemo_gym.warm_launcher)
        self.core: RolloutCore | None = None
        self.replicas: dict[str, str] = {}  # "ip:port" -> server actor name
        self.replica_endpoints: list[ReplicaEndpoint] = []  # per replica, in verl's order
        self.replica_handles: dict[str, Any] = {}  # server actor name -> Ray actor handle
        self.patch_reports: list[Any] = []  # per replica actor (the engine's PatchReport)
        self.run_key: RunKey | None = None  # the run's rollout key (nemo_gym.access.require_key), never logged
        self.guard_reports: list[Any] = []  # per replica actor (access.guard.GuardReport)
        self.gym_host: HostChoice | None = None  # where a Gym we start listens, and why
        self.served_model_name: str | None = None
        self.max_model_len: int | None = self.recipe.max_model_len
        self.pad_token_id = 0
        self.probe_ids: list[int] = []
        self.setup_seconds: dict[str, float] = {}
        self._cleanups: list[tuple[str, Callable[[], None]]] = []  # undone newest first by shutdown()
        self._closed = False
        self._validation: ValidationPass | None = None  # the validation rows since the last pop
        self._validation_lock = threading.Lock()  # the v1 manager adds from its event-loop thread
        self.dump: RolloutDump | None = None  # readable rollouts (nemo_gym.rollout_dump), when on

    @classmethod
    @auto_await
    async def create(cls, *args: Any, **kwargs: Any) -> Any:
        """What the trainer calls. Runs the blocking start-up in the caller's thread (the main thread of verl's
        TaskRunner), so the process lifecycle handlers for Gym can be installed."""
        instance = cls(*args, **kwargs)
        try:
            instance.start()
        except BaseException:
            instance.shutdown()
            raise
        return instance

    def start(self) -> None:
        """Replicas → patch → model card and tokenizer → Gym → rollout core (the module docstring's steps)."""
        t0 = time.perf_counter()
        self.run_key = rollout_key(self.recipe.gym)  # before the warm launcher: Gym's environment holds it
        self.ray_head = self._claim_ray_head()  # first: it comes up while the replicas are found and patched
        self.warm = self._claim_warm()  # next: it imports meanwhile
        self.replica_endpoints, handles = find_replicas(self.llm_client, self.engine)
        self.replica_handles = dict(handles)
        self.replicas = {ep.address: ep.actor for ep in self.replica_endpoints}
        t_found = time.perf_counter()
        if self.recipe.gym.patch_vllm:
            self.patch_reports = patch_replicas(
                handles, self.engine, self.recipe.gym.assistant_edits, self.recipe.gym.partial_rollouts
            )
        if self.run_key is not None:
            self.guard_reports = guard_replicas(handles, self.replica_endpoints, self.run_key)
        t1 = time.perf_counter()
        card = read_model_card(self.replicas, api_key=self.api_key)
        self.served_model_name = card.name
        self.max_model_len = effective_max_model_len(self.recipe.max_model_len, card.max_model_len)
        tokenizer, vocab_size = load_tokenizer(self.model_config)
        self.pad_token_id, self.probe_ids = tokenizer_ids(tokenizer, self.recipe.model_path)
        self.dump = rollout_dump(self.recipe, tokenizer)
        if self.dump is not None:
            self.on_shutdown("rollout dump", self.dump.close)  # after the rollouts in flight (registered later)
        t_card = time.perf_counter()
        self.gym = self._start_gym(card.name)
        t2 = time.perf_counter()
        routes, trajectory = (
            self.gym.routes(),
            trajectory_config(self.recipe, self.max_model_len, vocab_size, tokenizer),
        )
        trajectory.check_envs(routes.agents)
        self.core = RolloutCore(
            routes,
            trajectory,
            client_config(self.recipe.gym),
            success_threshold=self.recipe.gym.metrics.success_threshold,
            liveness=Liveness.for_gym(
                self.gym, liveness_config(self.recipe.gym), self.run_key.header if self.run_key else None
            ),
        )
        self.setup_seconds = {"find_and_patch_s": t1 - t0, "gym_start_s": t2 - t1, "total_s": time.perf_counter() - t0}
        atexit.register(self.shutdown)
        logger.info("NeMo Gym manager ready in %.1fs: replicas %s, Gym %s", t2 - t0, list(self.replicas), self.gym)
        TIMELINE.note(  # the start-up line's detail of this phase (the task runner prints the line)
            "rollout manager and Gym",
            f"replicas found {t_found - t0:.1f} s, patched {t1 - t_found:.1f} s, model card and tokenizer "
            f"{t_card - t1:.1f} s, Gym {t2 - t_card:.1f} s",
        )

    @property
    def api_key(self) -> Any:
        """What this manager's own requests to the replicas carry (the run key's ``SecretStr``), None without one."""
        return self.run_key.value if self.run_key is not None else None

    def _claim_ray_head(self) -> GymRayHead | None:
        """The Ray head Gym will join (``nemo_gym.ray_head: early``, a Gym we start): the one the task runner started
        early in this process, else a new one; stopped at shutdown, after Gym. None otherwise."""
        if not wants_head(self.recipe.gym):
            return None
        head = claim_early_head() or start_head_for(self.recipe.gym)
        self.on_shutdown("Gym's Ray head", head.stop)
        return head

    def _claim_warm(self) -> WarmLauncher | None:
        """The warm Gym launcher (``nemo_gym.warm_launcher``): the task runner's, else a new one; stopped at shutdown
        unless Gym took it over. None when Gym is attached or it is switched off."""
        if not wants_warm(self.recipe.gym):
            return None
        warm = claim_early_warm() or start_warm_for(self.recipe.gym, self.ray_head)
        if warm is not None:
            self.on_shutdown("warm Gym launcher", warm.stop)
        return warm

    def _start_gym(self, model_name: str) -> GymServers:
        gym = self.recipe.gym
        urls = [ep.url for ep in self.replica_endpoints]
        if gym.head_url is not None:
            logger.info(
                "attaching to Gym at %s (up to %.0fs); it must call +policy_base_url=[%s]",
                gym.head_url,
                gym.attach_timeout_s,
                ",".join(urls),
            )
            attached = GymServers.attach(gym.head_url, timeout=gym.attach_timeout_s)
            check_policy_urls(policy_urls(attached.global_config()), urls, gym.head_url)
            attached.on_restart.append(self._check_reattached)
            return attached
        node_ip = ray.util.get_node_ip_address()
        self.gym_host = choose_gym_host(gym.host, node_ip=node_ip, replicas=[ep.host for ep in self.replica_endpoints])
        logger.info("Gym listens on %s: %s", self.gym_host.host, self.gym_host.reason)
        spec = gym_launch_spec(gym, urls, model_name, host=self.gym_host.host, api_key=self.api_key)
        started = GymServers.start(spec, ray_head=self.ray_head, warm=self.warm)
        if spec.access_key is not None:
            logger.info("Gym's servers answer only the run's key (nemo_gym.access.guard_gym; checked at start-up)")
        self.on_shutdown("Gym", lambda: stop_gym(started))
        write_pid_file(started)
        started.on_restart.append(write_pid_file)
        started.on_restart.append(self._keep_served_replicas)
        return started

    def _keep_served_replicas(self, gym: GymServers) -> None:
        """After a restart without dead replicas (``liveness``): forget them here too, so no per-step call (engine
        probe, weight versions) waits on a lost node."""
        served = set(gym.spec.policy_base_url) if gym.spec is not None else {ep.url for ep in self.replica_endpoints}
        lost = [ep for ep in self.replica_endpoints if ep.url not in served]
        if not lost:
            return
        self.replica_endpoints = [ep for ep in self.replica_endpoints if ep.url in served]
        self.replicas = {ep.address: ep.actor for ep in self.replica_endpoints}
        self.replica_handles = {a: h for a, h in self.replica_handles.items() if a in self.replicas.values()}
        logger.warning(
            "replicas %s dropped for the rest of the run (Gym restarted without them)", [ep.address for ep in lost]
        )

    def _check_reattached(self, gym: GymServers) -> None:
        """An attached Gym that came back must still call exactly our replicas (``nemo_gym.head_url``)."""
        urls = [ep.url for ep in self.replica_endpoints]
        check_policy_urls(policy_urls(gym.global_config(refresh=True)), urls, gym.head_url)

    def dead_replicas(self) -> set[str]:
        """The servers (replicas by ``host:port``) the latest liveness check found dead; empty before one ran."""
        liveness = getattr(self.core, "liveness", None)
        return set(getattr(liveness, "last_dead", None) or ())

    def live_replica_handles(self) -> dict[str, Any]:
        """``{actor: handle}`` of the replicas the liveness check did not find dead last time (all before it ran)."""
        dead_actors = {self.replicas.get(address) for address in self.dead_replicas()}
        return {actor: h for actor, h in self.replica_handles.items() if actor not in dead_actors}

    def on_shutdown(self, what: str, cleanup: Callable[[], None]) -> None:
        """Have :meth:`shutdown` run ``cleanup`` (before everything registered earlier)."""
        self._cleanups.append((what, cleanup))

    def check_open(self) -> None:
        """Raise unless started and not shut down (a step after shutdown would talk to a stopped Gym)."""
        if self._closed or self.core is None:
            raise AdapterError(f"{type(self).__name__}: a step was requested after shutdown (or before start)")

    def sampling(self, validate: bool) -> Sampling:
        """A step's sampling settings, as verl's agent loop picks them (``rollout`` or ``rollout.val_kwargs``), with
        the trainer's response budget as every row's cap (``nemo_gym_adapter.rollouts.sampling``)."""
        settings = self.recipe.val_sampling if validate else self.recipe.sampling
        return Sampling(max_output_tokens=self.recipe.response_length, **settings.model_dump())

    def sampling_overrides(self, validate: bool) -> dict[str, Any]:
        """``responses_create_params`` overrides for a step: every sampling setting, sent with every request."""
        return self.sampling(validate).overrides()

    def add_validation_rows(self, rows: Iterable[RowResult], task_indices: Sequence[int]) -> None:
        """Collect validation rows (``task_indices[i]``: the dataset row of ``rows[i]``) into the current
        :class:`~nemo_gym_adapter.rollouts.validation.ValidationPass`; both managers call it for every validation sample."""
        with self._validation_lock:
            if self._validation is None:
                assert self.core is not None, "validation rows before start()"
                metrics = self.recipe.gym.metrics
                self._validation = ValidationPass(
                    self.core.routes, success_threshold=metrics.success_threshold, gym_aggregate=metrics.gym_aggregate
                )
            self._validation.add(rows, task_indices)

    def pop_validation_metrics(self) -> dict[str, float]:
        """The metrics of the validation rows collected since the last call (``ValidationPass.metrics``: ours per
        environment plus Gym's ``/aggregate_metrics``), and reset; ``{}`` when there were none. Both recipe trainers
        call it after verl's own ``_validate``."""
        with self._validation_lock:
            finished, self._validation = self._validation, None
        return finished.metrics() if finished is not None else {}

    def engine_probe_metrics(self) -> dict[str, float]:
        """``gym/engine/probe_logprob_mean``: the first replica's mean log-probability of :data:`policy.PROBE_TEXT`
        with the weights it serves now (``policy.probe_logprob``, the engine's own API); it moves only when a weight
        sync reached the engine. ``gym/engine/<count>_total`` (patched replicas, cumulative): what happened to
        model calls the engine aborted at a weight sync (``Engine.engine_counters``): ``interrupted_turns``,
        ``resumes``, ``resumed_turns``, ``resumed_tokens`` (kept), ``refused_turns`` (and per reason),
        ``aborted_turns`` (sent back to Gym with a 503, ``vllm.abort``, ``sglang.answer``) and ``regenerated_tokens``
        (what those 503s threw away). Each key is left out when it cannot be read (a failed read never fails a
        step)."""
        dead = self.dead_replicas()
        address = next((a for a in self.replicas if a not in dead), None)
        if address is None or self.served_model_name is None:
            return {}
        probe = probe_logprob(
            address, self.served_model_name, self.probe_ids, api=self.engine.probe_api, api_key=self.api_key
        )
        metrics = {} if probe is None else {"gym/engine/probe_logprob_mean": probe}
        if self.recipe.gym.patch_vllm and self.replica_handles:
            # Model calls the engine aborted at async weight syncs: resumed from their tokens (partial rollouts), or
            # sent back to Gym with a 503 and regenerated (cumulative, summed over the live server actors).
            counts = self.engine.engine_counters(self.live_replica_handles())
            for key, value in (counts or {}).items():
                metrics[f"gym/engine/{key}_total"] = float(value)
        return metrics

    def shutdown(self) -> None:
        """Undo start-up (rollout client closed, Gym stopped if we started it). Idempotent; never raises for
        cleanup errors."""
        if self._closed:
            return
        self._closed = True
        while self._cleanups:
            what, cleanup = self._cleanups.pop()
            try:
                cleanup()
            except Exception:  # cleanup must go on
                logger.exception("stopping the %s failed", what)


def write_pid_file(gym: GymServers) -> None:
    """``<run_dir>/gym.pid``: the launcher leads its own session, whose id finds Gym's processes even after they
    are re-parented (``recipe.nemo_gym.main.sweep_gym`` reads it), and a watchdog that sweeps it should this
    process be killed outright (``reaper.start_watchdog``; once per run dir)."""
    pids = gym.pids()
    if gym.run_dir is not None and pids:
        reaper.write_pid_record(gym.run_dir / PID_FILE, pids)
        reaper.start_watchdog(gym.run_dir)


def stop_gym(gym: GymServers) -> None:
    """Stop a Gym we started and remove its pid file."""
    gym.stop()
    if gym.run_dir is not None:
        (gym.run_dir / PID_FILE).unlink(missing_ok=True)
