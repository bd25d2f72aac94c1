"""Model files shipped with autoslapo, resolved by name like a user's own file (``autoslapo.models.resolve``)."""

from __future__ import annotations

from pathlib import Path

#: name -> the model file in this folder that defines it.
ZOO: dict[str, Path] = {
    "wideresnet-tiny": Path(__file__).with_name("wideresnet_tiny.py"),
    "wideresnet-50": Path(__file__).with_name("wideresnet_50.py"),
    "wideresnet-50-4": Path(__file__).with_name("wideresnet_50_4.py"),
}
