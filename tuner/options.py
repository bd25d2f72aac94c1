"""A study's options (``TuneOptions``, checked when built) and its progress snapshots (``Progress``).

Kept apart from ``tuner/study.py`` (which re-exports them) so the study's loop stays one module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoslapo.cluster import ClusterSpec
from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from search_spaces import SearchSpace
from tuner.proposer import SAMPLERS


def check_timeout(timeout_s: float | None) -> None:
    """UsageError unless ``--timeout`` is unset or positive, finite seconds (nan and inf: no limit at all)."""
    if timeout_s is not None and not 0 < timeout_s < math.inf:
        raise UsageError(f"--timeout must be positive, finite seconds: got {timeout_s!r}; leave it out for none")


def check_patience(patience: int | None, sweeping: bool, *, fields: bool = False) -> None:
    """UsageError when ``patience`` is set for a sweep: patience counts trials without a new best, and
    a sweep (sim without a sampler) scores every configuration, in no trial order to be patient over.
    ``fields``: name the service's JSON fields rather than ``tune``'s flags."""
    if patience is None or not sweeping:
        return
    if fields:
        raise UsageError(f"patience stops a sampled search after that many trials without a new best: got patience "
                         f"{patience} with backend sim and no sampler, which scores every configuration; send "
                         "a sampler (e.g. \"sampler\": \"tpe\") or leave patience out")
    raise UsageError(f"--patience stops a sampled search after K trials without a new best: got --patience "
                     f"{patience} with --backend sim and no --sampler, which scores every "
                     "configuration (a sweep); pass --sampler tpe to sample trials, or drop --patience")


@dataclass(frozen=True)
class TuneOptions:
    """Everything one ``autoslapo tune`` needs (the CLI builds it; tests build it directly)."""

    model: ModelSpec
    cluster: ClusterSpec
    backend: str = "sim"
    trials: int = 100
    timeout_s: float | None = None
    patience: int | None = None
    sampler: str = "tpe"
    seed: int = 0
    global_batch: int | None = None
    space: SearchSpace | None = None
    study: str | None = None
    resume: bool = False
    join: bool = False  # create the study or join it: several tuners share one study and budget
    warm_start: bool = True
    prior_seeds: int | None = None  # how many of the cost model's best predictions go first
    dispatch: str = "inline"  # "inline" or "ray"
    ray_address: str | None = None
    max_concurrent: int = 1
    steps: int = 4
    trial_timeout_s: float = 300.0
    baselines: bool = True
    repeats: int = 0  # interleaved re-measurements of the finalists and baselines (real trials only)
    mirror: bool = True  # also record finished trials in an Optuna study in the store's database
    mirror_every: int = 25  # finished trials between two mirror writes
    # refit the cluster's cost-model correction after each trial (None: only when trials are real)
    learn_prior: bool | None = None
    # A study that learns measures the corrected prior's best unmeasured configuration after every
    # ``learned_every``-th trial (0: never; the sampler proposes the others).
    learned_every: int = 2
    sweep: bool | None = None  # score every configuration (None: when the evaluator is the plain cost model)

    def __post_init__(self) -> None:
        if not isinstance(self.trials, int) or self.trials < 1:
            raise UsageError(f"--trials must be a positive integer: got {self.trials!r}")
        check_timeout(self.timeout_s)
        if self.patience is not None and self.patience < 1:
            raise UsageError(f"--patience must be a positive number of trials: got {self.patience!r}")
        if self.sampler not in SAMPLERS:
            raise UsageError(f"--sampler must be one of {', '.join(SAMPLERS)}: got {self.sampler!r}")
        if self.dispatch not in ("inline", "ray"):
            raise UsageError(f"dispatch must be inline or ray: got {self.dispatch!r}")
        if self.max_concurrent < 1:
            raise UsageError(f"--max-concurrent must be a positive integer: got {self.max_concurrent!r}")
        if self.join and self.resume:
            raise UsageError("--join and --resume exclude each other: --join shares a study with tuners still "
                             "running, --resume takes over a stopped one; pass one of them")
        if self.join and not self.study:
            raise UsageError("--join needs --study NAME: the study the tuners share")
        from autoslapo.runtime.check import check_seed

        check_seed(self.seed, "the samplers' random state")
        if self.steps < 1:
            raise UsageError(f"--steps must be a positive integer: got {self.steps!r}")
        if not isinstance(self.learned_every, int) or self.learned_every < 0:
            raise UsageError(f"learned_every must be 0 (never) or a positive number of trials: "
                             f"got {self.learned_every!r}")
        if not isinstance(self.repeats, int) or self.repeats < 0:
            raise UsageError(f"--repeats must be a whole number of re-measurements, 0 or more: got {self.repeats!r}")
        if self.sweep not in (None, True, False):
            raise UsageError(f"sweep must be true, false or unset (auto): got {self.sweep!r}")
        if not 0 < self.trial_timeout_s < math.inf:
            raise UsageError(f"--trial-timeout must be positive, finite seconds: got {self.trial_timeout_s!r}")


@dataclass
class Progress:
    """A snapshot for the live progress bar."""

    launched: int
    budget: int
    best: float
    counts: dict[str, int]
    last: str = ""
    #: a phase's own progress (ranking or sweeping the space): ``done`` of ``of`` configurations
    done: int | None = None
    of: int | None = None
