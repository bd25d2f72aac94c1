"""The request bodies of ``POST /v1/studies`` and ``POST /v1/estimate`` as OpenAPI schemas.

The endpoints read their bodies themselves (``StudyRequest.from_json``, ``EstimateRequest.from_json``:
one-line errors, nothing stored on bad input), so FastAPI sees no body model. The schemas here are
built from the same tables those readers check (``STUDY_FIELDS``, ``ESTIMATE_FIELDS``, and the
dataclasses' defaults) and only describe the bodies in ``/openapi.json`` (``openapi_extra``): the
validation and its messages stay the readers'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}

DESCRIPTIONS = {
    "model": "a preset name (`autoslapo models`), {\"hf_config\": <a config.json object>}, or on a server started "
             "with --allow-module-files {\"module_file\": {\"name\": \"my_model.py\", \"source\": \"...\"}}",
    "gpus": "devices of the cluster",
    "gpu_type": "device preset, e.g. h100-80gb",
    "gpus_per_node": "devices a node (default 8)",
    "intra_node_gbps": "GB/s a device, one direction, within a node (default: the device preset's)",
    "inter_node_gbps": "GB/s a device, one direction, across nodes (default: the device preset's)",
    "backend": "sim (the cost model), ray (real trials on a Ray cluster), local where the server allows it",
    "trials": "the study's budget of launched trials (1-100000)",
    "sampler": "Optuna sampler; left out, a sim study scores every configuration",
    "name": "the study's name (default <model>-<gpus>x<gpu-type>-<backend>)",
    "space": "a search space as a --space file holds it: a JSON object or TOML text",
    "resume": "queue an ended study again, to trials",
    "join": "submit the study, follow it while queued or running (raising its budget to trials), or continue it",
    "global_batch": "samples a step (default: the model's)",
    "timeout_s": "stop the search after this many seconds",
    "patience": "stop after this many trials without a new best",
    "knobs": "pinned knobs, e.g. {\"tp\": 2, \"zero_stage\": 1}",
    "shape": "a preset's or a config's dimensions replaced, e.g. {\"hidden\": 2048, \"layers\": 12}",
    "cluster_from": "a study in this server's store: its cluster, with the calibration its measured trials fitted",
    "top": "list the n fastest schedules too",
}


def field_schema(kinds: tuple[type, ...], default: Any, nullable: bool) -> dict[str, Any]:
    """The JSON schema of one field that takes values of ``kinds`` (null too when ``nullable``)."""
    names = list(dict.fromkeys("number" if set(kinds) == {int, float} else _JSON_TYPES[k] for k in kinds))
    if nullable:
        names.append("null")
    schema: dict[str, Any] = {"type": names[0] if len(names) == 1 else names}
    if default is not dataclasses.MISSING and not callable(default):
        schema["default"] = default
    return schema


def body_schema(kinds: Mapping[str, tuple[type, ...]], request: type, required: Iterable[str],
                title: str, nullable: Iterable[str] | None = None) -> dict[str, Any]:
    """The object schema of a body whose fields take ``kinds`` with the defaults of the dataclass
    ``request``, null for the ``nullable`` fields (default: those whose default is None); no other
    field is allowed."""
    defaults = {f.name: f.default for f in dataclasses.fields(request)}
    takes_null = set(nullable) if nullable is not None else {k for k, v in defaults.items() if v is None}
    properties = {}
    for name, types in kinds.items():
        properties[name] = field_schema(types, defaults.get(name, dataclasses.MISSING), nullable=name in takes_null)
        if name in DESCRIPTIONS:
            properties[name]["description"] = DESCRIPTIONS[name]
    return {"title": title, "type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


def request_body(schema: dict[str, Any], example: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for an endpoint that reads a JSON body of ``schema``."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema,
                                                                              "example": example}}}}
