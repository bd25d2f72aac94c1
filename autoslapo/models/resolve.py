"""What a command's MODEL argument names: a preset, a Hugging Face ``config.json``, or a model file.

``resolve_model`` is the one entry every command that takes a model uses (tune, run, estimate,
verify, best, the library's ``best``/``apply_best``). A path ending in ``.json`` is read as a
Hugging Face config (``autoslapo.models.hf``): the spec records the config's contents, never its
path, so the same config anywhere is the same study. A path ending in ``.py`` is the user's own
model file (``autoslapo.models.user``; loading it executes it, which only the processes that run or
measure the model do). Anything else is a preset name.

Pure: no torch or transformers import.
"""

from __future__ import annotations

import json
from pathlib import Path

from autoslapo.errors import AutoslapoError, UsageError
from autoslapo.models.hf import check_hf_spec, spec_from_hf_config
from autoslapo.models.spec import ModelSpec
from autoslapo.models.user import user_spec

__all__ = ["is_model_file", "read_hf_config", "resolve_model"]


def is_model_file(arg: str) -> bool:
    """True when ``arg`` names a model file (``*.json`` or ``*.py``) rather than a preset."""
    return arg.lower().endswith((".json", ".py"))


def _read_config(path: Path) -> dict[str, object]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"model file {str(path)!r} does not exist; give the path of a config.json or a preset "
            "name (`autoslapo models`)"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"cannot read model file {str(path)!r}: {exc.strerror}; check its permissions"
        ) from None
    except UnicodeDecodeError as exc:  # JSON is UTF-8 text (RFC 8259)
        raise UsageError(
            f"model file {str(path)!r} is not JSON (not UTF-8 text: byte {exc.start}); give a Hugging Face config.json"
        ) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"model file {str(path)!r} is not JSON (line {exc.lineno}: {exc.msg}); give a "
            "Hugging Face config.json"
        ) from None
    if not isinstance(config, dict):
        raise UsageError(
            f"model file {str(path)!r} must hold a JSON object (a Hugging Face config): got "
            f"{type(config).__name__}"
        )
    return config


def resolve_model(arg: str, **overrides: int | None) -> ModelSpec:
    """The ``ModelSpec`` a command's MODEL argument names, with shape overrides applied.

    Takes: a preset name (``bert``, ``llama-7b`` ...), the path of a Hugging Face config.json, or of
    the user's own model file (``.py``; no shape overrides: its shape is its own);
    shape overrides as for ``ModelSpec.with_overrides`` (``None`` values are ignored).
    Returns: the spec (a config's spec is named after its ``model_type``).
    Raises: UsageError for an unknown preset, a missing or unreadable file, or an unsupported
    ``model_type`` (naming the supported ones); ConfigError for a shape the family cannot take.
    """
    if not is_model_file(arg):
        if Path(arg).is_dir():
            fix = (f"give its config.json, {str(Path(arg) / 'config.json')!r}" if (Path(arg) / "config.json").is_file()
                   else "give a preset's name or a file's path")
            raise UsageError(f"a model must be a preset, a config.json or a model file (.py): {arg!r} is a directory; "
                             f"{fix}")
        if arg.count("/") == 1 and not Path(arg).exists() and "." not in arg.split("/")[-1][:1]:
            raise UsageError(f"a model must be a preset, a config.json or a model file (.py): {arg!r} looks like a "
                             "Hugging Face Hub id, which autoslapo does not download; save the model's config.json "
                             "and give its path")
        return ModelSpec.from_name(arg, **overrides)
    if arg.lower().endswith(".py"):
        given = sorted(k for k, v in overrides.items() if v is not None)
        if given:
            flags = " ".join("--" + k.replace("_", "-") for k in given)
            raise UsageError(f"shape flags do not apply to a model file (its shape is its own): got {flags} with "
                             f"{arg}; change the file instead")
        try:
            return user_spec(arg)
        except (AutoslapoError, MemoryError):
            raise
        except Exception as exc:  # the file's own code failed: said in one line, as the service says it
            first = (str(exc).strip().splitlines() or [""])[0]
            raise UsageError(f"the model file {Path(arg).name} cannot be used: {type(exc).__name__}: {first}; its "
                             "build() and batch() must run on the meta device") from None
    spec = spec_from_hf_config(_read_config(Path(arg))).with_overrides(**overrides)
    check_hf_spec(spec)
    return spec


def read_hf_config(path: str) -> dict[str, object]:
    """The JSON object of the Hugging Face config.json at ``path`` (what ``--server`` sends as data).

    Raises: UsageError for a missing or unreadable file, or one that is not a JSON object.
    """
    return _read_config(Path(path))
