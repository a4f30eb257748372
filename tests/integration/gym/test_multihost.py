"""Across hosts: verl's vLLM replicas on two hosts, a shared Gym on one of them, the trainer on the Ray head.

The bed (``tests.support.multihost``, one per module): host 1 is this process's network namespace (Ray
head; this pytest process is the trainer's driver), hosts 2 and 3 are network namespaces with a Ray node each and one
logical GPU each. verl builds the rollout as ``RayPPOTrainer.init_workers`` does: the ``CpuActorRolloutRefWorker``
group with one rank per GPU host (gloo across the namespaces), then ``LLMServerManager.create(worker_group=)``, which
places one CPU vLLM replica on each rank's node. Then:

- start mode: our manager on host 1 finds both replicas at their own hosts' addresses, patches both actors, starts
  Gym on loopback (nothing on another host calls it) and runs multi-turn rollouts through both replicas;
- attach mode: Gym runs as a service on host 3 (``nemo_gym_adapter.gym.service``, listening on host 3's address
  because host 1 attaches), the manager attaches with ``nemo_gym.head_url`` and runs the same rollouts;
- who listens where, per host (``ss -ltnp`` in each namespace, our processes only): Gym's servers and Gym's Ray on
  loopback, each replica's HTTP port on its own host's address and refusing requests without the run's rollout key
  (``NGV_ROLLOUT_API_KEY``, given to the trainer and to the Gym service alike), and nothing else beyond the Ray
  ports docs/CLUSTER.md lists;
- teardown leaves no process of ours on any host and no namespace or link.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator

import pytest

from nemo_gym_adapter.gym.addresses import policy_urls
from nemo_gym_adapter.runtime.procs import alive as _alive
from tests.support.gym_fixtures import (
    SINGLE_TOOL_CALL_AGENT,
    SINGLE_TOOL_CALL_CONFIG,
    example_rows,
    forced_tool_call_row,
)

pytestmark = pytest.mark.integration

N = 2  # rollout.n
PROMPTS = 2
MAX_STEPS = {SINGLE_TOOL_CALL_AGENT: {"responses_api_agents": {"simple_agent": {"max_steps": 3}}}}


def _compose(train_file: str, **extra: str):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recipe.nemo_gym.config.resolvers import register_resolvers
    from recipe.nemo_gym.main import CONFIG_DIR, with_verl_searchpath

    register_resolvers()
    overrides = [
        f"data.train_files=[{train_file}]",
        f"data.val_files=[{train_file}]",
        f"actor_rollout_ref.rollout.n={N}",
        "trainer.use_v1=false",  # the legacy trainer's manager (built here the way RayPPOTrainer builds it)
        # one rank per host: verl divides the mini-batch (x n) by the world size
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        # and the step's train_batch_size x n by it for the log-probs: 2 x 2 over 2 ranks (the config's 8 is refused)
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        *(f"{k}={v}" for k, v in extra.items()),
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="nemo_gym_cpu", overrides=with_verl_searchpath(overrides))
    OmegaConf.resolve(cfg)
    return cfg


@pytest.fixture(scope="module")
def bed():
    """Three hosts, a Ray cluster across them, this process connected as the driver."""
    import ray

    from tests.support.multihost import MultiHostBed

    if ray.is_initialized():
        pytest.fail("a Ray cluster is already up in this process; this module needs the bed's")
    mode = os.environ.get("NGV_MULTIHOST_MODE", "auto")  # "loopback": the fallback, where namespaces cannot be made
    with chosen_rollout_key():
        bed = MultiHostBed(hosts=3, resources={2: {"GPU": 1}, 3: {"GPU": 1}}, mode=mode).start()
        try:
            yield bed
        finally:
            if ray.is_initialized():
                ray.shutdown()
            bed.close()


@contextlib.contextmanager
def chosen_rollout_key() -> Iterator[dict[str, str]]:
    """The run's rollout key, chosen in ``NGV_ROLLOUT_API_KEY`` for the block (attach mode needs one both sides know:
    the trainer and the Gym service read it); yields the header a test's own requests to the replicas send."""
    from nemo_gym_adapter.access.key import ENV, bearer

    previous = os.environ.get(ENV)
    os.environ[ENV] = "multihost-" + secrets.token_urlsafe(24)
    try:
        yield bearer(os.environ[ENV])
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    """Rows whose every model call is forced to the tool call: three model calls per rollout (multi-turn)."""
    rows = [forced_tool_call_row(row) for row in example_rows()[:PROMPTS]]
    path = tmp_path_factory.mktemp("rows") / "forced.jsonl"
    path.write_text("".join(json.dumps({**r, "agent_ref": {"name": SINGLE_TOOL_CALL_AGENT}}) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def verl_rollout(bed, rows_file):
    """(config, LLMServerManager) with verl's replicas on hosts 2 and 3, as the legacy trainer builds them."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerManager

    from recipe.nemo_gym.cpu import rollout  # noqa: F401  (the CPU replica registered as "vllm")
    from tests.integration.verl_workers import spawn_cpu_actor_workers

    cfg = _compose(rows_file)
    env = {k: str(v) for k, v in cfg.ray_kwargs.ray_init.runtime_env.env_vars.items()}
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    ray.init(address=bed.ray_address, runtime_env={"env_vars": env}, log_to_driver=False)
    t0 = time.perf_counter()
    workers = spawn_cpu_actor_workers(cfg, process_on_nodes=[1, 1], init_model=False)
    t1 = time.perf_counter()
    llm = LLMServerManager.create(config=cfg, worker_group=workers.actor_wg)
    print(f"bed {bed.timings}; actor ranks {t1 - t0:.1f}s; replicas {time.perf_counter() - t1:.1f}s")
    return cfg, llm


@pytest.fixture(scope="module")
def gym_service(bed, verl_rollout):
    """Gym as a service on host 3 in front of the replicas (started now, waited for by the attach test)."""
    cfg, llm = verl_rollout
    host3 = bed.hosts[2]
    urls = [f"http://{a}/v1" for a in llm.get_addresses()]
    argv = [
        sys.executable,
        "-m",
        "nemo_gym_adapter.gym.service",
        "--config-path",
        SINGLE_TOOL_CALL_CONFIG,
        *[arg for url in urls for arg in ("--policy-base-url", url)],
        "--policy-model-name",
        cfg.actor_rollout_ref.model.path,
        "--reachable-from",
        bed.hosts[0].address,
        "--config-overrides",
        json.dumps(MAX_STEPS),
        "--run-dir",
        str(bed.run_dir / "gym-service"),
    ]
    return bed.spawn(host3, "gym service", argv, cwd=bed.run_dir)


def _manager(cfg, llm):
    from verl.utils.import_utils import load_class_from_fqn

    cls = load_class_from_fqn(cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class)
    return cls.create(config=cfg, llm_client=llm.get_client(), teacher_client=None, reward_loop_worker_handles=None)


def _rollouts(cfg, manager):
    """A training batch from GymJsonlDataset through ``generate_sequences``: all rows valid, multi-turn, contiguous."""
    import numpy as np
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    from recipe.nemo_gym.managers.legacy import GYM_METRICS_KEY

    dataset = create_rl_dataset(cfg.data.train_files, cfg.data, None, None, is_train=True)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
    gen = RayPPOTrainer._get_gen_batch(None, batch).repeat(repeat_times=N, interleave=True)
    out = manager.generate_sequences(gen)
    timing = out.meta_info[GYM_METRICS_KEY]
    assert len(out) == PROMPTS * N
    assert (out.batch["response_mask"].sum(-1) > 0).all(), out.non_tensor_batch["gym_masked_reason"]
    assert min(out.non_tensor_batch["__num_turns__"]) >= 2 and timing["gym/all/contiguity_rate"] == 1.0
    return float(np.mean(timing["gym/timing/rollout_s"]))


def _replica_hosts(bed) -> set[str]:
    return {h.address for h in bed.hosts[1:]}


def test_start_mode_replicas_on_their_own_hosts_patched_and_gym_on_loopback(bed, verl_rollout, gym_service):
    import ray

    from nemo_gym_adapter.vllm.patch import is_patched

    cfg, llm = verl_rollout
    manager = _manager(cfg, llm)
    try:
        # One replica per GPU host, each at its own host's address (never loopback, never the head's).
        endpoints = manager.replica_endpoints
        assert sorted(ep.address for ep in endpoints) == sorted(llm.get_addresses())
        assert {ep.node_ip for ep in endpoints} == _replica_hosts(bed)
        assert all(ep.host == ep.node_ip for ep in endpoints), endpoints
        # What Gym received: one URL per replica, with that replica's own host.
        sent = policy_urls(manager.gym.global_config())  # policy_base_url + the policy's model server(s)
        assert sorted(sent) == sorted(ep.url for ep in endpoints)
        assert {urllib.parse.urlsplit(u).hostname for u in sent} == _replica_hosts(bed)
        # The patch reached every replica actor on every host: reports from each host, the live hook in each actor.
        reports = {r.actor: r for r in manager.patch_reports}
        assert set(reports) == {ep.actor for ep in endpoints} and all(r.hook for r in reports.values())
        assert {r.node_ip for r in reports.values()} == _replica_hosts(bed)
        for ep in endpoints:
            state = ray.get(ray.get_actor(ep.actor).__ray_call__.remote(lambda s: (is_patched(), os.getpid())))
            assert state == (True, reports[ep.actor].pid), ep.actor
        # Gym listens on loopback: nothing on another host calls it (the replicas are called, they never call).
        why = "never call" if bed.mode == "netns" else "everything is on this host"  # loopback mode: one machine
        assert manager.gym_host.host == "127.0.0.1" and why in manager.gym_host.reason
        assert urllib.parse.urlsplit(manager.gym.head_url).hostname == "127.0.0.1"
        assert {i.host for i in manager.gym.server_instances().values()} == {"127.0.0.1"}
        # Gym joined the Ray head started from Gym's venv on host 1 (nemo_gym.ray_head: early), over loopback
        assert manager.ray_head is not None and manager.gym.ray_head is manager.ray_head
        assert manager.gym.spec.ray_head_node_address == manager.ray_head.address
        # ... and Gym's launch ran in the warm launcher started next to it (nemo_gym.warm_launcher, the default)
        assert manager.gym.warm, manager.warm
        _check_listeners(bed, manager, gym_service)
        rollout_s = _rollouts(cfg, manager)
        print(f"start mode: manager {manager.setup_seconds}, rollouts {rollout_s:.1f}s")
        gym_pids = manager.gym.pids() | manager.ray_head.pids()
    finally:
        manager.shutdown()
    assert not [p for p in gym_pids if _alive(p)]


def test_attach_mode_to_gym_running_on_another_host(bed, verl_rollout, gym_service):
    from nemo_gym_adapter.gym.servers import GymServers

    cfg, llm = verl_rollout
    info = _ready_line(gym_service, timeout=600)
    # The service listens on host 3's own address, because host 1 attaches to it (loopback mode: one machine).
    expected = bed.hosts[2].address if bed.mode == "netns" else "127.0.0.1"
    assert urllib.parse.urlsplit(info["head_url"]).hostname == info["host"] == expected, info
    from omegaconf import OmegaConf

    attach_cfg = OmegaConf.merge(cfg, {"nemo_gym": {"head_url": info["head_url"], "config_paths": []}})
    manager = _manager(attach_cfg, llm)
    try:
        assert not manager.gym.owned and manager.gym.head_url == info["head_url"]
        assert {r.node_ip for r in manager.patch_reports} == _replica_hosts(bed)  # patched again (idempotent)
        rollout_s = _rollouts(attach_cfg, manager)
        print(f"attach mode: manager {manager.setup_seconds}, rollouts {rollout_s:.1f}s")
    finally:
        manager.shutdown()
    GymServers.attach(info["head_url"], timeout=10)  # detaching stopped nothing on host 3


def test_teardown_leaves_nothing_on_any_host(bed, verl_rollout):
    import ray

    ray.shutdown()
    seen = {h.name: bed.processes_on(h) for h in bed.hosts}
    assert all(seen.values()), seen  # every host ran processes of ours
    leftovers = bed.close()
    assert not leftovers, leftovers
    assert not [p for pids in seen.values() for p in pids if _alive(p)]
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [h.netns for h in bed.hosts if h.netns and h.netns in names]
    print(f"bed timings {bed.timings}")


def _ours(bed, host) -> set[int]:
    """Our pids on ``host``: what the bed started there (in a namespace: everything in it), on host 1 also this
    process (the driver) and everything it started (Gym, Gym's Ray head)."""
    import psutil

    pids = bed.processes_on(host)
    if host.index == 1:
        pids |= {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
    return pids


# docs/CLUSTER.md's table, as the bed sees it: what each kind of process may listen on. A listener of ours that is none
# of these fails the test (with the printed table); "any" = every interface, "address" = one non-loopback address.
RAY_PROCESSES = (
    "raylet",
    "gcs_server",
    "ray::",
    "ray/dashboard",
    "ray/autoscaler",
    "ray.util.client.server",
    "ray/_private",
)
GYM_PROCESSES = ("gym-server-venvs", "warm_boot.py", "gym env start")


def _kind(item, host, gym_side: set[int], service_side: set[int]) -> tuple[str, set[str]]:
    """(what the listener is, the scopes docs/CLUSTER.md allows it)."""
    command = item.process
    if item.pid in gym_side:
        return "Gym started by the trainer, and its Ray head", {"loopback"}
    if "gym-venv" in command and any(r in command for r in RAY_PROCESSES):
        return "a Ray started from Gym's venv (one machine)", {"loopback"}
    if item.pid in service_side or any(g in command for g in GYM_PROCESSES):
        return "the attached Gym service (host 3)", {"address", "loopback"} if host.index == 3 else set()
    if command.startswith("VLLM::EngineCore"):
        return "vLLM's engine core (its own sockets, on the replica's address)", {"address"}
    if any(r in command for r in RAY_PROCESSES) or (host.index == 1 and item.pid == os.getpid()):
        return "Ray (its processes, every worker and actor, the driver)", {"any", "address", "loopback"}
    return "not in docs/CLUSTER.md", set()


def _check_listeners(bed, manager, service) -> None:
    """Who listens where (module docstring): printed per host, then each listener checked against docs/CLUSTER.md's
    table (:func:`_kind`); Gym's side on loopback, each replica's HTTP port on its own host's address refusing a
    request without the key, and a stranger on another host cannot reach the Gym the trainer started."""
    import urllib.error
    import urllib.request

    import psutil

    from tests.support.listeners import listeners, table

    seen = {h.name: listeners(h.netns, _ours(bed, h)) for h in bed.hosts}
    for host in bed.hosts:
        print(f"listeners on {host.name} ({host.address}):\n{table(seen[host.name])}")
    if bed.mode != "netns":
        return  # loopback mode: one namespace, every "host" on 127.77.0.x

    def tree(pids: set[int]) -> set[int]:
        out = set(pids)
        for pid in pids:
            try:
                out |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
            except psutil.Error:
                pass
        return out

    gym_side = tree(set(manager.gym.pids()) | set(manager.ray_head.pids()))
    from nemo_gym_adapter.runtime.procs import session_members

    service_side = tree({service.pid, *session_members(service.pid)})  # the attach test's Gym service on host 3
    unlisted = []
    for host in bed.hosts:
        for item in seen[host.name]:
            kind, allowed = _kind(item, host, gym_side, service_side if host.index == 3 else set())
            if item.scope not in allowed or (
                item.scope == "address" and item.host.strip("[]").removeprefix("::ffff:") != host.address
            ):
                unlisted.append((host.name, kind, item))
    assert not unlisted, "listeners beyond docs/CLUSTER.md:\n" + "\n".join(f"{h}: {k}: {i}" for h, k, i in unlisted)
    assert any(item.pid in gym_side for item in seen[bed.hosts[0].name])  # the control: Gym's listeners were found
    # A stranger on another host cannot reach it: host 2 connecting to Gym's head port at host 1's address.
    port = urllib.parse.urlsplit(manager.gym.head_url).port
    probe = f"import socket; socket.create_connection(('{bed.hosts[0].address}', {port}), timeout=5)"
    refused = subprocess.run(bed.hosts[1].command([sys.executable, "-c", probe]), capture_output=True, text=True)
    assert refused.returncode != 0 and "ConnectionRefusedError" in refused.stderr, refused.stderr[-500:]
    # Each replica's HTTP port: its own host's address, never every interface; a request without the key: 401.
    for ep in manager.replica_endpoints:
        host = next(h for h in bed.hosts if h.address == ep.host)
        held = [item for item in seen[host.name] if item.port == ep.port]
        assert held and {item.host for item in held} == {ep.host}, held
        try:
            urllib.request.urlopen(f"http://{ep.address}/health", timeout=30)
            status = 200
        except urllib.error.HTTPError as e:
            status = e.code
        assert status == 401, ep


def _ready_line(proc, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proc.log_path.read_text(errors="replace").splitlines():
            if line.startswith('{"head_url"'):
                return json.loads(line)
        if not proc.alive():
            raise proc.fail("exited before it was ready")
        time.sleep(0.5)
    raise proc.fail(f"not ready after {timeout:.0f}s")
