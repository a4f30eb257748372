"""Dead and sick Gym servers: rows bound for them become masked ``server_down`` rows within seconds, never a hang.

Gym cannot be trusted to notice: its relay retries a dead agent forever, its client to the model has no timeouts and
uncapped retries (INTEGRATION_NOTES §5), and its launcher only polls its children once a minute -- and then stops
the *whole* Gym. So we probe every server a row passes through ourselves:

* :class:`probes.Topology` (from Gym's resolved global config and :class:`routing.GymRoutes`): per agent, the servers its
  rows need -- the environment server fronting it, the agent, every server its config references (resources,
  model proxy, judges; transitively) -- and per model proxy its vLLM replicas (``base_url``).
* :meth:`Liveness.check` probes them all concurrently (:class:`probes.HttpProbes`): a Gym server is alive when
  it answers any HTTP at all (Gym's own readiness notion), a vLLM replica when ``/health`` answers 200;
  ``probe_timeout_s`` bounds a sick one. A server silent that long that still accepts connections is busy, not
  down, for ``busy_grace_s`` (a verifier scoring a batch in its event loop); one that refuses them is down at once.
* :meth:`Liveness.before_step` runs one check before each step and applies ``nemo_gym.on_server_down``: ``fail``
  raises :class:`ServerDownError` naming the servers; ``restart`` restarts a Gym we started -- without the dead
  replicas when only replicas died -- at most ``max_restarts`` times per run, logged, and the step routes to the new
  servers; for a Gym we attached to (its host lost, say) ``restart`` waits up to ``nemo_gym.attach_timeout_s`` for it
  to answer again and attaches again (``GymServers.reattach``), else raises :class:`ServerDownError` naming what was
  lost; when no replica of a model is left, ``restart`` raises it too (nothing left to generate with); ``mask`` (and
  ``restart`` once ``max_restarts`` are spent) runs the step with those rows masked.
* :class:`StepGuard` watches during the step (every ``interval_s``, and at once when a row hits a connection error):
  rows of an agent that needs a dead server are cut (or never sent) and become failures with reason
  ``server_down``; ``fail`` cuts every row and the step raises. A dead replica is subtler: Gym pins each rollout
  session to one replica by hash, so only some rows hang, and which ones is not visible outside Gym. Rows still in
  flight are cut once the live replicas have had nothing to do (vLLM's running + waiting gauges) for ``idle_s``
  -- so live rollouts finish first -- or ``replica_grace_s`` after the death when the gauges cannot be read.

Gym 0.7's model proxy has no way to drop a replica at run time (``vllm_model`` hashes sessions over its fixed
``base_url`` list), hence the restart without it. Nothing here imports ``nemo_gym``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from nemo_gym_adapter.data.routing import GymRoutes
from nemo_gym_adapter.errors import AdapterConfigError, GymServerError, ServerDownError
from nemo_gym_adapter.gym.probes import HttpProbes, Load, Probe, Topology

logger = logging.getLogger(__name__)
__all__ = [
    "SERVER_DOWN",
    "Liveness",
    "LivenessConfig",
    "OnServerDown",
    "RestartableGym",
    "ServerDownError",
    "StepGuard",
]

SERVER_DOWN = "server_down"  # RolloutFailure.reason of a row whose server is dead (MaskReason.SERVER_DOWN)
OnServerDown = Literal["mask", "restart", "fail"]
T = TypeVar("T")


class RestartableGym(Protocol):
    """What :class:`Liveness` needs of a running Gym (``servers.GymServers``)."""

    head_url: str

    @property
    def owned(self) -> bool: ...

    def global_config(self, refresh: bool = False) -> dict[str, Any]: ...

    def routes(self) -> GymRoutes: ...

    def restart(self, drop_replicas: Sequence[str] = ()) -> None: ...

    def reattach(self) -> None: ...


@dataclass(frozen=True)
class LivenessConfig:
    """``nemo_gym.on_server_down`` and ``nemo_gym.liveness.*`` (``config.LivenessSection``)."""

    on_server_down: OnServerDown = "restart"
    interval_s: float = 1.0
    probe_timeout_s: float = 3.0
    busy_grace_s: float = 120.0
    idle_s: float = 3.0
    replica_grace_s: float = 120.0
    max_restarts: int = 3

    def __post_init__(self) -> None:
        if self.on_server_down not in ("mask", "restart", "fail"):
            raise AdapterConfigError(f"nemo_gym.on_server_down={self.on_server_down!r}: use mask, restart or fail")


def describe(dead: Mapping[str, str], topology: Topology) -> str:
    return "; ".join(f"{topology.servers[n] if n in topology.servers else n}: {why}" for n, why in sorted(dead.items()))


class Liveness:
    """Probes the servers of one Gym and applies ``on_server_down`` (module docstring). One per trainer."""

    def __init__(
        self,
        topology: Topology,
        config: LivenessConfig | None = None,
        *,
        gym: RestartableGym | None = None,
        probe: Probe | None = None,
        load: Load | None = None,
        replica_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.topology = topology
        self.config = config or LivenessConfig()
        self.gym = gym
        self._http = (
            HttpProbes(self.config.probe_timeout_s, self.config.busy_grace_s, replica_headers)
            if probe is None or load is None
            else None
        )
        self._probe = probe or self._http.probe  # type: ignore[union-attr]
        self._load = load or self._http.load  # type: ignore[union-attr]
        self.restarts = 0
        self.last_dead: dict[str, str] = {}  # what the latest check found dead (replicas by "host:port")

    @classmethod
    def for_gym(
        cls, gym: RestartableGym, config: LivenessConfig | None = None, replica_headers: Mapping[str, str] | None = None
    ) -> Liveness:
        """Probes of ``gym``'s servers and replicas; ``replica_headers``: the run's rollout key for the replicas."""
        return cls(_topology(gym), config, gym=gym, replica_headers=replica_headers)

    async def check(self) -> dict[str, str]:
        """``{server: why}`` for every dead or sick server and replica (probed concurrently)."""
        servers = list(self.topology.servers.values())
        answers = await asyncio.gather(*(self._probe(s) for s in servers))
        self.last_dead = {s.name: why for s, why in zip(servers, answers, strict=True) if why is not None}
        return dict(self.last_dead)

    def blocked(self, agent: str, dead: Mapping[str, str]) -> str | None:
        """Why ``agent``'s rows cannot be served (a needed server dead, or every replica of its model), or None."""
        top = self.topology
        gone = {n: dead[n] for n in top.needs.get(agent, ()) if n in dead}
        for model in top.models_of(agent):
            replicas = top.replicas[model]
            if all(r in dead for r in replicas):
                gone.update({r: dead[r] for r in replicas})
        return f"agent {agent!r} needs {describe(gone, top)}" if gone else None

    async def load(self, replicas: Sequence[str]) -> float | None:
        return await self._load([self.topology.servers[r] for r in replicas])

    async def before_step(self) -> tuple[GymRoutes | None, dict[str, str]]:
        """One check and the ``on_server_down`` policy: ``(new routes after a restart or None, dead servers)``."""
        dead = await self.check()
        if not dead:
            return None, dead
        what = describe(dead, self.topology)
        policy = self.config.on_server_down
        if policy == "fail":
            raise ServerDownError(f"before the step: {what} (nemo_gym.on_server_down=fail)")
        if policy == "restart":
            if self.gym is None:
                logger.warning("no Gym to restart; masking its rows: %s", what)
            elif self.restarts >= self.config.max_restarts:
                logger.warning("Gym restarted %d times already (max_restarts); masking rows: %s", self.restarts, what)
            elif not self.gym.owned:
                if not self._gym_lost(dead):
                    logger.warning("cannot restart a Gym we did not start; masking its rows: %s", what)
                else:
                    return await self._reattach(what)
            else:
                return await self._restart(dead, what)
        logger.warning("masking the rows bound for: %s", what)
        return None, dead

    def _gym_lost(self, dead: Mapping[str, str]) -> bool:
        """Whether a Gym server died (not only replicas): an attached Gym then has to come back as a whole."""
        return any(self.topology.servers[n].kind != "replica" for n in dead if n in self.topology.servers)

    async def _reattach(self, what: str) -> tuple[GymRoutes | None, dict[str, str]]:
        """An attached Gym lost servers (its host, say): wait for it to answer again, then route to it anew."""
        assert self.gym is not None
        self.restarts += 1
        timeout = getattr(self.gym, "attach_timeout_s", 0.0)
        logger.warning(
            "the Gym at %s (attached: not ours to restart) lost %s; waiting up to %.0fs for it to answer again "
            "(nemo_gym.attach_timeout_s)", self.gym.head_url, what, timeout,
        )  # fmt: skip
        try:
            await asyncio.to_thread(self.gym.reattach)
        except GymServerError as e:
            raise ServerDownError(
                f"lost the Gym at {self.gym.head_url} ({what}) and it did not answer again within {timeout:.0f}s "
                f"(nemo_gym.attach_timeout_s): {e}"
            ) from e
        self.topology = await asyncio.to_thread(_topology, self.gym)
        return self.gym.routes(), await self.check()

    async def _restart(self, dead: dict[str, str], what: str) -> tuple[GymRoutes | None, dict[str, str]]:
        assert self.gym is not None
        self.restarts += 1
        replicas = {r for rs in self.topology.replicas.values() for r in rs}
        drop = sorted(n for n in dead if n in replicas)
        lost = [m for m, rs in self.topology.replicas.items() if rs and all(r in drop for r in rs)]
        if lost:
            raise ServerDownError(
                f"every vLLM replica of model server(s) {lost} is lost ({what}): nothing left to generate with "
                "(nemo_gym.on_server_down=restart)"
            )
        logger.warning(
            "restarting Gym (%d/%d)%s because of: %s",
            self.restarts, self.config.max_restarts, f" without replicas {drop}" if drop else "", what,
        )  # fmt: skip
        t0 = time.monotonic()
        await asyncio.to_thread(self.gym.restart, drop)
        self.topology = await asyncio.to_thread(_topology, self.gym)
        logger.warning("Gym restarted in %.1fs (%s)", time.monotonic() - t0, self.gym.head_url)
        return self.gym.routes(), await self.check()

    def guard(self, dead: Mapping[str, str] | None = None) -> StepGuard:
        return StepGuard(self, dict(dead or {}))

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()


