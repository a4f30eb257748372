"""``NemoGymAgentLoopManager``: verl 0.9.1's rollout manager, with NeMo Gym doing the rollouts.

Selected with ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=recipe.nemo_gym.agent_loop.
NemoGymAgentLoopManager`` and created by the legacy trainer (``trainer.use_v1=False``) exactly like verl's own::

    RayPPOTrainer.init_workers
      -> LLMServerManager.create(config, worker_group=actor_rollout_wg)   # vLLM replicas: vllm_server_{r}_{node}
      -> NemoGymAgentLoopManager.create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)

At creation (once): find the replicas behind ``llm_client`` (their "ip:port" from verl's load balancer, their actor
handles by verl's actor names, matched through the server's own ``get_server_address``), apply the token-ID patch
inside each server actor (``vllm_patch.apply_patch_to_actors``), read the served model name and ``max_model_len``
from ``/v1/models``, start NeMo Gym with those replicas as its policy (or attach to ``nemo_gym.head_url``) and build
the rollout client. verl's own AgentLoopWorkers are never started: Gym is the agent.

Each step, ``generate_sequences(DataProto) -> DataProto`` sends every row's ``gym_row`` (sampling parameters from
``rollout`` / ``rollout.val_kwargs``, max output tokens = ``rollout.response_length``; rows are never mutated) to
Gym's ``/run``, turns the results into verl's legacy padded batch (``trajectory.postprocess``: ``rm_scores`` on the
last valid token, so verl's reward manager is skipped; masked rows have an all-zero ``response_mask``) and returns
one output row per input row. Metrics ride in ``meta_info["timing"]``: the legacy trainer logs that dict (as
``timing_s/<key>``) and nothing else from a rollout manager, so ``gym/<env>/reward_mean``, ``gym/all/masked_rate/
<reason>``, ``gym/all/contiguity_rate``, ... appear as ``timing_s/gym/...`` in the trainer's metrics.

Shutdown (:meth:`shutdown`: client closed, Gym stopped if we started it) is idempotent; it runs from the recipe's
TaskRunner on success and on exceptions, at interpreter exit, and Gym's launcher is also stopped on SIGTERM
(``procs``). The launcher's pid is written to ``<run_dir>/gym.pid`` so the driver can sweep it if this process is
killed outright.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
from verl.experimental.agent_loop import AgentLoopManager
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await

from nemo_gym_adapter.config import RecipeConfig, load_config
from nemo_gym_adapter.errors import AdapterError, ServerError

logger = logging.getLogger(__name__)

PID_FILE = "gym.pid"
PROBE_TEXT = "The weather in Paris is sunny and the city is quiet today."


class NemoGymAgentLoopManager(AgentLoopManager):
    """verl ``AgentLoopManager`` whose rollouts are NeMo Gym ``/run`` calls (see the module docstring)."""

    def __init__(
        self,
        config: Any,
        llm_client: Any,
        teacher_client: Any = None,
        reward_loop_worker_handles: list[Any] | None = None,
    ) -> None:
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
        if teacher_client:
            raise AdapterError("distillation (a teacher model) is not supported with NeMo Gym rollouts; disable it")
        # Validated at start-up by the recipe already; again here because the trainer may be started another way.
        self.recipe: RecipeConfig = load_config(config, check_files=False)
        self.gym: Any = None
        self.client: Any = None
        self.replicas: dict[str, str] = {}  # "ip:port" -> server actor name
        self.served_model_name: str | None = None
        self.max_model_len: int | None = self.recipe.max_model_len
        self.pad_token_id: int = 0
        self.setup_seconds: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self._closed = False

    @classmethod
    @auto_await
    async def create(cls, *args: Any, **kwargs: Any) -> NemoGymAgentLoopManager:
        """What the trainer calls. Runs the blocking start-up in the caller's thread (the main thread of verl's
        TaskRunner), so the process lifecycle handlers for Gym can be installed."""
        instance = cls(*args, **kwargs)
        try:
            instance._start()
        except BaseException:
            instance.shutdown()
            raise
        return instance

    # ------------------------------------------------------------------------------------------ start-up

    def _start(self) -> None:
        t0 = time.perf_counter()
        handles = self._find_replicas()
        if self.recipe.gym.patch_vllm:
            self._patch(handles)
        t1 = time.perf_counter()
        self._read_model_card()
        self._load_tokenizer()
        self._start_gym()
        t2 = time.perf_counter()
        self._build_client()
        self.setup_seconds = {"find_and_patch_s": t1 - t0, "gym_start_s": t2 - t1, "total_s": time.perf_counter() - t0}
        atexit.register(self.shutdown)
        logger.info("NeMo Gym manager ready in %.1fs: replicas %s, Gym %s", t2 - t0, list(self.replicas), self.gym)

    def _find_replicas(self) -> dict[str, Any]:
        """``{actor name: handle}`` of the rollout servers, and ``self.replicas`` = {"ip:port": actor name}.

        Addresses come from verl's load balancer (what the trainer's own agent loop routes to). ``LLMServerClient``
        keeps its balancer handle private, so without one we fall back to the actors' own addresses. Handles are
        found by verl's actor names (``vllm_server_{replica}_{node}``, how verl's ServerAdapter finds them too).
        """
        from nemo_gym_adapter.vllm_patch import find_vllm_server_actors

        balancer = getattr(self.llm_client, "_load_balancer", None)
        wanted = list(ray.get(balancer.get_all_servers.remote(), timeout=60)) if balancer is not None else None
        actors = find_vllm_server_actors()
        if not actors:
            raise ServerError("no vLLM server actors (vllm_server_*) in this Ray namespace: were the replicas started?")
        by_address: dict[str, str] = {}
        for name, handle in actors.items():
            try:
                host, port = ray.get(handle.get_server_address.remote(), timeout=60)
            except Exception as e:  # a non-zero node rank of a multi-node replica serves no HTTP
                logger.info("server actor %s has no HTTP address (%s); not a replica entry point", name, e)
                continue
            by_address[f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"] = name
        addresses = wanted if wanted is not None else sorted(by_address)
        unknown = [a for a in addresses if a not in by_address]
        if unknown or not addresses:
            raise ServerError(
                f"verl's load balancer lists replicas {addresses} but the server actors serve {by_address}: "
                f"no actor for {unknown or 'any replica'}"
            )
        self.replicas = {a: by_address[a] for a in addresses}
        return {name: actors[name] for name in self.replicas.values()}

    def _patch(self, handles: Mapping[str, Any]) -> None:
        from nemo_gym_adapter.vllm_patch import apply_patch_to_actors

        # Raises ServerError naming the failing actor.
        reports = apply_patch_to_actors(handles, assistant_edits=self.recipe.gym.assistant_edits)
        if len(reports) != len(handles):
            raise ServerError(f"token-ID patch: {len(reports)} reports for {len(handles)} actors {list(handles)}")
        for name, report in zip(handles, reports, strict=True):
            if not report.hook:
                raise ServerError(f"token-ID patch: actor {name} reported no hook ({report})")
            logger.info(
                "token-ID patch in %s (pid %d): %s, vLLM %s", name, report.pid, report.hook, report.vllm_version
            )

    def _read_model_card(self) -> None:
        """Served model name (verl serves the local model path) and the context length vLLM actually uses."""
        names, lengths = set(), set()
        for address in self.replicas:
            url = f"http://{address}/v1/models"
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    card = json.load(response)["data"][0]
            except (OSError, ValueError, KeyError, IndexError) as e:
                raise ServerError(f"vLLM replica {address} ({self.replicas[address]}): GET {url} failed: {e}") from e
            names.add(card["id"])
            lengths.add(card.get("max_model_len"))
        if len(names) != 1:
            raise ServerError(f"vLLM replicas serve different models: {sorted(names)}")
        self.served_model_name = names.pop()
        server_len = min((n for n in lengths if n), default=None)
        if self.recipe.max_model_len is not None and server_len is not None:
            self.max_model_len = min(self.recipe.max_model_len, server_len)
        else:
            self.max_model_len = self.recipe.max_model_len or server_len

    def _load_tokenizer(self) -> None:
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        tokenizer = omega_conf_to_dataclass(self.model_config, dataclass_type=HFModelConfig).tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise AdapterError(f"actor_rollout_ref.model.path={self.recipe.model_path}: tokenizer has no pad/eos token")
        self.pad_token_id = int(pad)
        # A fixed prompt whose log-probability the engine reports every step (see _engine_probe).
        self._probe_ids = [int(t) for t in tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]

    def _start_gym(self) -> None:
        from nemo_gym_adapter.gym_servers import TRAINING_MODEL_CONFIG, GymLaunchSpec, GymServers

        gym = self.recipe.gym
        if gym.head_url is not None:
            self.gym = GymServers.attach(gym.head_url, timeout=gym.attach_timeout_s)
            return
        config_paths = list(gym.config_paths)
        if gym.add_training_model_config and TRAINING_MODEL_CONFIG not in config_paths:
            config_paths.append(TRAINING_MODEL_CONFIG)
        optional = {
            "head_port": gym.head_port,
            "gym_venv": gym.gym_venv,
            "run_dir": gym.run_dir,
        }
        spec = GymLaunchSpec.parse(
            {
                "config_paths": config_paths,
                "policy_base_url": [f"http://{a}/v1" for a in self.replicas],
                "policy_model_name": self.served_model_name,
                "policy_api_key": gym.policy_api_key.get_secret_value(),
                # Gym's servers must be reachable from this node; its own default would be localhost only.
                "host": gym.host or ray.util.get_node_ip_address(),
                "config_overrides": gym.config_overrides,
                "hydra_overrides": gym.hydra_overrides,
                "env": gym.env,
                "startup_timeout_s": gym.startup_timeout_s,
                **{k: v for k, v in optional.items() if v is not None},
            },
            prefix="nemo_gym",
        )
        self.gym = GymServers.start(spec)
        pids = sorted(self.gym.pids())
        if self.gym.run_dir is not None and pids:
            # The launcher leads its own session: its id finds Gym's processes even after they are re-parented.
            record = {"sessions": sorted({_sid(p) for p in pids} - {None}), "pids": pids, "owner_pid": os.getpid()}
            (self.gym.run_dir / PID_FILE).write_text(json.dumps(record) + "\n")

    def _build_client(self) -> None:
        from nemo_gym_adapter.rollout_client import BlockingRolloutClient, RolloutClientConfig

        routes = self.gym.routes()
        client = self.recipe.gym.client
        self.client = BlockingRolloutClient(
            routes,
            RolloutClientConfig(
                max_concurrency=client.max_concurrency,
                timeout_s=client.timeout_s,
                max_connection_retries=client.max_connection_retries,
                retry_backoff_s=client.retry_backoff_s,
                progress=client.progress,
                key_prefix="nemo_gym.client",
            ),
        )

    # ------------------------------------------------------------------------------------------ one step

    def sampling_overrides(self, validate: bool) -> dict[str, Any]:
        """``responses_create_params`` overrides for a step (as verl's agent loop picks its sampling params)."""
        r = self.recipe
        return {
            "temperature": r.val_temperature if validate else r.temperature,
            "top_p": r.val_top_p if validate else r.top_p,
            "max_output_tokens": r.response_length,
        }

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Run every row through Gym; return verl's legacy padded batch, one output row per input row."""
        from nemo_gym_adapter.metrics import compute_metrics
        from nemo_gym_adapter.trajectory import TrajectoryConfig, postprocess

        if self._closed or self.client is None:
            raise AdapterError("NemoGymAgentLoopManager.generate_sequences called after shutdown (or before start)")
        t0 = time.perf_counter()
        rows, envs = _gym_rows(prompts)
        validate = bool(prompts.meta_info.get("validate", False))
        outcomes = self.client.run(
            [_routed(row, env) for row, env in zip(rows, envs, strict=True)],
            overrides=self.sampling_overrides(validate),
            desc="Gym validation rollouts" if validate else "Gym rollouts",
        )
        t1 = time.perf_counter()
        traj_cfg = TrajectoryConfig(
            prompt_length=self.recipe.prompt_length,
            response_length=self.recipe.response_length,
            max_model_len=self.max_model_len,
            contiguity=self.recipe.gym.trajectory.contiguity,
            mask_on_failure_kind=self.recipe.gym.trajectory.mask_on_failure_kind,
            key_prefix="nemo_gym.trajectory",
        )
        trajectories, padded = postprocess(outcomes, envs, traj_cfg, pad_token_id=self.pad_token_id)
        output = DataProto.from_dict(tensors=padded.tensors, non_tensors=padded.non_tensors)
        metrics = compute_metrics(trajectories, success_threshold=self.recipe.gym.metrics.success_threshold)
        probe = self._engine_probe()
        if probe is not None:
            metrics["gym/engine/probe_logprob_mean"] = probe
        t2 = time.perf_counter()
        metrics.update(
            {
                "gym/timing/rollout_s": t1 - t0,
                "gym/timing/postprocess_s": t2 - t1,
                "gym/timing/generate_sequences_s": t2 - t0,
                "gym/timing/rollouts_per_s": len(rows) / (t1 - t0) if t1 > t0 else 0.0,
            }
        )
        self.last_metrics = metrics
        # "timing" is required by the trainer (and logged); no reward_extra_keys: rm_scores is the whole reward.
        output.meta_info = {"timing": dict(metrics), "reward_extra_keys": []}
        return output

    def _engine_probe(self) -> float | None:
        """Mean log-probability the first replica gives a fixed prompt (``prompt_logprobs``), with the weights it
        serves right now. It moves only when verl's weight sync changed the engine's weights: a step-over-step
        check that training reaches the rollout engine. A failed probe never fails a step (logged, no metric)."""
        ids = getattr(self, "_probe_ids", None)
        if not ids or len(ids) < 2 or not self.replicas:
            return None
        address = next(iter(self.replicas))
        body = {"model": self.served_model_name, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        body["prompt_logprobs"] = 0
        request = urllib.request.Request(
            f"http://{address}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                entries = json.load(response)["choices"][0]["prompt_logprobs"]
            values = [float(entry[str(tok)]["logprob"]) for tok, entry in zip(ids[1:], entries[1:], strict=True)]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            logger.warning("engine probe on %s failed: %s", address, e)
            return None
        return sum(values) / len(values)

    # ------------------------------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Close the rollout client and stop Gym if we started it. Idempotent; never raises for cleanup errors."""
        if self._closed:
            return
        self._closed = True
        for what, stop in (("rollout client", getattr(self.client, "close", None)), ("Gym", self._stop_gym)):
            if stop is None:
                continue
            try:
                stop()
            except Exception:  # cleanup must go on
                logger.exception("stopping the %s failed", what)

    def _stop_gym(self) -> None:
        if self.gym is None:
            return
        self.gym.stop()
        if self.gym.owned and self.gym.run_dir is not None:
            (self.gym.run_dir / PID_FILE).unlink(missing_ok=True)


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _gym_rows(prompts: DataProto) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The batch's Gym rows and environment names (from ``GymJsonlDataset``)."""
    nt = prompts.non_tensor_batch
    missing = [k for k in ("gym_row", "gym_env") if k not in nt]
    if missing:
        raise AdapterError(
            f"generate_sequences: the batch has no {missing} (keys: {sorted(nt)}); set data.custom_cls.path="
            "pkg://nemo_gym_adapter.dataset and data.custom_cls.name=GymJsonlDataset"
        )
    if len(nt["gym_row"]) == 0:
        raise AdapterError("generate_sequences: empty batch")
    return list(nt["gym_row"]), [str(e) for e in np.asarray(nt["gym_env"]).tolist()]


def _routed(row: Mapping[str, Any], env: str) -> Mapping[str, Any]:
    """The row itself, or -- for rows without routing (Gym's bundled examples, routed by ``default_agent``) --
    a copy naming the environment the dataset resolved. Never mutates ``row``."""
    if row.get("agent_ref") is not None or row.get("task_source") is not None:
        return row
    return {**row, "agent_ref": {"name": env}}
