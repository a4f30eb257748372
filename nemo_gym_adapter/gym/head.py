"""What a running NeMo Gym 0.7 answers over HTTP (component 3, the read-only half): the head server's
``/global_config_dict_yaml`` and ``/server_instances``, and the routes and ``/run`` URLs the rollout client derives
from them. Apart from :mod:`nemo_gym_adapter.gym.servers` because it owns no process: a started Gym and an attached one
are both read through it (``GymServers`` adds the lifecycle).
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from typing import Any

from pydantic import BaseModel, ConfigDict

from nemo_gym_adapter.access.gym_guard import client_headers
from nemo_gym_adapter.data.routing import GymRoutes
from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.gym.capture import capture_dir
from nemo_gym_adapter.gym.launch import API_KEY_REF
from nemo_gym_adapter.runtime.http_get import http_get as runtime_http_get

logger = logging.getLogger(__name__)


class GymServerInstance(BaseModel):
    """One entry of the head server's ``/server_instances`` (extra fields kept)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    process_name: str
    server_type: str
    name: str  # the implementation, e.g. ``simple_agent``
    host: str
    port: int
    url: str


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url`` (with the run's key when Gym's servers require it): (status, body). Raises ``OSError`` when
    nothing answers in HTTP (``nemo_gym_adapter.runtime.http_get``: no listener, or a port connected to itself)."""
    return runtime_http_get(url, client_headers(), timeout)


def answers(url: str) -> bool:
    """Gym's own readiness notion: any HTTP answer at all (a server need not route ``/``)."""
    try:
        http_get(url, timeout=3.0)
        return True
    except (OSError, ValueError):
        return False


class GymHead:
    """What a running Gym's head server answers (``/global_config_dict_yaml``, ``/server_instances``), and the routes
    and URLs the rollout client derives from it."""

    def __init__(self, head_url: str) -> None:
        self.head_url = head_url.rstrip("/")
        self._config: dict[str, Any] | None = None

    def global_config(self, refresh: bool = False) -> dict[str, Any]:
        """Gym's whole config (``/global_config_dict_yaml``) with interpolations resolved (``base_url`` is
        ``${policy_base_url}`` there). It holds secrets: don't log it. Our own API key reference cannot resolve in
        this process (the key lives in Gym's environment only) and reads ``<redacted>``."""
        if self._config is None or refresh:
            from omegaconf import OmegaConf

            status, body = http_get(f"{self.head_url}/global_config_dict_yaml", timeout=30)
            if status != 200:
                raise GymServerError(f"Gym head server {self.head_url}: /global_config_dict_yaml answered {status}")
            # FastAPI returns the YAML text as a JSON string. Redact before resolving (reading resolves).
            raw = OmegaConf.to_container(OmegaConf.create(json.loads(body)), resolve=False)
            if raw.get("policy_api_key") == API_KEY_REF:
                raw["policy_api_key"] = "<redacted>"
            cfg = OmegaConf.create(raw)
            try:
                self._config = OmegaConf.to_container(cfg, resolve=True)
            except Exception as e:  # e.g. ${oc.env:X} of a variable only Gym's environment has
                logger.warning("Gym config has interpolations we cannot resolve here (%s); using them verbatim", e)
                self._config = OmegaConf.to_container(cfg, resolve=False)
        return self._config

    def server_instances(self) -> dict[str, GymServerInstance]:
        """``/server_instances`` keyed by instance (top-level config) name."""
        status, body = http_get(f"{self.head_url}/server_instances", timeout=30)
        if status != 200:
            raise GymServerError(f"Gym head server {self.head_url}: /server_instances answered {status}")
        return {d["process_name"]: GymServerInstance.model_validate(d) for d in json.loads(body)}

    def base_urls(self) -> dict[str, str]:
        """``http://host:port`` of the head server (``"head server"``) and of every server instance, by name."""
        return {"head server": self.head_url, **{name: inst.url for name, inst in self.server_instances().items()}}

    def server_url(self, name: str) -> str:
        """``http://host:port`` of the server instance ``name`` (from the global config, as Gym's client does)."""
        block: Any = self.global_config().get(name)
        try:
            (server,) = [cfg for impls in block.values() for cfg in impls.values()]
            return f"http://{server['host']}:{server['port']}"
        except (AttributeError, TypeError, ValueError, KeyError) as e:
            raise GymServerError(f"Gym has no server instance {name!r} (head {self.head_url})") from e

    def routes(self) -> GymRoutes:
        """This Gym's agent → environment-server routes (:class:`routing.GymRoutes`: one routing rule for both) and
        its token-ID capture directory; ``AdapterConfigError`` when its capture mode cannot work (``gym.capture``)."""
        instances = [inst.model_dump() for inst in self.server_instances().values()]
        head_host = urllib.parse.urlsplit(self.head_url).hostname or "127.0.0.1"
        config = self.global_config()
        routes = GymRoutes.from_config(config, instances, head_host=head_host)
        routes.capture_dir = capture_dir(config)
        return routes

    def environment_servers_by_agent(self) -> dict[str, list[str]]:
        """Agent instance name -> the environment servers fronting it (Gym's collector routes through these)."""
        return {agent: [r.server for r in routes] for agent, routes in self.routes().servers_by_agent.items()}

    def run_url(self, agent_name: str) -> str:
        """The ``/run`` URL for rows of ``agent_name``: its one environment server (as ``rollout_collection``)."""
        routes = self.routes().servers_by_agent.get(agent_name, ())
        if len(routes) != 1:
            names = [r.server for r in routes]
            raise GymServerError(f"agent {agent_name!r} is fronted by {len(routes)} environment servers: {names}")
        return routes[0].run_url

    def unready_instances(self) -> list[str]:
        """Server instances that do not answer yet (``["head server"]`` while the head itself does not)."""
        try:
            instances = self.server_instances()
        except (OSError, GymServerError):
            return ["head server"]
        return [name for name, inst in instances.items() if not answers(inst.url)]
