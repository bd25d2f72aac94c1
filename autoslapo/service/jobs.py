"""What a client may ask the service to tune: a study request, checked as data before anything is stored.

``StudyRequest.from_json`` refuses unknown fields, wrong types and impossible values (one-line
UsageError); ``to_options`` builds the same ``TuneOptions`` that ``autoslapo tune`` builds.
An inline ``space`` (what a ``--space`` file holds, as a JSON object or TOML text) is parsed as
data by the code that reads space files and kept, normalised, in the job's request, so the worker
that runs the study, and any worker that takes it over after a crash, searches the same space.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from autoslapo.cluster import DEFAULT_GPU_TYPE, LINKS, ClusterSpec, link_overrides
from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.service.modfile import TRACE_TIMEOUT_S
from autoslapo.service.payload import ModelField, check_model_field, is_module_file, model_spec_of
from autoslapo.service.schemas import body_schema, request_body
from autoslapo.storage import BASELINES_SUFFIX, check_study_name
from search_spaces import SearchSpace, space_for, space_from_dict
from tuner import TuneOptions, default_study_name
from tuner.options import check_patience

SERVICE_BACKENDS = ("sim", "ray")
SPACE_SOURCE = "the request's space"


check_name = check_study_name  # a study name as the service accepts it (the CLI's rule for new studies)

#: The JSON types each field of ``POST /v1/studies``'s body takes (``StudyRequest.from_json`` checks them).
STUDY_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (str, dict), "gpu_type": (str,), "backend": (str,), "sampler": (str,), "name": (str,),
    "gpus": (int,), "gpus_per_node": (int,), "intra_node_gbps": (int, float), "inter_node_gbps": (int, float),
    "trials": (int,), "seed": (int,), "global_batch": (int,),
    "patience": (int,), "timeout_s": (int, float), "baselines": (bool,), "space": (dict, str),
    "resume": (bool,), "join": (bool,),
}
#: The fields a body must give.
STUDY_REQUIRED = ("model", "gpus")


@dataclass(frozen=True)
class StudyRequest:
    """The body of ``POST /v1/studies``."""

    model: ModelField  # a preset name, {"hf_config": {...}} or {"module_file": {...}} (autoslapo.service.payload)
    gpus: int
    gpu_type: str = DEFAULT_GPU_TYPE
    gpus_per_node: int | None = None
    intra_node_gbps: float | None = None  # None: the device preset's links (``autoslapo.cluster.LINKS``)
    inter_node_gbps: float | None = None
    backend: str = "sim"
    trials: int = 100
    sampler: str | None = None  # None: a sim study scores every configuration, real trials use tpe
    seed: int = 0
    global_batch: int | None = None
    timeout_s: float | None = None
    patience: int | None = None
    baselines: bool = True
    name: str | None = None
    space: Mapping[str, Any] | None = None  # None: the family's space; else a space description (data)
    resume: bool = False  # continue study ``name`` to ``trials`` (its space kept unless one is given)
    join: bool = False  # submit study ``name``, or follow it when it runs, or continue it when it ended short

    @classmethod
    def from_json(cls, doc: Any, *, allow_local: bool = False, allow_module_files: bool = False,
                  module_timeout_s: float = TRACE_TIMEOUT_S) -> StudyRequest:
        """Check a decoded JSON body field by field; raises UsageError (one line) on the first problem
        (ModuleFilesOff for a module file unless ``allow_module_files``; its trace, in a child
        process, may take ``module_timeout_s``)."""
        if not isinstance(doc, dict):
            raise UsageError(f"the body must be a JSON object: got {type(doc).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise UsageError(f"unknown field {unknown[0]!r}: the fields are {', '.join(known)}")
        for key in STUDY_REQUIRED:
            if key not in doc:
                raise UsageError(f"field {key!r} is required: e.g. {{\"model\": \"bert\", \"gpus\": 8}}")
        for key, value in doc.items():
            want = " or ".join(k.__name__ for k in STUDY_FIELDS[key])
            if value is None and key in ("model", "gpus"):
                raise UsageError(f"field {key!r} must be {want}, not null: got null; it is required, e.g. "
                                 "{\"model\": \"bert\", \"gpus\": 8}")
            if value is None:
                if known[key].default is None:
                    continue  # null is this field's default (none/unset): the same as leaving it out
                nullable = ", ".join(f.name for f in fields(cls) if f.default is None)
                raise UsageError(f"field {key!r} must be {want}, not null: got null; leave it out for its default "
                                 f"({json.dumps(known[key].default)}) (null means the default only in {nullable})")
            ok = isinstance(value, STUDY_FIELDS[key]) and (STUDY_FIELDS[key] == (bool,) or not isinstance(value, bool))
            if not ok:
                raise UsageError(f"field {key!r} must be {want}: got {json_repr(value)}")
        check_model_field(doc["model"], allow_module_files=allow_module_files)
        if is_module_file(doc["model"]):
            model_spec_of(doc["model"], timeout_s=module_timeout_s)  # traced once here; kept by digest
        if isinstance(doc.get("space"), str):
            doc = {**doc, "space": parse_space_text(doc["space"])}
        if doc.get("space") is not None:  # normalised: what the job keeps is what every worker rebuilds
            doc = {**doc, "space": space_from_dict(doc["space"], source=SPACE_SOURCE).to_dict()}
        request = cls(**doc)
        request.check(allow_local=allow_local)
        return request

    def check(self, *, allow_local: bool = False) -> None:
        """Raise UsageError when the request could not run (unknown model, bad cluster or budget)."""
        backends = (*SERVICE_BACKENDS, "local") if allow_local else SERVICE_BACKENDS
        if self.backend not in backends:
            raise UsageError(f"backend must be one of {', '.join(backends)} on this server: got {self.backend!r}")
        if self.join and self.resume:
            raise UsageError("join and resume exclude each other: join already continues a study that ended "
                             "short of trials; send one of them")
        if self.name is not None:
            check_name(self.name)
            check_not_baselines(self.name)
        elif self.resume:
            raise UsageError("resume continues a study: name it, e.g. {\"name\": \"svc\", \"resume\": true}")
        elif self.join:
            raise UsageError("join shares a study: name it, e.g. {\"name\": \"svc\", \"join\": true}")
        if not 1 <= self.trials <= 100_000:
            raise UsageError(f"trials must be 1 to 100000: got {self.trials}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:  # 0 would mean the default in cluster_spec
            raise UsageError(f"gpus_per_node must be a positive integer: got {self.gpus_per_node}")
        check_patience(self.patience, self.backend == "sim" and not self.sampler, fields=True)  # as tune refuses it
        options = self.to_options(name=self.name or "check")
        space = options.space or space_for(options.model.family)
        space.bind(options.model, options.cluster, options.global_batch, None)

    def search_space(self) -> SearchSpace | None:
        """The inline space of this request (None: the model family's); ConfigError if it is bad."""
        return None if self.space is None else space_from_dict(self.space, source=SPACE_SOURCE)

    def model_spec(self) -> ModelSpec:
        """The model this request names: a preset, or the spec of the config it carries."""
        return model_spec_of(self.model)

    def cluster_spec(self) -> ClusterSpec:
        """The described cluster (8 devices a node unless ``gpus_per_node``; the preset's links unless given)."""
        links = link_overrides({key: getattr(self, key) for key in LINKS}, lambda key: key)
        return ClusterSpec(gpus=self.gpus, gpu_type=self.gpu_type, gpus_per_node=self.gpus_per_node or 8).with_links(links)

    def default_name(self) -> str:
        """``<model>-<gpus>x<gpu-type>-<backend>``, the name ``autoslapo tune`` would give."""
        return default_study_name(self.model_spec(), self.cluster_spec(), self.backend)

    def to_options(self, *, name: str, resume: bool = False) -> TuneOptions:
        """The ``TuneOptions`` of this request for study ``name`` (``resume``: continue it)."""
        return TuneOptions(
            model=self.model_spec(), cluster=self.cluster_spec(), backend=self.backend, trials=self.trials,
            timeout_s=self.timeout_s, patience=self.patience, sampler=self.sampler or "tpe", seed=self.seed,
            sweep=False if self.sampler else None,  # an explicit sampler samples, on sim too (as the CLI)
            global_batch=self.global_batch, study=name, resume=resume, baselines=self.baselines,
            space=self.search_space(),
            dispatch="ray" if self.backend == "ray" else "inline",
        )

    def to_dict(self) -> dict[str, Any]:
        """The request as JSON-safe data (what the job row keeps)."""
        return asdict(self)


def study_body() -> dict[str, Any]:
    """``openapi_extra`` of ``POST /v1/studies``: its body's schema, from ``STUDY_FIELDS``."""
    schema = body_schema(STUDY_FIELDS, StudyRequest, STUDY_REQUIRED, "StudyRequest")
    return request_body(schema, {"model": "bert", "gpus": 8, "trials": 20, "name": "bert-8"})


def check_not_baselines(name: str) -> None:
    """Refuse a name ending in ``.baselines``: the tuner keeps a study's baselines in that companion
    study, so the tuner would refuse the job (as ``autoslapo tune`` refuses it up front)."""
    if name.endswith(BASELINES_SUFFIX):
        base = name.removesuffix(BASELINES_SUFFIX)
        fix = (f"tune, resume or join {base!r} instead" if base
               else f"pick a name that does not end in {BASELINES_SUFFIX!r}")
        raise UsageError(f"study names ending in {BASELINES_SUFFIX!r} are the tuner's own (a study's baselines): "
                         f"got {name!r}; {fix}")


def parse_space_text(text: str) -> dict[str, Any]:
    """A space given as the text of a TOML space file, parsed as data; ConfigError naming the line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        first = (str(err).splitlines() or ["?"])[0]
        raise ConfigError(f"field 'space' as text must be a TOML space file: {first}; or send a JSON object") from None


def json_repr(value: Any) -> str:
    """A short, one-line rendering of a client's value for an error message."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."
