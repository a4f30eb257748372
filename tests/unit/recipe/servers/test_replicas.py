"""``recipe.nemo_gym.servers.replicas``: the weight versions the replicas serve, read so that a lost node costs a stamp, not a
step (fake actor handles; the real ones on the multi-host bed: tests/integration/gym/test_multihost_chaos.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import ray

from recipe.nemo_gym.servers.replicas import weight_versions_async


class FakeActorHandle:
    """``handle.__ray_call__.remote(fn)`` runs ``fn(state)``, or fails as a call to an actor on a lost node does."""

    def __init__(self, global_steps: int | None, lost: bool = False) -> None:
        async def call(fn):
            if lost:
                raise ray.exceptions.ActorDiedError()
            return fn(SimpleNamespace(global_steps=global_steps))

        self.__ray_call__ = SimpleNamespace(remote=call)


def test_an_actor_on_a_lost_node_is_left_out_of_the_weight_versions(caplog):
    handles = {"vllm_server_0_0": FakeActorHandle(3), "vllm_server_1_0": FakeActorHandle(None, lost=True)}
    with caplog.at_level("WARNING", logger="recipe.nemo_gym.servers.replicas"):
        assert asyncio.run(weight_versions_async(handles)) == [3]
    assert any("vllm_server_1_0" in r.getMessage() for r in caplog.records)
