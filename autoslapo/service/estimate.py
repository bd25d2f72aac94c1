"""``/v1/estimate``: the cost model's best schedule for a model on a described cluster (no devices).

``GET /v1/estimate?model=&gpus=`` takes a preset name, or the model signature of a study in the
store (its spec is read from the study: nothing is executed). ``POST /v1/estimate`` takes a JSON
body whose ``model`` is what ``POST /v1/studies`` takes: a preset, ``{"hf_config": {...}}`` or, on
a server started with ``--allow-module-files``, ``{"module_file": {...}}`` (traced in a child
process, as for a study). Both answer ``{model, gpus, gpu_type, fits, samples_per_s, ...}``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from autoslapo.cluster import ClusterSpec
from autoslapo.cost import best_config
from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.service.bodies import read_json
from autoslapo.service.jobs import json_repr
from autoslapo.service.modfile import TRACE_TIMEOUT_S
from autoslapo.service.payload import ModelField, check_model_field, is_module_file, model_spec_of
from store import Store

SIGNATURE = re.compile(r"[0-9a-f]{16}")  # ModelSpec.signature()
ESTIMATE_FIELDS: dict[str, tuple[type, ...]] = {"model": (str, dict), "gpus": (int,), "gpu_type": (str,),
                                                "gpus_per_node": (int,), "global_batch": (int,)}


@dataclass(frozen=True)
class EstimateRequest:
    """The body of ``POST /v1/estimate``."""

    model: ModelField
    gpus: int
    gpu_type: str = "a100-80gb"
    gpus_per_node: int = 8
    global_batch: int | None = None

    @classmethod
    def from_json(cls, doc: Any, *, allow_module_files: bool = False,
                  module_timeout_s: float = TRACE_TIMEOUT_S) -> tuple[EstimateRequest, ModelSpec]:
        """The checked request and its model's spec; one-line UsageError (ModuleFilesOff for a module
        file unless ``allow_module_files``) on the first problem."""
        if not isinstance(doc, dict):
            raise UsageError(f"the body must be a JSON object: got {type(doc).__name__}")
        unknown = sorted(set(doc) - set(ESTIMATE_FIELDS))
        if unknown:
            raise UsageError(f"unknown field {unknown[0]!r}: the fields are {', '.join(ESTIMATE_FIELDS)}")
        for key in ("model", "gpus"):
            if doc.get(key) is None:
                raise UsageError(f"field {key!r} is required: e.g. {{\"model\": \"bert\", \"gpus\": 8}}")
        doc = {k: v for k, v in doc.items() if v is not None}
        for key, value in doc.items():
            if not isinstance(value, ESTIMATE_FIELDS[key]) or isinstance(value, bool):
                want = " or ".join(k.__name__ for k in ESTIMATE_FIELDS[key])
                raise UsageError(f"field {key!r} must be {want}: got {json_repr(value)}")
        check_model_field(doc["model"], allow_module_files=allow_module_files)
        request = cls(**doc)
        request.cluster_spec()  # a bad cluster is refused before a module file is traced
        return request, model_spec_of(request.model, timeout_s=module_timeout_s)

    def cluster_spec(self) -> ClusterSpec:
        """The described cluster."""
        return ClusterSpec(gpus=self.gpus, gpu_type=self.gpu_type, gpus_per_node=self.gpus_per_node)


def estimate_answer(spec: ModelSpec, cluster: ClusterSpec, global_batch: int | None) -> dict[str, Any]:
    """What both endpoints answer: the model, the cluster and the cost model's best schedule."""
    return {"model": spec.preset, "gpus": cluster.gpus, "gpu_type": cluster.gpu_type,
            **best_config(spec, cluster, global_batch=global_batch).to_dict()}


def spec_by_name(store: Store, model: str) -> ModelSpec:
    """A preset, else the spec of a stored study whose model signature is ``model``.

    Raises: UsageError naming the presets when it is neither.
    """
    try:
        return ModelSpec.from_name(model)
    except UsageError:
        if SIGNATURE.fullmatch(model) is None:
            raise
    for study in store.list_studies():
        if study.model_signature == model:
            return ModelSpec.from_dict(study.model)
    raise UsageError(f"no study in the store has the model signature {model!r}: tune it first, or POST "
                     "/v1/estimate with the model itself")


def estimate_router(store: Store, caller: Callable[[Request, str], Any], *, allow_module_files: bool,
                    module_timeout_s: float, max_body_bytes: int) -> APIRouter:
    """The two endpoints; ``caller(request, role)`` checks the token (raising ApiError)."""
    router = APIRouter()

    @router.get("/v1/estimate")
    def estimate(request: Request, model: str, gpus: int, gpu_type: str = "a100-80gb",
                 gpus_per_node: int = 8, global_batch: int | None = None) -> dict[str, Any]:
        """The cost model's best schedule for a preset (or a stored study's model signature)."""
        caller(request, "read")
        cluster = ClusterSpec(gpus=gpus, gpu_type=gpu_type, gpus_per_node=gpus_per_node)
        return estimate_answer(spec_by_name(store, model), cluster, global_batch)

    @router.post("/v1/estimate")
    async def estimate_of(request: Request) -> dict[str, Any]:
        """Body ``{model, gpus, gpu_type, gpus_per_node, global_batch}``; ``model`` as in ``POST /v1/studies``."""
        await run_in_threadpool(caller, request, "read")
        doc = await read_json(request, max_body_bytes)
        if allow_module_files and isinstance(doc, dict) and is_module_file(doc.get("model")):
            await run_in_threadpool(caller, request, "submit")  # a module file is code the server runs
        def answer() -> dict[str, Any]:
            est, spec = EstimateRequest.from_json(doc, allow_module_files=allow_module_files,
                                                  module_timeout_s=module_timeout_s)
            return estimate_answer(spec, est.cluster_spec(), est.global_batch)

        return await run_in_threadpool(answer)

    return router
