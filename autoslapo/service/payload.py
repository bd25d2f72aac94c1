"""The ``model`` field of a request: a preset name, a Hugging Face config sent as data, or a model file.

``{"model": {"hf_config": {...}}}`` carries the object a ``config.json`` holds. It is read as data
by ``spec_from_hf_config`` (the same reader ``autoslapo tune CONFIG.json`` uses) and kept as sent
in the job's request, so the worker that runs the study, and any worker that takes it over after a
crash, builds the same spec. A config that the reader refuses is a one-line UsageError/ConfigError
before anything is stored. ``GET /v1/best?model=<signature>`` finds a config's studies by the
spec's signature (``model_signature``), which is what ``autoslapo best CONFIG.json --server``
and ``autoslapo.best(CONFIG.json, server=)`` send.

``{"model": {"module_file": {"name": "my_model.py", "source": "..."}}}`` is the user's own model
file (``autoslapo.service.modfile``): code, so it is refused (``ModuleFilesOff``) unless the server
allows module files, and its spec is built by a trace in a child process, never in this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.hf import check_hf_spec, spec_from_hf_config
from autoslapo.models.spec import ModelSpec
from autoslapo.service.modfile import (
    ALLOW_FLAG,
    MODULE_FILE,
    TRACE_TIMEOUT_S,
    ModuleFile,
    ModuleFilesOff,
    module_spec,
)

PAYLOAD_KINDS = ("hf_config", MODULE_FILE)
ModelField = str | Mapping[str, Any]


def check_model_field(value: Any, *, allow_module_files: bool = False) -> None:
    """Refuse a ``model`` that is neither a preset name, ``{"hf_config": {...}}`` nor (when allowed)
    ``{"module_file": {"name", "source"}}``: one-line UsageError; ModuleFilesOff for a module file
    when ``allow_module_files`` is off."""
    if isinstance(value, str):
        return
    if not isinstance(value, Mapping):
        raise UsageError(f"field 'model' must be a preset name or {{\"hf_config\": {{...}}}}: got "
                         f"{type(value).__name__}")
    if len(value) != 1 or next(iter(value)) not in PAYLOAD_KINDS:
        keys = ", ".join(sorted(map(str, value))) or "none"
        raise UsageError(f"field 'model' as an object takes exactly one key, one of {', '.join(PAYLOAD_KINDS)}: "
                         f"got {keys}; send {{\"hf_config\": <the config.json object>}}")
    if MODULE_FILE in value:
        if not allow_module_files:
            raise ModuleFilesOff(f"this server takes no model files (.py: code): start it with `autoslapo serve "
                                 f"{ALLOW_FLAG}` to accept them, or send a preset or a config.json")
        ModuleFile.from_json(value[MODULE_FILE])
        return
    if not isinstance(value["hf_config"], Mapping):
        raise UsageError(f"model.hf_config must be the JSON object of a config.json: got "
                         f"{type(value['hf_config']).__name__}")


def model_spec_of(value: ModelField, *, timeout_s: float = TRACE_TIMEOUT_S) -> ModelSpec:
    """The spec a checked ``model`` field names; UsageError/ConfigError (one line) when it cannot be built.

    A module file is traced in a child process (at most ``timeout_s``; kept by digest after that).
    """
    if isinstance(value, str):
        return ModelSpec.from_name(value)
    if isinstance(value, Mapping) and MODULE_FILE in value:
        return module_spec(ModuleFile.from_json(value[MODULE_FILE]), timeout_s)
    check_model_field(value)
    try:
        spec = spec_from_hf_config(value["hf_config"])
        check_hf_spec(spec)
    except (TypeError, ValueError, KeyError, AttributeError) as err:  # a value of the wrong kind in the config
        raise ConfigError(f"model.hf_config cannot be read: {type(err).__name__}: {err}; send the config.json "
                          "as transformers writes it") from None
    return spec


def is_module_file(value: Any) -> bool:
    """Whether a ``model`` field carries a module file (code: only for servers and workers that allow it)."""
    return isinstance(value, Mapping) and MODULE_FILE in value


def model_label(value: Any) -> str:
    """How a job's ``model`` field is shown before its study exists: the preset, or the config's model_type."""
    if isinstance(value, Mapping) and isinstance(value.get("hf_config"), Mapping):
        return f"{value['hf_config'].get('model_type')} (config)"
    if isinstance(value, Mapping) and isinstance(value.get(MODULE_FILE), Mapping):
        return f"{str(value[MODULE_FILE].get('name', '?')).removesuffix('.py')} (module file)"
    return str(value)
