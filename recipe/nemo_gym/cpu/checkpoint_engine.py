"""A CPU checkpoint engine for verl's ``separate_async`` trainer: the actor's weights to standalone vLLM replicas
over ZMQ (``actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_zmq``, ``custom_backend_module`` = this module).

verl 0.9.1 refuses ``naive`` for ``separate_async`` (``trainer_separate_async.py:68``) and every engine it ships needs
CUDA/NPU or an extra package. This one follows verl's ``CheckpointEngine`` protocol (``checkpoint_engine/base.py``):
``prepare`` -> ``build_topology`` -> ``init_process_group`` -> ``send_weights`` / ``receive_weights`` -> ``finalize``,
once per sync. Actor rank 0 binds a ZMQ ROUTER and sends every tensor to each receiver (one ``CheckpointEngineWorker``
per standalone replica worker) after that receiver said it is ready; other actor ranks only walk the weight generator
(producing each weight is collective over the actor group). The receiver yields ``(name, tensor)`` to verl's
``ServerAdapter.update_weights``. For small CPU runs and tests; on GPU use verl's ``nccl``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Generator
from typing import Any

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

logger = logging.getLogger(__name__)

BACKEND = "cpu_zmq"
_END = b'{"end": true}'
TIMEOUT_MS = 600_000  # a receiver that neither connects nor finishes within this fails the sync, naming the engine


@CheckpointEngineRegistry.register(BACKEND)
class CpuZmqCheckpointEngine(CheckpointEngine):
    """See the module docstring. ``is_master``: actor rank 0 (verl passes it to the actor's engine only)."""

    def __init__(self, bucket_size: int, is_master: bool = False, **_: Any) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.role = "receive"
        self.num_receivers = 0
        self.address: str | None = None
        self.socket: Any = None
        self.context: Any = None

    def prepare(self) -> dict[str, Any]:
        if not self.is_master:
            return {"address": None}
        import ray
        import zmq

        ip = ray.util.get_node_ip_address().strip("[]")
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        port = self.socket.bind_to_random_port(f"tcp://{ip}")
        self.address = f"tcp://{ip}:{port}"
        return {"address": self.address}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        address = metadata[0]["address"]
        assert address, "cpu_zmq: actor rank 0 must bind the sender socket"
        actor = {
            "role": ["send"] * actor_wg_world_size,
            "address": [address] * actor_wg_world_size,
            "num_receivers": [rollout_world_size] * actor_wg_world_size,
        }
        rollout = {
            "role": ["receive"] * rollout_world_size,
            "address": [address] * rollout_world_size,
            "num_receivers": [rollout_world_size] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, role: str, address: str, num_receivers: int, **_: Any) -> None:
        self.role, self.address, self.num_receivers = role, address, num_receivers

    def finalize(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
        if self.context is not None:
            self.context.term()
        self.socket = self.context = None

    @torch.no_grad()
    async def send_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None
    ) -> dict:
        if not self.is_master:
            for _name, _weight in weights:  # collective over the actor group: every rank walks it
                pass
            return {}
        peers: list[bytes] = []
        while len(peers) < self.num_receivers:  # each receiver says "ready" before anything is sent
            identity, _ready = self._recv(f"{len(peers)} of {self.num_receivers} receivers ready")
            peers.append(identity)
        count, size = 0, 0
        for name, weight in weights:
            tensor = weight.detach().to("cpu").contiguous()
            header = json.dumps(
                {"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
            )
            payload = tensor.view(-1).view(torch.uint8).numpy().tobytes()
            for peer in peers:
                self.socket.send_multipart([peer, header.encode(), payload], copy=False)
            count, size = count + 1, size + len(payload)
        for peer in peers:
            self.socket.send_multipart([peer, _END, b""])
        for done in range(len(peers)):  # wait until each receiver has read everything before finalize closes
            self._recv(f"{done} of {len(peers)} receivers done")
        logger.info("cpu_zmq: sent %d tensors (%.1f MB) to %d receivers", count, size / 2**20, len(peers))
        return {}

    def _recv(self, state: str) -> list[bytes]:
        import zmq

        if not self.socket.poll(timeout=TIMEOUT_MS, flags=zmq.POLLIN):
            raise TimeoutError(f"{BACKEND} sender at {self.address}: {state} after {TIMEOUT_MS / 1000:.0f}s")
        return self.socket.recv_multipart()

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        import zmq
        import zmq.asyncio

        if not self.address:
            raise RuntimeError("cpu_zmq: receive_weights before init_process_group gave the sender's address")
        context = zmq.asyncio.Context()
        socket = context.socket(zmq.DEALER)
        socket.connect(self.address)
        try:
            await socket.send(b"ready")
            while True:
                header, payload = await socket.recv_multipart()
                if header == _END:
                    break
                meta = json.loads(header)
                flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
                yield meta["name"], flat.view(getattr(torch, meta["dtype"])).reshape(meta["shape"])
            await socket.send(b"done")
        finally:
            socket.close(linger=1000)
            context.term()
