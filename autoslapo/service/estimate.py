"""``/v1/estimate``: the cost model's best schedule for a model on a described cluster (no devices).

``GET /v1/estimate?model=&gpus=`` takes a preset name, or the model signature of a study in the
store (its spec is read from the study: nothing is executed). ``POST /v1/estimate`` takes a JSON
body whose ``model`` is what ``POST /v1/studies`` takes: a preset, ``{"hf_config": {...}}`` or, on
a server started with ``--allow-module-files``, ``{"module_file": {...}}`` (traced in a child
process, as for a study), and optionally pins: ``knobs`` (``{"tp": 2, "zero_stage": 1, ...}``, checked
by the knob declarations as ``autoslapo estimate``'s flags are), ``shape`` (``{"hidden": 2048, ...}``, a
preset's or a config's overrides), ``allow_cross_node_tp``, ``top`` (list the n fastest too) and ``cluster_from`` (a study in the
server's store: its cluster, with the calibration its measured trials fitted, and for the model it
tuned the global batch its trials ran at unless ``global_batch`` is sent). Both answer the
document ``autoslapo estimate --json`` prints (``autoslapo.cost.answer``), with ``model`` the model's
name, ``model_spec`` its shape, and ``gpus`` and ``gpu_type``: what ``autoslapo estimate --server``
reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from autoslapo.cluster import DEFAULT_GPU_TYPE, LINKS, ClusterSpec, link_overrides
from autoslapo.config import KNOB
from autoslapo.cost.answer import calibrated_ranking, estimate_batch, estimate_document, study_batch_named
from autoslapo.errors import UsageError
from autoslapo.models.hf import check_hf_spec
from autoslapo.models.spec import ModelSpec
from autoslapo.service.bodies import read_json
from autoslapo.service.jobs import json_repr
from autoslapo.service.modfile import TRACE_TIMEOUT_S
from autoslapo.service.payload import ModelField, check_model_field, is_module_file, model_spec_of
from autoslapo.service.schemas import body_schema, request_body
from autoslapo.storage import StudyCluster, study_cluster, study_global_batch
from store import Store

SIGNATURE = re.compile(r"[0-9a-f]{16}")  # ModelSpec.signature()
ESTIMATE_FIELDS: dict[str, tuple[type, ...]] = {"model": (str, dict), "gpus": (int,), "gpu_type": (str,),
                                                "gpus_per_node": (int,), "global_batch": (int,),
                                                "knobs": (dict,), "shape": (dict,), "cluster_from": (str,),
                                                "allow_cross_node_tp": (bool,), "top": (int,),
                                                "intra_node_gbps": (int, float), "inter_node_gbps": (int, float)}
ESTIMATE_REQUIRED = ("model",)


@dataclass(frozen=True)
class EstimateRequest:
    """The body of ``POST /v1/estimate``."""

    model: ModelField
    gpus: int | None = None
    gpu_type: str | None = None
    gpus_per_node: int | None = None
    global_batch: int | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    shape: dict[str, int] = field(default_factory=dict)
    cluster_from: str | None = None
    allow_cross_node_tp: bool = False
    top: int = 1
    intra_node_gbps: float | None = None  # None: the device preset's links (``autoslapo.cluster.LINKS``)
    inter_node_gbps: float | None = None

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
        if any(doc.get(key) is None for key in ESTIMATE_REQUIRED):
            raise UsageError("field 'model' is required: e.g. {\"model\": \"bert\", \"gpus\": 8}")
        if doc.get("gpus") is None and doc.get("cluster_from") is None:
            raise UsageError("field 'gpus' is required (or 'cluster_from', a study whose cluster to use): e.g. "
                             "{\"model\": \"bert\", \"gpus\": 8}")
        doc = {k: v for k, v in doc.items() if v is not None}
        for key, value in doc.items():
            kinds = ESTIMATE_FIELDS[key]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                want = " or ".join("true/false" if k is bool else k.__name__ for k in kinds)
                raise UsageError(f"field {key!r} must be {want}: got {json_repr(value)}")
        for name, value in doc.get("knobs", {}).items():
            if name not in KNOB:
                raise UsageError(f"knobs: unknown knob {name!r}: the knobs are {', '.join(KNOB)}")
            KNOB[name].check(value, "field 'knobs'")
        if doc.get("global_batch") is not None and "grad_accum" in doc.get("knobs", {}):
            raise UsageError("'global_batch' and knobs.grad_accum both fix the batch: give one of them")
        for name, value in doc.get("shape", {}).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"shape.{name} must be a positive integer: got {json_repr(value)}")
        check_model_field(doc["model"], allow_module_files=allow_module_files)
        if doc.get("shape") and is_module_file(doc["model"]):
            raise UsageError(f"field 'shape' does not apply to a model file (its shape is its own): got "
                             f"{', '.join(doc['shape'])}; change the file instead")
        request = cls(**doc)
        if request.cluster_from is None:
            request.cluster_spec()  # a bad cluster is refused before a module file is traced
        spec = model_spec_of(request.model, timeout_s=module_timeout_s)
        if request.shape:
            spec = spec.with_overrides(**request.shape)
            if not isinstance(request.model, str):
                check_hf_spec(spec)
        return request, spec

    def cluster_spec(self) -> ClusterSpec:
        """The described cluster (``ClusterSpec.described``: the defaults ``autoslapo estimate`` uses)."""
        if self.gpus is None:
            raise UsageError("field 'gpus' is required unless 'cluster_from' names a study")
        return ClusterSpec.described(self.gpus, self.gpu_type, self.gpus_per_node,
                                     allow_cross_node_tp=self.allow_cross_node_tp, links=self._links())

    def _links(self) -> dict[str, float]:
        return link_overrides({key: getattr(self, key) for key in LINKS}, lambda key: key)

    def study_cluster(self, store: Store) -> StudyCluster:
        """``cluster_from``'s cluster, its stored calibration (None when it has none yet) and whether
        its trials were real (``StudyCluster``).

        Raises: UsageError when the study is missing, or when ``gpus``/``gpu_type``/``gpus_per_node``/
        ``allow_cross_node_tp`` or a link's bandwidth are given and differ from the study's."""
        if not store.has_study(str(self.cluster_from)):
            raise UsageError(f"cluster_from: no study named {self.cluster_from!r} in this server's store; "
                             "GET /v1/studies lists them")
        given = {"gpus": self.gpus, "gpu_type": self.gpu_type, "gpus_per_node": self.gpus_per_node,
                 "allow_cross_node_tp": self.allow_cross_node_tp or None, **self._links()}
        return study_cluster(store, str(self.cluster_from), given, lambda key: key)

    def answer(self, spec: ModelSpec, store: Store) -> dict[str, Any]:
        """The estimate of this request for ``spec`` (the model it names)."""
        calibration = None
        real_trials = False
        batch, batch_from = self.global_batch, None
        if self.cluster_from is not None:
            cluster, calibration, real_trials = self.study_cluster(store)
            batch, batch_from = estimate_batch(batch, study_global_batch(store, self.cluster_from, spec),
                                               self.knobs or {})  # the batch it tuned at, as `estimate --cluster-from`
        else:
            cluster = self.cluster_spec()
        with study_batch_named(batch, batch_from, self.cluster_from, "a 'global_batch' field"):
            return estimate_answer(spec, cluster, batch, knobs=self.knobs, calibration=calibration,
                                   study=self.cluster_from, top=self.top, real_trials=real_trials,
                                   global_batch_from=batch_from)


def estimate_answer(spec: ModelSpec, cluster: ClusterSpec, global_batch: int | None, *,
                    knobs: dict[str, Any] | None = None, calibration: dict[str, Any] | None = None,
                    study: str | None = None, top: int = 1, real_trials: bool = False,
                    global_batch_from: str | None = None) -> dict[str, Any]:
    """What both endpoints answer: ``autoslapo estimate --json``'s document for the cost model's best
    schedule (``knobs`` pinned, ``calibration`` applied; of autoslapo's runtime with ``real_trials``,
    ``calibrated_ranking``'s), with ``model`` the model's name, ``model_spec`` its shape, and the
    cluster's ``gpus`` and ``gpu_type``."""
    # a study of real trials ran on autoslapo's runtime: estimate that
    limits = StudyCluster(cluster, calibration, real_trials).runtime_limits(spec)
    ranked = calibrated_ranking(spec, cluster, calibration["params"] if calibration else None, top=top,
                                global_batch=global_batch, **limits, **(knobs or {}))
    doc = estimate_document(spec, cluster, ranked, calibration=calibration, study=study, pinned=knobs or {},
                            real_trials=real_trials, global_batch_from=global_batch_from)
    return {**doc, "model": spec.preset, "model_spec": doc["model"], "gpus": cluster.gpus,
            "gpu_type": cluster.gpu_type}


def estimate_body() -> dict[str, Any]:
    """``openapi_extra`` of ``POST /v1/estimate``: its body's schema, from ``ESTIMATE_FIELDS`` (a null
    field is left out, as if not sent; ``gpus`` is needed unless ``cluster_from`` is given)."""
    schema = body_schema(ESTIMATE_FIELDS, EstimateRequest, ESTIMATE_REQUIRED, "EstimateRequest",
                         nullable=set(ESTIMATE_FIELDS) - set(ESTIMATE_REQUIRED))
    return request_body(schema, {"model": "bert", "gpus": 8, "knobs": {"tp": 2}})


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
    def estimate(request: Request, model: str, gpus: int, gpu_type: str = DEFAULT_GPU_TYPE,
                 gpus_per_node: int | None = None, global_batch: int | None = None, top: int = 1,
                 intra_node_gbps: float | None = None, inter_node_gbps: float | None = None) -> dict[str, Any]:
        """The cost model's best schedule (or ``top`` best) for a preset (or a stored study's model signature),
        on the preset's links unless ``intra_node_gbps`` / ``inter_node_gbps`` are given."""
        caller(request, "read")
        asked = EstimateRequest(model=model, gpus=gpus, gpu_type=gpu_type, gpus_per_node=gpus_per_node,
                                intra_node_gbps=intra_node_gbps, inter_node_gbps=inter_node_gbps)
        return estimate_answer(spec_by_name(store, model), asked.cluster_spec(), global_batch, top=top)

    @router.post("/v1/estimate", openapi_extra=estimate_body())
    async def estimate_of(request: Request) -> dict[str, Any]:
        """Body ``{model, gpus, gpu_type, gpus_per_node, global_batch, knobs, shape, cluster_from,
        allow_cross_node_tp, top, intra_node_gbps, inter_node_gbps}``; ``model`` as in ``POST /v1/studies``."""
        await run_in_threadpool(caller, request, "read")
        doc = await read_json(request, max_body_bytes)
        if allow_module_files and isinstance(doc, dict) and is_module_file(doc.get("model")):
            await run_in_threadpool(caller, request, "submit")  # a module file is code the server runs
        def answer() -> dict[str, Any]:
            est, spec = EstimateRequest.from_json(doc, allow_module_files=allow_module_files,
                                                  module_timeout_s=module_timeout_s)
            return est.answer(spec, store)

        return await run_in_threadpool(answer)

    return router
