"""The SGLang patch applied through Ray, by the managers' own code, to an actor that *is* verl's ``SGLangHttpServer``
(run in ``.cache/sglang-venv`` by ``tests/integration/sglang/test_sglang_hook.py``; engine scripted, see
``tests/sglang/cases.py``).

The actor is named as verl's ``SGLangReplica.launch_servers`` names it (``sglang_server_{replica}_{node}``) in a Ray
cluster this module starts (``address="local"``, its own temp dir, shut down after). The manager's
``find_replicas`` finds it by that name for ``rollout.name=sglang`` and reads its address through its own
``get_server_address``; ``patch_replicas`` applies the patch with ``actor.__ray_call__`` while it serves and logs the
report the vLLM path gives. Before the patch the server loses the history (the control); after it the same request
gets the model's own tokens, and the report names the actor, its pid and node, SGLang's version and verl's
``rollout.max_model_len``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.sglang.cases import MAX_MODEL_LEN, model_dir
from tests.support.conversations import TERMINATOR, piecewise

REPO = Path(__file__).resolve().parents[2]
ACTOR = "sglang_server_0_0"
RUN_KEY: list = []  # the run's rollout key, published before the actor starts, as the recipe's driver does


@pytest.fixture(scope="module")
def ray_actor():
    import ray

    from tests.sglang.server import CPUSGLangHttpServer

    tmp = tempfile.mkdtemp(prefix="ngv-sglang-ray-")
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # what recipe.nemo_gym.main adds for rollout.name=sglang: verl's SGLang server and client with the run's key
        "VERL_USE_EXTERNAL_MODULES": "nemo_gym_adapter.sglang.verl_client",
    }
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=tmp, runtime_env={"env_vars": env})
    from nemo_gym_adapter.access import key as access_key

    RUN_KEY[:] = [access_key.generate()]
    access_key.publish(RUN_KEY[0])
    try:
        actor = ray.remote(CPUSGLangHttpServer).options(name=ACTOR).remote("qwen25", str(model_dir("qwen25")), 1024)
        ray.get(actor.launch_server.remote(), timeout=600)
        yield actor
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _post(address: str, path: str, body: dict):
    import httpx

    headers = RUN_KEY[0].header  # the replica answers only the run's key (issue 27; the last case)
    return httpx.post(f"http://{address}{path}", json={"model": "tiny-qwen25", **body}, headers=headers, timeout=120)


def test_the_managers_patch_reaches_verls_sglang_server_actor_through_ray(ray_actor, caplog):
    import ray
    from transformers import AutoTokenizer

    from recipe.nemo_gym.servers.engines import ENGINES
    from recipe.nemo_gym.servers.replicas import find_replicas, patch_replicas

    engine = ENGINES["sglang"]
    endpoints, handles = find_replicas(None, engine)  # no balancer: the actors' own addresses
    assert list(handles) == [ACTOR] and [ep.actor for ep in endpoints] == [ACTOR]
    address = endpoints[0].address
    assert endpoints[0].host == "127.0.0.1"

    tok = AutoTokenizer.from_pretrained(str(model_dir("qwen25")))
    first = [{"role": "user", "content": "What is the weather? Skinny answers please."}]
    prompt = _post(address, "/tokenize", {"messages": first}).json()["tokens"]
    generation = piecewise(tok, "Skinny weather in Paris") + [tok.convert_tokens_to_ids(TERMINATOR["qwen25"])]
    assistant = {"role": "assistant", "content": "Skinny weather in Paris"}
    messages = [*first, {**assistant, "prompt_token_ids": prompt, "generation_token_ids": generation}]
    messages.append({"role": "user", "content": "And Oslo?"})
    history = prompt + generation
    body = {"messages": messages, "max_tokens": 8, "logprobs": True, "top_logprobs": 0, "return_token_ids": True}

    stock = _post(address, "/v1/chat/completions", body)
    assert stock.status_code == 200, stock.text
    assert "prompt_token_ids" not in stock.json()
    stock_prompt = ray.get(ray_actor.scheduler_calls.remote())[-1]
    assert stock_prompt[: len(history)] != history  # the control: SGLang re-rendered the history

    with caplog.at_level(logging.INFO, logger="recipe.nemo_gym.servers.replicas"):
        (report,) = patch_replicas(handles, engine, "keep_ids")
    assert (report.backend, report.version, report.actor) == ("sglang", "0.5.12", ACTOR)
    assert report.pid == ray.get(ray_actor.__ray_call__.remote(lambda self: os.getpid()))
    assert report.pid != os.getpid() and report.node_ip and report.max_model_len == MAX_MODEL_LEN
    assert not report.already_patched and patch_replicas(handles, engine)[0].already_patched
    logged = [r.getMessage() for r in caplog.records if "token-ID patch in" in r.getMessage()]
    assert logged == [
        f"token-ID patch in {ACTOR} (pid {report.pid} on {report.node_ip}): {report.hook}, SGLang 0.5.12"
    ], logged

    patched = _post(address, "/v1/chat/completions", body)
    assert patched.status_code == 200, patched.text
    engine_prompt = ray.get(ray_actor.scheduler_calls.remote())[-1]
    assert engine_prompt[: len(history)] == history
    assert patched.json()["prompt_token_ids"] == engine_prompt
    assert patched.json()["choices"][0]["token_ids"] == ray.get(ray_actor.scheduler_outputs.remote())[-1]
    assert engine.aborted_turns(handles) == 0  # the manager's abort metric reads the actor


def test_the_managers_access_guard_and_verls_own_sglang_client_with_the_run_key(ray_actor):
    """The run's rollout key on verl's SGLang server through Ray (issue 27): the server was guarded at launch
    (``nemo_gym_adapter.sglang.verl_client`` wraps verl's ``launch_server`` in the actor, from the key published in
    Ray's KV), the manager's ``guard_replicas`` finds it in place and proves every request without the key gets a 401;
    verl's own HTTP client of SGLang (``AsyncHttpServerAdapter``, what its ServerAdapter uses for weight sync) is
    refused too -- the control -- until the same module gives it the key."""
    import asyncio

    import aiohttp
    import httpx
    from verl.workers.rollout.sglang_rollout.http_server_engine import AsyncHttpServerAdapter

    from recipe.nemo_gym.servers.engines import ENGINES
    from recipe.nemo_gym.servers.replicas import find_replicas, guard_replicas

    (key,) = RUN_KEY
    endpoints, handles = find_replicas(None, ENGINES["sglang"])
    (report,) = guard_replicas(handles, endpoints, key)  # raises unless a request without the key gets 401
    assert report.actor == ACTOR and report.keys == 1 and report.already_installed  # guarded since its launch
    address = endpoints[0].address
    for path in ("/health", "/metrics", "/v1/models", "/flush_cache", "/update_weights_from_tensor"):
        assert httpx.post(f"http://{address}{path}", timeout=60).status_code == 401, path
    assert httpx.get(f"http://{address}/health", headers=key.header, timeout=60).status_code == 200

    host, port = address.rsplit(":", 1)
    adapter = AsyncHttpServerAdapter(
        model_path=str(model_dir("qwen25")), host=host, port=int(port), launch_server=False, device="cpu"
    )
    with pytest.raises(aiohttp.ClientResponseError) as refused:  # verl's client sends no key of its own
        asyncio.run(adapter._make_async_request("v1/models", method="GET"))
    assert refused.value.status == 401
    from nemo_gym_adapter.sglang import verl_client

    verl_client.install()  # what VERL_USE_EXTERNAL_MODULES does in verl's workers (importing it installs)
    models = asyncio.run(adapter._make_async_request("v1/models", method="GET"))
    assert models["data"][0]["id"] == "tiny-qwen25"
    assert adapter._make_request("v1/models", method="GET")["data"][0]["id"] == "tiny-qwen25"  # the sync path too
