"""Ray Tune dispatch: the study's proposer is the Tune searcher; Ray places and runs the trials.

The only module that talks to Ray. ``run_with_ray`` joins ``--ray-address`` or starts a local
Ray (stopped again at the end), runs a ``tune.Tuner`` whose search algorithm asks the study's
Optuna proposer (so the cost-model filter, deduplication and store writes are the same as inline)
with ``max_concurrent_trials``, each trial reserving the devices it needs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from typing import TYPE_CHECKING, Any, Protocol

from autoslapo.config import ScheduleConfig
from autoslapo.errors import UsageError
from autoslapo.result import TrialResult

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from tuner.evaluators import Evaluator
    from tuner.proposer import Proposal
    from tuner.study import TuneOptions


class DispatchedStudy(Protocol):
    """What Ray dispatch drives: the study's options and evaluator, its proposals and its stop rule."""

    options: TuneOptions
    name: str
    evaluator: Evaluator
    launched: int

    def propose(self) -> tuple[Proposal, int] | None: ...

    def complete(self, proposal: Proposal, number: int, result: TrialResult) -> None: ...

    def should_stop(self, started: float) -> str | None: ...

_METRIC = "samples_per_s"
# Tune pickles its search algorithm into the experiment's state file; the study it drives (with
# its store connection) stays in this process, so the searcher pickles as a key into this table.
_RUNNERS: dict[int, tuple[DispatchedStudy, float]] = {}


def _trainable(params: dict[str, Any], evaluator: Evaluator) -> None:
    """One Ray trial: score the configuration and report the whole result as JSON."""
    import ray
    from ray import tune

    config = ScheduleConfig.from_dict(params["config"])
    result = evaluator.evaluate(config)
    node = ray.get_runtime_context().get_node_id()
    extra = {**result.extra, "ray_node_id": node}
    result = TrialResult.from_dict({**result.to_dict(), "host": result.host or socket.gethostname(),
                                    "extra": extra})
    tune.report({_METRIC: result.samples_per_s, "trial_result": json.dumps(result.to_dict())})


def _searcher(runner: DispatchedStudy, started: float) -> Any:
    from ray.tune.search import Searcher

    class StudySearcher(Searcher):  # type: ignore[misc]
        """Hands Ray the study's proposals; stores and tells each outcome.

        Holds only a key into ``_RUNNERS`` (module level, so the class pickles by reference).
        """

        def __init__(self, key: int) -> None:
            super().__init__(metric=_METRIC, mode="max")
            self.live: dict[str, tuple[Proposal, int]] = {}
            self.stop: str | None = None
            self.key = key

        def __getstate__(self) -> dict[str, Any]:
            return {"key": self.key, "_metric": self._metric, "_mode": self._mode}

        def __setstate__(self, state: dict[str, Any]) -> None:
            self.__dict__.update(state)
            self.live, self.stop = {}, None

        def save(self, checkpoint_path: str) -> None:
            """Nothing to save: the store is the study's memory (resume reads it)."""

        def restore(self, checkpoint_path: str) -> None:
            """Nothing to restore: see ``save``."""

        def suggest(self, trial_id: str) -> Any:  # a config dict, None (wait) or Searcher.FINISHED
            runner, started = _RUNNERS[self.key]
            in_flight = len(self.live)
            if runner.launched + in_flight >= runner.options.trials:
                return Searcher.FINISHED if in_flight == 0 else None
            why = runner.should_stop(started)
            if why is not None:
                self.stop = why
                return Searcher.FINISHED
            nxt = runner.propose()
            if nxt is None:
                self.stop = runner.should_stop(started) or "exhausted"
                return Searcher.FINISHED
            self.live[trial_id] = nxt
            return {"config": nxt[0].config.to_dict(), "number": nxt[1]}

        def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                              error: bool = False) -> None:
            if trial_id not in self.live:
                return
            runner, _ = _RUNNERS[self.key]
            proposal, number = self.live.pop(trial_id)
            if result and not error and "trial_result" in result:
                tr = TrialResult.from_dict(json.loads(result["trial_result"]))
            else:
                tr = TrialResult.failure("failed", "the Ray trial raised or was lost before reporting")
            runner.complete(proposal, number, tr)

    StudySearcher.__module__ = __name__
    StudySearcher.__qualname__ = "StudySearcher"
    globals()["StudySearcher"] = StudySearcher  # pickled by reference, not by value
    _RUNNERS[id(runner)] = (runner, started)
    return StudySearcher(id(runner))