def _topology(gym: RestartableGym) -> Topology:
    import urllib.parse

    host = urllib.parse.urlsplit(gym.head_url).hostname or "127.0.0.1"
    return Topology.from_gym(gym.global_config(refresh=True), gym.routes(), host)


class StepGuard:
    """One step's watch (module docstring): :meth:`run` races each row against its servers' death."""

    def __init__(self, liveness: Liveness, dead: dict[str, str]) -> None:
        self.liveness = liveness
        self.dead: dict[str, str] = {}  # every server seen dead during the step
        self.down: dict[str, str] = {}  # agent -> why its rows are cut
        self.error: ServerDownError | None = None
        self._events: dict[str, asyncio.Event] = {}
        self._cuts: dict[str, asyncio.Event] = {}  # model -> cuts the rows in flight now
        self._cut_why: dict[int, str] = {}
        self._inflight: dict[str, int] = {}
        self._nudge = asyncio.Event()
        self._idle_since: dict[str, float] = {}
        self._replica_dead_at: dict[str, float] = {}
        self.apply(dead)

    def _event(self, key: str, table: dict[str, asyncio.Event]) -> asyncio.Event:
        return table.setdefault(key, asyncio.Event())

    def down_reason(self, agent: str) -> str | None:
        return self.down.get(agent)

    def suspect(self) -> None:
        """A row hit a connection error: probe now rather than at the next interval."""
        self._nudge.set()

    def apply(self, dead: Mapping[str, str]) -> None:
        """Cut the rows of every agent that needs one of ``dead`` (all rows under ``fail``)."""
        now = time.monotonic()
        new = {n: why for n, why in dead.items() if n not in self.dead}
        self.dead.update(dead)
        top = self.liveness.topology
        for name in new:
            self._replica_dead_at.setdefault(name, now)
        if new and self.liveness.config.on_server_down == "fail" and self.error is None:
            self.error = ServerDownError(f"during the step: {describe(new, top)} (nemo_gym.on_server_down=fail)")
        for agent in top.needs:
            why = self.liveness.blocked(agent, self.dead)
            if why is None and self.error is not None:
                why = str(self.error)
            if why is not None and agent not in self.down:
                self.down[agent] = why
                self._event(agent, self._events).set()
                logger.warning("%s: its rows are masked as %s", why, SERVER_DOWN)

    async def _stuck_rows(self) -> None:
        """Cut rows hanging on a dead replica once the live replicas are idle (or after the grace period)."""
        cfg, top, now = self.liveness.config, self.liveness.topology, time.monotonic()
        for model, replicas in top.replicas.items():
            dead = [r for r in replicas if r in self.dead]
            live = [r for r in replicas if r not in self.dead]
            if not dead or not live or not self._inflight.get(model):
                self._idle_since.pop(model, None)
                continue
            busy = await self.liveness.load(live)
            if busy is None:
                cut = now - min(self._replica_dead_at[r] for r in dead) >= cfg.replica_grace_s
            else:
                since = self._idle_since.setdefault(model, now) if busy == 0 else self._idle_since.pop(model, now)
                cut = busy == 0 and now - since >= cfg.idle_s
            if cut:
                why = f"replica(s) {dead} of model server {model!r} are down ({describe({r: self.dead[r] for r in dead}, top)}) and the rows still in flight wait on them"
                logger.warning("%s: %d row(s) masked as %s", why, self._inflight[model], SERVER_DOWN)
                event = self._cuts.pop(model, None) or asyncio.Event()
                self._cut_why[id(event)] = why
                event.set()
                self._idle_since.pop(model, None)

    async def confirm(self, agent: str) -> str | None:
        """Probe now (a row of ``agent`` failed to connect): why its rows are cut, or None if its servers answer."""
        self.apply(await self.liveness.check())
        return self.down.get(agent)

    async def watch(self) -> None:
        """Probe every ``interval_s`` (or when nudged) until cancelled."""
        cfg = self.liveness.config
        while True:
            try:
                await asyncio.wait_for(self._nudge.wait(), cfg.interval_s)
            except asyncio.TimeoutError:
                pass
            self._nudge.clear()
            try:
                self.apply(await self.liveness.check())
                await self._stuck_rows()
            except Exception:  # a broken probe must never end the step; the deadline still bounds every row
                logger.exception("liveness check failed")

    async def run(self, agent: str, work: Awaitable[T]) -> T | str:
        """``work``'s result, or -- when the agent's servers die first -- why (``work`` is then cancelled)."""
        why = self.down.get(agent)
        if why is not None:
            if asyncio.iscoroutine(work):
                work.close()
            return why
        models = self.liveness.topology.models_of(agent)
        stops = [self._event(agent, self._events), *(self._event(m, self._cuts) for m in models)]
        task = asyncio.ensure_future(work)
        waiters = [asyncio.ensure_future(e.wait()) for e in stops]
        for m in models:
            self._inflight[m] = self._inflight.get(m, 0) + 1
        try:
            await asyncio.wait({task, *waiters}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            for m in models:
                self._inflight[m] -= 1
            for w in waiters:
                w.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return self.down.get(agent) or next(self._cut_why[id(e)] for e in stops[1:] if e.is_set())
