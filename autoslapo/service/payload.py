"""The ``model`` field of a study request: a preset name, or a Hugging Face config sent as data.

``{"model": {"hf_config": {...}}}`` carries the object a ``config.json`` holds. It is read as data
by ``spec_from_hf_config`` (the same reader ``autoslapo tune CONFIG.json`` uses) and kept as sent
in the job's request, so the worker that runs the study, and any worker that takes it over after a
crash, builds the same spec. A config that the reader refuses is a one-line UsageError/ConfigError
before anything is stored. ``GET /v1/best?model=<signature>`` finds a config's studies by the
spec's signature (``model_signature``), which is what ``autoslapo best CONFIG.json --server``
and ``autoslapo.best(CONFIG.json, server=)`` send.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.hf import check_hf_spec, spec_from_hf_config
from autoslapo.models.spec import ModelSpec

PAYLOAD_KINDS = ("hf_config",)
ModelField = str | Mapping[str, Any]


def check_model_field(value: Any) -> None:
    """Refuse a ``model`` that is neither a preset name nor ``{"hf_config": {...}}`` (one-line UsageError)."""
    if isinstance(value, str):
        return
    if not isinstance(value, Mapping):
        raise UsageError(f"field 'model' must be a preset name or {{\"hf_config\": {{...}}}}: got "
                         f"{type(value).__name__}")
    if set(value) != {"hf_config"}:
        keys = ", ".join(sorted(map(str, value))) or "none"
        raise UsageError(f"field 'model' as an object takes exactly one key, one of {', '.join(PAYLOAD_KINDS)}: "
                         f"got {keys}; send {{\"hf_config\": <the config.json object>}}")
    if not isinstance(value["hf_config"], Mapping):
        raise UsageError(f"model.hf_config must be the JSON object of a config.json: got "
                         f"{type(value['hf_config']).__name__}")


def model_spec_of(value: ModelField) -> ModelSpec:
    """The spec a checked ``model`` field names; UsageError/ConfigError (one line) when it cannot be built."""
    if isinstance(value, str):
        return ModelSpec.from_name(value)
    check_model_field(value)
    try:
        spec = spec_from_hf_config(value["hf_config"])
        check_hf_spec(spec)
    except (TypeError, ValueError, KeyError, AttributeError) as err:  # a value of the wrong kind in the config
        raise ConfigError(f"model.hf_config cannot be read: {type(err).__name__}: {err}; send the config.json "
                          "as transformers writes it") from None
    return spec


def model_label(value: Any) -> str:
    """How a job's ``model`` field is shown before its study exists: the preset, or the config's model_type."""
    if isinstance(value, Mapping) and isinstance(value.get("hf_config"), Mapping):
        return f"{value['hf_config'].get('model_type')} (config)"
    return str(value)
