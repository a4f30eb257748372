"""The CPU checkpoint engine (``recipe.nemo_gym.cpu.checkpoint_engine``, backend ``cpu_zmq``) through verl's protocol
as ``CheckpointEngineManager.update_weights`` drives it (prepare, build_topology, init_process_group, send/receive,
finalize), with real ZMQ sockets in this process: every tensor arrives bit-exact at every receiver, in order, twice
in a row (one sync per step); a non-master actor rank only walks the generator. The engine in a real run:
``tests/e2e/test_recipe_v1_cpu.py`` (``separate_async``)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from recipe.nemo_gym.cpu.checkpoint_engine import BACKEND, CpuZmqCheckpointEngine


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(7, 5, generator=g)),
        ("model.norm.weight", torch.randn(5, generator=g).to(torch.bfloat16)),
        ("lm_head.bias", torch.randn(3, 1, 2, generator=g).to(torch.float16)),
        ("position_ids", torch.arange(4, dtype=torch.int64)),
        ("scale", torch.tensor(1.5)),
    ]


def _sync(num_receivers: int) -> tuple[list[list[tuple[str, torch.Tensor]]], int]:
    """One weight sync: actor ranks 0 (master) and 1, ``num_receivers`` rollout workers."""
    actors = [CpuZmqCheckpointEngine(bucket_size=1 << 20, is_master=True), CpuZmqCheckpointEngine(1 << 20)]
    receivers = [CpuZmqCheckpointEngine(1 << 20) for _ in range(num_receivers)]
    metadata = [e.prepare() for e in actors + receivers]
    actor_kwargs, rollout_kwargs = CpuZmqCheckpointEngine.build_topology(len(actors), num_receivers, metadata)
    for group, kwargs in ((actors, actor_kwargs), (receivers, rollout_kwargs)):
        for i, engine in enumerate(group):
            engine.init_process_group(**{k: v[i] for k, v in kwargs.items()})
    walked = []

    def walk():
        for item in _weights():
            walked.append(item[0])
            yield item

    senders = [threading.Thread(target=lambda e=e: asyncio.run(e.send_weights(walk(), global_steps=1))) for e in actors]
    for t in senders:
        t.start()

    async def receive(engine):
        return [(name, t.clone()) async for name, t in engine.receive_weights(global_steps=1)]

    async def receive_all():
        return await asyncio.gather(*(receive(e) for e in receivers))

    received = asyncio.run(receive_all())
    for t in senders:
        t.join(timeout=30)
        assert not t.is_alive()
    for e in actors + receivers:
        e.finalize()
    return received, len(walked)


@pytest.mark.parametrize("num_receivers", [1, 2])
def test_every_tensor_reaches_every_receiver_bit_exact_and_in_order(num_receivers):
    for _ in range(2):  # a second sync on fresh sockets (prepare/finalize per sync, as verl calls them)
        received, walked = _sync(num_receivers)
        assert walked == 2 * len(_weights())  # both actor ranks walked the generator, only rank 0 sent
        assert len(received) == num_receivers
        for got in received:
            assert [n for n, _ in got] == [n for n, _ in _weights()]
            for (_, a), (_, b) in zip(got, _weights(), strict=True):
                assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_the_backend_is_registered_in_verls_registry_on_import():
    from verl.checkpoint_engine import CheckpointEngineRegistry

    assert CheckpointEngineRegistry.get(BACKEND) is CpuZmqCheckpointEngine


def test_a_receiver_that_never_connects_fails_the_sync_naming_the_engine(monkeypatch):
    from recipe.nemo_gym.cpu import checkpoint_engine

    monkeypatch.setattr(checkpoint_engine, "TIMEOUT_MS", 200)
    sender = CpuZmqCheckpointEngine(1 << 20, is_master=True)
    address = sender.prepare()["address"]
    sender.init_process_group(role="send", address=address, num_receivers=1)
    try:
        with pytest.raises(TimeoutError, match=r"cpu_zmq sender at tcp://.*: 0 of 1 receivers ready after 0s"):
            asyncio.run(sender.send_weights(iter(_weights())))
    finally:
        sender.finalize()