def ranks_per_node(runner: DispatchedStudy) -> list[int] | None:
    """How a real trial's ranks split over machines (``gpus_per_node`` each), or None: one machine."""
    cluster = runner.options.cluster
    if runner.evaluator.instant or cluster.nodes < 2:
        return None
    return [cluster.gpus_per_node] * cluster.nodes


def check_local_devices(cluster: ClusterSpec) -> None:
    """UsageError when the Ray ``tune`` starts on this machine cannot place one real trial of ``cluster``:
    its trials were all pruned ("0 GPU(s) here") and the study ended complete with none launched."""
    if cluster.gpu_type == "cpu":
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < min(cluster.gpus, cluster.gpus_per_node):
        need = min(cluster.gpus, cluster.gpus_per_node)
        raise UsageError(f"real trials on the Ray started here run on this machine's CUDA devices: a trial of "
                         f"{cluster.gpus} x {cluster.gpu_type} needs {need}, it has {have}; join a GPU cluster "
                         "(--ray-address), use --gpu-type cpu, or --backend sim")


def shared_threads(ranks: int, concurrent: int, cores: int) -> int:
    """Threads a CPU rank takes when ``concurrent`` trials of ``ranks`` ranks share ``cores`` cores."""
    return max(1, cores // (ranks * concurrent))


def trial_resources(runner: DispatchedStudy) -> Any:
    """What one trial reserves: a CPU for an estimate; its ranks for a real trial.

    A real trial on one machine reserves its ranks there: that many CPUs on a CPU cluster, or that
    many GPUs plus a CPU. One spanning machines (``cluster.nodes > 1``) reserves a placement group:
    a CPU for the trial's driver, then one bundle a machine for its slice of the ranks
    (``autoslapo.runtime.multinode``), placed by Ray wherever those devices are free.
    """
    cluster = runner.options.cluster
    if runner.evaluator.instant:
        return {"cpu": 1}
    split = ranks_per_node(runner)
    if split is not None:
        from ray import tune

        from autoslapo.runtime.multinode import bundles_for

        device = "cpu" if cluster.gpu_type == "cpu" else "cuda"
        return tune.PlacementGroupFactory([{"CPU": 1.0}, *bundles_for(split, device)], strategy="PACK")
    if cluster.gpu_type == "cpu":
        return {"cpu": float(cluster.gpus)}
    return {"cpu": 1, "gpu": float(min(cluster.gpus, cluster.gpus_per_node))}


def _ray_logging_level() -> int:
    """Ray's own log lines (INFO, and warnings such as its token notice) stay out of autoslapo's
    output: errors only, unless ``AUTOSLAPO_DEBUG=1`` asks for Ray's default (INFO)."""
    return logging.INFO if os.environ.get("AUTOSLAPO_DEBUG") else logging.ERROR


def join_ray(address: str) -> None:
    """Connect this process to the Ray cluster at ``address`` (once; later calls do nothing).

    Raises UsageError, one line, when the cluster cannot be joined (nothing listening there, or a
    token it does not accept), before any study is created or changed.
    """
    import ray

    from autoslapo.redact import redact

    if ray.is_initialized():
        return
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "://" not in address:
        # Ray retries an address where nothing listens for minutes: find out in seconds.
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as err:
            raise UsageError(
                f"cannot join the Ray cluster at {address}: nothing answers there ({err.strerror or err}); "
                "check the address and that the cluster runs (`ray start --head` on its head node)"
            ) from None
    # Ray's C++ client logs each failed attempt on the stderr file descriptor: keep that aside and
    # say what matters in one line.
    with tempfile.TemporaryFile() as aside:
        saved = os.dup(2)
        os.dup2(aside.fileno(), 2)
        try:
            ray.init(address=address, log_to_driver=False, logging_level=_ray_logging_level())
            return
        except Exception as err:  # ConnectionError, AuthenticationError, RuntimeError: not joined
            detail = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        aside.seek(0)
        logged = aside.read().decode(errors="replace")
    if "InvalidAuthToken" in logged or "Unauthenticated" in logged:
        detail = "it refused this process's authentication token"
    raise UsageError(
        f"cannot join the Ray cluster at {address}: {redact(detail)}; check the address, that the cluster runs, "
        "and its token (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
    )


def run_with_ray(runner: DispatchedStudy, started: float) -> str:
    """Run the rest of ``runner``'s budget through Ray Tune; returns the stop reason."""

    # The legacy reporter honours verbose=0; the new one prints tables into the CLI's output.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Ray Tune's own SIGINT handler ends fit() quietly: a Ctrl-C then read as a study run to its end
    # (exit 0, "complete", the trial in flight left running). Without it, Ctrl-C raises here, and
    # tune() stops the study as it does for inline trials (its trials in flight marked interrupted).
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    import ray
    from ray import tune

    o = runner.options
    resources = trial_resources(runner)
    evaluator = runner.evaluator
    split = ranks_per_node(runner)
    if split is not None:
        from tuner.evaluators import LocalEvaluator

        if isinstance(evaluator, LocalEvaluator):  # its trials spread their ranks over the machines
            evaluator = dataclasses.replace(evaluator, options={**evaluator.options, "ranks_per_node": split})
    owned = not ray.is_initialized()
    if owned and not o.ray_address and o.max_concurrent > 1 and runner.options.cluster.gpu_type == "cpu":
        from tuner.evaluators import LocalEvaluator

        if isinstance(evaluator, LocalEvaluator) and "threads" not in evaluator.options:
            # concurrent CPU trials on this machine share its cores (each rank took all its share alone,
            # so two trials at once ran on twice the cores there are, and measured each other)
            share = shared_threads(runner.options.cluster.gpus, o.max_concurrent, os.cpu_count() or 1)
            evaluator = dataclasses.replace(evaluator, options={**evaluator.options, "threads": share})
    if owned:
        if o.ray_address:
            join_ray(o.ray_address)
        else:
            # Logical CPUs: enough for max_concurrent trials of this size, at least 2.
            need = resources["cpu"] if isinstance(resources, dict) else resources.required_resources.get("CPU", 1)
            cpus = max(2, int(o.max_concurrent * need))
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                     logging_level=_ray_logging_level())
    from autoslapo.runtime.launcher import sweep_stale_trial_dirs, trial_dirs

    before = trial_dirs()  # the scratch folders of launches this study did not start
    storage = tempfile.mkdtemp(prefix="autoslapo-ray-")
    try:
        searcher = _searcher(runner, started)
        remaining = o.trials - runner.launched
        time_left = None if o.timeout_s is None else max(1.0, o.timeout_s - (time.monotonic() - started))
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(_trainable, evaluator=evaluator), resources),
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=remaining,
                                        max_concurrent_trials=o.max_concurrent, time_budget_s=time_left,
                                        metric=_METRIC, mode="max"),
            run_config=tune.RunConfig(storage_path=storage, name=runner.name.replace("/", "_"), verbose=0),
        )
        tuner.fit()
        if searcher.stop:
            return str(searcher.stop)
        return runner.should_stop(started) or "exhausted"
    finally:
        _RUNNERS.pop(id(runner), None)
        shutil.rmtree(storage, ignore_errors=True)
        if owned:
            ray.shutdown()
            if o.ray_address is None:  # the trials ran here: what an actor killed mid-trial left behind
                sweep_stale_trial_dirs(wait_s=5.0, wait_for=trial_dirs() - before)
