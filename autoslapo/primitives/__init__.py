"""Built-in primitives, registered on :class:`autoslapo.schedule.Schedule` by explicit import.

Each module below calls :func:`autoslapo.schedule.register_primitive` at import time; importing this
package is what makes ``sch.shard(...)``, ``sch.checkpoint()``, ... available.
"""

from __future__ import annotations

from autoslapo.primitives import annotate as annotate
from autoslapo.primitives import checkpoint as checkpoint
from autoslapo.primitives import fuse as fuse
from autoslapo.primitives import kernel as kernel
from autoslapo.primitives import loss as loss
from autoslapo.primitives import pipeline as pipeline
from autoslapo.primitives import replace as replace
from autoslapo.primitives import rng as rng
from autoslapo.primitives import tp as tp
from autoslapo.primitives import trace as trace
