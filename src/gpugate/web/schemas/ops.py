"""The operational routes' bodies: liveness, readiness, the models list."""

from __future__ import annotations

from typing import Literal

from gpugate.web.schemas.common import View


class Health(View):
    status: Literal["ok"]
    version: str


class Check(View):
    name: str
    ok: bool
    detail: str


class Readiness(View):
    ready: bool
    checks: list[Check]


class ModelEntry(View):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(View):
    """The models with at least one endpoint in rotation, in OpenAI's list shape."""

    object: Literal["list"]
    data: list[ModelEntry]
