"""Who may reach the run, decided on the driver before ``ray.init`` (``nemo_gym_adapter.access``; docs/CLUSTER.md):
where the run listens, the Ray it starts (a token of its own; no dashboard web UI and no metrics exporters unless
``nemo_gym.access.ray_dashboard``), the rollout key -- and the driver's environment put back when the run ends.
``recipe.nemo_gym.main`` calls :func:`prepare_access` after the config is validated and :meth:`RunAccess.restore`
at the end."""

from __future__ import annotations

import logging
import os
import urllib.parse

from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_gym_adapter.access import key as access_key
from nemo_gym_adapter.access import listen
from nemo_gym_adapter.errors import AdapterConfigError
from recipe.nemo_gym.config.load import RecipeConfig

logger = logging.getLogger(__name__)


class RunAccess:
    """What :func:`prepare_access` set for this run: the listen plan, the rollout key (None with
    ``nemo_gym.access.require_key=false``), and the environment variables to put back when the run ends."""

    def __init__(self, plan: listen.ListenPlan, key: access_key.RunKey | None, saved: dict[str, str | None]) -> None:
        self.plan, self.key, self._saved = plan, key, saved

    def restore(self) -> None:
        """The key out of Ray's KV (a joined cluster outlives the run) and this process's environment as it was."""
        if self.key is not None:
            try:
                access_key.unpublish()
            except Exception as e:  # the cluster may be gone already
                logger.debug("rollout key not unpublished: %s", e)
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prepare_access(cfg: DictConfig, recipe: RecipeConfig) -> RunAccess:
    """Who may reach the run (``nemo_gym_adapter.access``), decided before ``ray.init``:

    - where it listens (``access.listen.plan``, ``nemo_gym.access.local_only``): on one host, Ray's one-machine mode
      in this process's environment, which Ray and everything it starts inherit -- every Ray port, the rollout
      servers, TransferQueue and Gym's Ray on 127.0.0.1;
    - a Ray the recipe starts gets a token of its own in the environment (``access.listen.ray_token_env``), never
      written to ``~/.ray/auth_token``, and, unless ``nemo_gym.access.ray_dashboard``, neither the dashboard's web UI
      (``ray_kwargs.ray_init.include_dashboard: false``) nor Ray's metrics exporters (``access.listen.ray_exporters_env``),
      which answer every user of the host;
    - the rollout key (``nemo_gym.access.require_key``): ``NGV_ROLLOUT_API_KEY`` or a generated one, published in
      Ray's KV right after ``ray.init`` (``recipe.nemo_gym.main.run`` registers that). Attached to a Gym you run, a generated key
      cannot work: ``AdapterConfigError`` naming the variable (``access.key.attach_error``).
    """
    from nemo_gym_adapter.gym.addresses import is_local

    access, gym = recipe.gym.access, recipe.gym
    address = OmegaConf.select(cfg, "ray_kwargs.ray_init.address", default=None)
    recorded = None
    if address in (None, "", "auto") and not os.environ.get("RAY_ADDRESS"):
        from ray._private.utils import read_ray_address  # a cluster `ray start` recorded here: ray.init would join it

        recorded = read_ray_address()
    own_ray = listen.starts_own_ray(address, os.environ, recorded)
    head_host = urllib.parse.urlsplit(gym.head_url).hostname if gym.head_url else None
    plan = listen.plan(
        access.local_only,
        own_ray=own_ray,
        nnodes=int(OmegaConf.select(cfg, "trainer.nnodes", default=1) or 1),
        gym_elsewhere=head_host if head_host and not is_local(head_host) else None,
        environ=os.environ,
    )
    key = None
    if access.require_key:
        key = access_key.driver_key()
        if gym.head_url is not None and key.source != "env":
            raise AdapterConfigError(access_key.attach_error(gym.head_url))
    env = {**plan.env}
    if own_ray:
        env |= listen.ray_token_env(os.environ) | listen.ray_exporters_env(os.environ, access.ray_dashboard)
        if not access.ray_dashboard and OmegaConf.select(cfg, "ray_kwargs.ray_init.include_dashboard") is None:
            with open_dict(cfg):  # load_config refused `true` already
                OmegaConf.update(cfg, "ray_kwargs.ray_init.include_dashboard", False, force_add=True)
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    exporters = "on (nemo_gym.access.ray_dashboard)" if access.ray_dashboard else "off"
    logger.info(
        "access: %s; Ray: %s, dashboard and metrics exporters %s; rollout servers: %s",
        plan.reason,
        "a token of its own" if "RAY_AUTH_TOKEN" in env else "as configured (ray_kwargs / RAY_AUTH_*)",
        exporters if own_ray else "as the cluster you joined has them",
        f"the run's key required on every route ({key})" if key else "no key (nemo_gym.access.require_key=false)",
    )
    return RunAccess(plan, key, saved)
