"""The trajectory routes a harness uses besides the OpenAI ones: end an episode (with its reward or without),
give it up, read its branches; and ``/health``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from asyncrl.serve.openai_routes import Identify
from asyncrl.serve.service import CompletionService


class FinishBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reward: float | None = Field(default=None, allow_inf_nan=False)


class AbortBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=1024)


def trajectory_router(service: CompletionService, identify: Identify) -> APIRouter:
    router = APIRouter()

    @router.post("/trajectories/{trajectory_id}/finish")
    async def finish(trajectory_id: str, body: FinishBody, request: Request) -> dict[str, Any]:
        identify(request)
        trajectory = await service.finish(trajectory_id, body.reward)
        return {"trajectory_id": trajectory_id, "state": trajectory.state.value, "reward": trajectory.reward}

    @router.post("/trajectories/{trajectory_id}/abort")
    async def abort(trajectory_id: str, body: AbortBody, request: Request) -> dict[str, Any]:
        identify(request)
        trajectory = await service.abort(trajectory_id, body.reason)
        return {"trajectory_id": trajectory_id, "state": trajectory.state.value}

    @router.get("/trajectories/{trajectory_id}")
    async def show(trajectory_id: str, request: Request) -> dict[str, Any]:
        identify(request)
        return {"branches": service.store.get(trajectory_id).export()}

    @router.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "trajectories": service.store.counts, "calls": dict(service.calls)}

    return router
