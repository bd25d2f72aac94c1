"""``resolve_model``: what a command's MODEL argument names, as a ``ModelSpec``.

A preset name (``bert``, ``gpt2-xl``, ``llama-7b`` ...) with shape overrides, or the path of the
user's own model file (``my_model.py``: ``autoslapo.models.user``; loading it executes it, which
only the processes that run or measure the model do), or a model file shipped in
``autoslapo.models.zoo`` by its name (``wideresnet-tiny``, ``wideresnet-50``, ``wideresnet-50-4``).
"""

from __future__ import annotations

from dataclasses import replace

from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.models.user import user_spec
from autoslapo.models.zoo import ZOO

__all__ = ["resolve_model"]


def resolve_model(arg: str, **overrides: int | None) -> ModelSpec:
    """The spec ``arg`` names: a ``.py`` model file, else a preset (with ``overrides`` applied).

    Raises: UsageError for an unknown preset (with the closest names), shape overrides given with a
    model file (its shape is its own), or a model file that breaks a rule (see ``autoslapo.models.user``).
    """
    if arg.endswith(".py"):
        given = sorted(k for k, v in overrides.items() if v is not None)
        if given:
            flags = " ".join("--" + k.replace("_", "-") for k in given)
            raise UsageError(f"shape flags do not apply to a model file (its shape is its own): got {flags} with "
                             f"{arg}; change the file instead")
        return user_spec(arg)
    if arg.lower() in ZOO:  # a model file shipped with autoslapo (WideResNet), under its preset name
        given = sorted(k for k, v in overrides.items() if v is not None)
        if given:
            raise UsageError(f"shape flags do not apply to {arg} (a model file's shape is its own): got "
                             f"{' '.join('--' + k.replace('_', '-') for k in given)}; drop them")
        spec = user_spec(ZOO[arg.lower()])
        return replace(spec, preset=arg.lower())
    return ModelSpec.from_name(arg, **overrides)
