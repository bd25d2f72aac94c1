"""The training runtime: launch rank processes, train a scheduled model on them, measure a trial.

Public: :func:`run_trial` (one configuration -> TrialResult), :func:`check_runnable` (what the
engines cannot run together, checked before any process starts), :func:`launch` (rank processes
with a timeout, a memory cap and clean-up). Importing this package imports no torch.
"""

from __future__ import annotations

from autoslapo.runtime.check import check_runnable, resolve_device
from autoslapo.runtime.launcher import LaunchOutcome, launch
from autoslapo.runtime.trial import run_trial, summarize_steps

__all__ = ["LaunchOutcome", "check_runnable", "launch", "resolve_device", "run_trial", "summarize_steps"]
