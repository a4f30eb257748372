"""toy_latency: a NeMo Gym resources server whose tool calls take time, as sandboxed tools, judges and remote APIs do.

A look-up-then-submit task: ``lookup_code(word)`` answers the word's code, ``submit_code(code)`` hands in an answer;
the verifier gives reward 1 when the last ``submit_code`` call of the rollout named the row's ``expected_code``. Every
tool call waits ``tool_latency_s`` seconds (the server config's key; ``asyncio.sleep``, so calls of many rollouts wait
side by side, as independent sandboxes would) before it answers. With ``tool_latency_s: 0`` it answers at once.

Runs in Gym's venv like Gym's own servers (``gym_servers/README.md``); the trainer never imports it.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from pydantic import BaseModel, Field


class ToyLatencyResourcesServerConfig(BaseResourcesServerConfig):
    tool_latency_s: float = Field(0.0, ge=0.0, description="seconds every tool call waits before it answers")


def word_code(word: str) -> int:
    """The code ``lookup_code`` answers for ``word`` (what the rows' ``expected_code`` holds)."""
    return sum(map(ord, word)) % 1000


class LookupCodeRequest(BaseModel):
    word: str


class LookupCodeResponse(BaseModel):
    word: str
    code: int


class SubmitCodeRequest(BaseModel):
    code: int


class SubmitCodeResponse(BaseModel):
    received: int


class ToyLatencyRunRequest(BaseRunRequest):
    word: str
    expected_code: int


class ToyLatencyVerifyRequest(ToyLatencyRunRequest, BaseVerifyRequest):
    pass


class ToyLatencyVerifyResponse(BaseVerifyResponse):
    submitted_code: int | None
    looked_up: bool
    tool_calls: int


def last_submission(output: list) -> int | None:
    """The code of the last ``submit_code`` call in a rollout's output items (None: no valid submission)."""
    for item in reversed(output):
        if getattr(item, "type", None) == "function_call" and getattr(item, "name", None) == "submit_code":
            try:
                code = json.loads(item.arguments).get("code")
            except (ValueError, AttributeError):
                return None
            return code if isinstance(code, int) and not isinstance(code, bool) else None
    return None


class ToyLatencyResourcesServer(SimpleResourcesServer):
    ray_enabled = False
    config: ToyLatencyResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/lookup_code")(self.lookup_code)
        app.post("/submit_code")(self.submit_code)
        return app

    async def _wait(self) -> None:
        if self.config.tool_latency_s > 0:
            await asyncio.sleep(self.config.tool_latency_s)

    async def lookup_code(self, body: LookupCodeRequest) -> LookupCodeResponse:
        await self._wait()
        return LookupCodeResponse(word=body.word, code=word_code(body.word))

    async def submit_code(self, body: SubmitCodeRequest) -> SubmitCodeResponse:
        await self._wait()
        return SubmitCodeResponse(received=body.code)

    async def verify(self, body: ToyLatencyVerifyRequest) -> ToyLatencyVerifyResponse:
        calls = [item for item in body.response.output if getattr(item, "type", None) == "function_call"]
        submitted = last_submission(body.response.output)
        return ToyLatencyVerifyResponse(
            **body.model_dump(),
            reward=float(submitted == body.expected_code),
            submitted_code=submitted,
            looked_up=any(c.name == "lookup_code" for c in calls),
            tool_calls=len(calls),
        )


if __name__ == "__main__":
    ToyLatencyResourcesServer.run_webserver()
