"""The tuner: an Optuna sampler picks configurations, an evaluator (or Ray Tune) runs them, the
store remembers every trial. ``tune(TuneOptions(...), store)`` runs or resumes a study.
"""

from __future__ import annotations

from tuner.evaluators import (
    BACKENDS,
    Evaluator,
    LocalEvaluator,
    PerturbedSimEvaluator,
    ReplayEvaluator,
    SimEvaluator,
    cost_prior,
    make_evaluator,
)
from tuner.proposer import SAMPLERS, Prediction, Proposal, Proposer
from tuner.study import Progress, StudyRunner, TuneOptions, TuneOutcome, default_study_name, tune

__all__ = [
    "BACKENDS", "SAMPLERS", "Evaluator", "LocalEvaluator", "PerturbedSimEvaluator", "Prediction",
    "Progress", "Proposal", "Proposer", "ReplayEvaluator", "SimEvaluator", "StudyRunner", "TuneOptions",
    "TuneOutcome", "cost_prior", "default_study_name", "make_evaluator", "tune",
]
