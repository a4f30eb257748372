"""verl 0.9.1's ``SGLangHttpServer`` serving SGLang 0.5.12's app on CPU, only the model forward scripted.

Test support of the SGLang cases (run in ``.cache/sglang-venv``; importing this module imports verl's SGLang server
and SGLang). :class:`CPUSGLangHttpServer` subclasses verl's ``SGLangHttpServer`` and changes only what a CPU machine
needs around verl's own ``__init__`` and ``launch_server`` (ServerArgs from verl's rollout config,
``Engine._launch_subprocesses``, ``set_global_state``, ``app.is_single_tokenizer_mode``, ``run_uvicorn`` on a free
port):

* ``Engine._launch_subprocesses`` is :func:`tests.sglang.engine.launch_in_process` (scheduler scripted, detokenizer in
  a thread);
* the HTTP server binds loopback (verl binds the Ray node's IP);
* ``engine_kwargs.sglang`` carries ``device: cpu`` (SGLang's ServerArgs refuses to pick a device without an
  accelerator), the context length and the parsers; ``skip_tokenizer_init=False`` (verl's default True leaves SGLang
  without a tokenizer, and its chat endpoint answers 500).

Used in-process on a background event loop (the hook cases) and as a Ray actor named like verl's
(``sglang_server_{replica}_{node}``, the Ray case); either way the instance *is* verl's server class.
"""

from __future__ import annotations

import functools
from typing import Any

from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer

TOOL_PARSER = {"qwen25": "qwen", "qwen3": "qwen", "llama3": "llama3"}  # SGLang's names (qwen25 is deprecated)
REASONING_PARSER = {"qwen3": "qwen3"}


def rollout_config(family: str, max_model_len: int, **sglang_kwargs: Any) -> Any:
    """verl's RolloutConfig for ``rollout.name=sglang`` with what a CPU launch needs in ``engine_kwargs.sglang``."""
    from verl.workers.config import RolloutConfig

    engine = {
        "device": "cpu",
        "context_length": max_model_len,
        "tool_call_parser": TOOL_PARSER[family],
        "served_model_name": f"tiny-{family}",
        **({"reasoning_parser": REASONING_PARSER[family]} if family in REASONING_PARSER else {}),
        **sglang_kwargs,
    }
    return RolloutConfig(
        name="sglang",
        mode="async",
        max_model_len=max_model_len,
        prompt_length=max_model_len // 2,
        response_length=max_model_len // 4,
        skip_tokenizer_init=False,  # verl defaults it to True: SGLang then has no tokenizer and its chat API 500s
        engine_kwargs={"sglang": engine},
    )


class CPUSGLangHttpServer(SGLangHttpServer):
    """verl's SGLang server with the engine scripted and loopback HTTP; everything else is verl's own code."""

    def __init__(self, family: str, model_path: str, max_model_len: int, host: str = "127.0.0.1", **kw: Any):
        import ray
        from verl.workers.config import HFModelConfig
        from verl.workers.rollout.replica import RolloutMode

        self.family = family
        original_ip = ray.util.get_node_ip_address
        ray.util.get_node_ip_address = lambda *a, **k: host  # verl binds the Ray node IP; tests stay on loopback
        try:
            super().__init__(
                config=rollout_config(family, max_model_len, **kw),
                model_config=HFModelConfig(path=model_path),
                rollout_mode=RolloutMode.STANDALONE,
                workers=[],
                replica_rank=0,
                node_rank=0,
                nnodes=1,
                cuda_visible_devices="",
                base_gpu_id=0,
            )
        finally:
            ray.util.get_node_ip_address = original_ip

    async def launch_server(self, master_address: str | None = None, master_port: int | None = None):
        from sglang.srt.entrypoints import http_server

        from tests.sglang.engine import launch_in_process

        launch = functools.partial(launch_in_process, family=self.family)
        http_server.Engine._launch_subprocesses = staticmethod(launch)
        await super().launch_server(master_address, master_port)

    # Test hooks (also reached through Ray in the actor case).
    def set_script(self, script: list, finish_abort: bool = False) -> None:
        """What the scripted model answers next (``engine.ScriptedScheduler.script``)."""
        scheduler = self.scheduler
        scheduler.script, scheduler.finish_abort = list(script), finish_abort

    def scheduler_calls(self) -> list[list[int]]:
        """The prompt ids of every request the engine received, in order."""
        return [c.input_ids for c in self.scheduler.calls]

    def scheduler_outputs(self) -> list[list[int]]:
        """The output ids of every request the engine finished, in order."""
        return [list(o) for o in self.scheduler.outputs]

    @property
    def scheduler(self) -> Any:
        from tests.sglang.engine import LAUNCHED

        return next(x.scheduler for x in LAUNCHED if x.tokenizer_manager is self.tokenizer_manager)
