"""Opening an existing store for reading, shared by the library (``autoslapo.best``) and the CLI.

Reading never creates a database: a mistyped path must not leave an empty ``.db`` behind. The
store package (SQLAlchemy) is imported when a store is opened, not when this module is.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from autoslapo.errors import NoStore, UsageError

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.spec import ModelSpec
    from store import Store, StudyRecord, TrialRecord

__all__ = ["BASELINES_SUFFIX", "HEARTBEAT_S", "SILENT_AFTER_S", "StudyCluster", "baseline_rows", "baseline_study",
           "check_study_name", "is_baseline_study", "open_existing_store", "require_store", "silent_for", "silent_note", "study_cluster", "study_global_batch", "study_label", "trials_global_batch"]

#: The tuner scores a study's baselines in a companion study, ``<study>.baselines``: a name of its own.
BASELINES_SUFFIX = ".baselines"


def baseline_study(study: str) -> str:
    """The companion study the tuner stores ``study``'s baselines in."""
    return f"{study}{BASELINES_SUFFIX}"


def baseline_rows(store: Store, study: str) -> list[tuple[str, TrialRecord]]:
    """``(baseline kind, its row)`` for each baseline the tuner scored for ``study``, in the rows'
    order; empty when none were. A row both baselines picked (one configuration, which a study holds
    once) names them both in ``extra["baselines"]`` and is listed once for each; a row without a
    name is ``baseline <number>``."""
    companion = baseline_study(study)
    if not store.has_study(companion):
        return []
    out: list[tuple[str, TrialRecord]] = []
    for t in store.trials(companion):
        extra = t.result.get("extra") or {}
        kinds = extra.get("baselines") or [extra.get("baseline") or f"baseline {t.number}"]
        out.extend((str(kind), t) for kind in kinds)
    return out


def is_baseline_study(study: StudyRecord) -> bool:
    """True for the companion study in which the tuner stores a study's baselines (hidden from
    ``autoslapo studies`` and the service's lists unless asked)."""
    return study.space_name == "baselines" and study.name.endswith(BASELINES_SUFFIX)


def study_label(study: StudyRecord) -> str:
    """The study's model as tables and titles show it (``studies``, ``show``, ``best``, the report):
    a preset's or a model file's name, and for a config.json (named by its ``model_type`` alone) its
    size too: ``mistral 7.24B``, so that two configs of one type are told apart."""
    from autoslapo.models.spec import PRESETS, ModelSpec

    if study.model_name in PRESETS or study.model_family == "user":
        return study.model_name
    try:
        n = ModelSpec.from_dict(study.model).num_params()
        size = next(f"{n / scale:.3g}{unit}" for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, ""))
                    if n >= scale or scale == 1)
        return f"{study.model_name} {size}"
    except Exception:  # a model this autoslapo cannot read back (an older store's): its name as stored
        return study.model_name


#: A tuner marks the study it runs alive this often (``tuner.heartbeat``) ...
HEARTBEAT_S = 30.0
#: ... so a ``running`` study not marked for this long has lost its tuner (killed, or its machine).
SILENT_AFTER_S = 150.0


def silent_for(status: str, updated_at: datetime, now: datetime | None = None) -> float | None:
    """Seconds since a ``running`` study's tuner last marked it alive, when that is over
    ``SILENT_AFTER_S`` (its tuner is gone: ``tune --resume`` takes it over); None otherwise."""
    if status != "running":
        return None
    age = ((now or datetime.now(UTC)) - updated_at).total_seconds()
    return age if age > SILENT_AFTER_S else None


def silent_note(seconds: float | None) -> str:
    """`` (no tuner for 12 min)``: what a status cell adds for a silent running study; "" if alive."""
    if seconds is None:
        return ""
    return f" (no tuner for {seconds / 60:.0f} min)" if seconds < 5400 else f" (no tuner for {seconds / 3600:.0f} h)"


#: What a new study may be called (the CLI's ``--study`` and the service's ``name``).
# not "." or "..": a URL path would not reach it; not "-x": a command line would read it as a flag
STUDY_NAME_RULE = re.compile(r"(?!\.+$)(?!-)[A-Za-z0-9._-]{1,100}")


def check_study_name(name: Any) -> str:
    """A new study's name as given; UsageError naming the rule otherwise."""
    if not isinstance(name, str) or STUDY_NAME_RULE.fullmatch(name) is None:
        raise UsageError(f"study names are 1-100 of A-Z a-z 0-9 . _ - (not dots alone, not a leading -): got "
                         f"{repr(name)[:60]}; "
                         "pick a name like bert-8x")
    return name


#: A study run with these backends measured real trials on autoslapo's own runtime.
REAL_BACKENDS = ("local", "ray")


class StudyCluster(NamedTuple):
    """A stored study's cluster, its cluster's calibration (None when none is stored yet) and whether
    the study ran real trials (``local``, ``ray``): then what it measured, and the calibration they
    fitted, are of autoslapo's own runtime, not of the published stack a GPU preset describes."""

    cluster: ClusterSpec
    calibration: dict[str, Any] | None
    real_trials: bool

    def runtime_limits(self, model: ModelSpec) -> dict[str, Any]:
        """``cost.answer.calibrated_ranking``'s ``refusal`` and ``precisions`` for an estimate of
        ``model`` on this cluster: autoslapo's runtime's (``runtime.check.runtime_limits``) when the
        study's trials were real, none (the published stack of the device preset) otherwise."""
        if not self.real_trials:
            return {}
        from autoslapo.runtime.check import runtime_limits  # the runtime imports torch: only when needed

        return runtime_limits(model, self.cluster.gpu_type)


def open_existing_store(url: str | None, *, read_only: bool = False) -> Store | None:
    """Open the store at ``url``; None when it is a SQLite file that does not exist yet, or (``read_only``)
    one that holds no tables at all: both read as no studies, and are left as they are. ``read_only``:
    for a command that only reads (``open_store``'s: never writes, and reads a store in a read-only
    directory).

    ``url`` None means ``$AUTOSLAPO_STORAGE``, else ``sqlite:///autoslapo.db`` here.
    Raises UsageError for in-memory SQLite, StorageError for a bad URL or a file that is not a database.
    """
    from store import check_sqlite_file, open_store, parse_url, resolve_url, sqlite_path

    resolved = resolve_url(url)
    parsed = parse_url(resolved)
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(parsed)
        if path is None:
            raise UsageError(
                "result commands need a file or server store: got in-memory SQLite; "
                "pass --storage sqlite:///file.db"
            )
        if not check_sqlite_file(path):
            return None
    try:
        return open_store(resolved, read_only=read_only)
    except NoStore:  # a SQLite database without a single table: nothing stored yet, as a missing file
        return None


def require_store(url: str | None, *, read_only: bool = False) -> Store:
    """Like ``open_existing_store`` but a missing SQLite file is an error (exit 2) saying what to do."""
    store = open_existing_store(url, read_only=read_only)
    if store is None:
        from store import resolve_url

        raise UsageError(
            f"no store at {resolve_url(url)}: the file does not exist (or holds no tables); run `autoslapo tune` first "
            "or point --storage (or $AUTOSLAPO_STORAGE) at an existing store"
        )
    return store


def config_global_batch(config: Mapping[str, Any]) -> int:
    """The sequences a step of a trial's ``config``: micro_batch x grad_accum x dp (a knob it lacks
    counts 1), as ``ScheduleConfig.global_batch``."""
    return int(config.get("micro_batch", 1)) * int(config.get("grad_accum", 1)) * int(config.get("dp", 1))


def trials_global_batch(configs: Iterable[Mapping[str, Any]]) -> int | None:
    """The global batch a study's trials ran at (``config_global_batch``; ``tune`` fixes one for the
    whole study: its ``--global-batch``, else its space's default); the one most of them ran at should
    a resume have changed it (the earliest on a tie); None without trials."""
    counts = Counter(config_global_batch(c) for c in configs)
    return max(counts, key=counts.__getitem__) if counts else None


def study_global_batch(store: Store, study: str, model: ModelSpec) -> int | None:
    """The global batch ``study``'s trials ran at (``trials_global_batch``) when it
    tuned ``model``, shape included: what an estimate on its cluster answers at. None for another
    model's study, or one without trials yet."""
    if store.get_study(study).model_signature != model.signature():  # its batch is another model's
        return None
    return trials_global_batch(t.config for t in store.trials(study))


def study_cluster(store: Store, study: str, given: Mapping[str, Any],
                  name: Callable[[str], str]) -> StudyCluster:
    """The cluster of the stored ``study``, its cluster's calibration and whether its trials were real
    (``StudyCluster``): what ``estimate --cluster-from`` and ``POST /v1/estimate`` with ``cluster_from``
    estimate on.

    ``given``: cluster fields the caller was also given (``gpus``, ``gpu_type`` ...; None when not
    given), each of which must agree with the study's; ``name(field)`` is how the caller's user
    writes a field (``--gpus`` on the command line, ``gpus`` in a request).
    Raises: StorageError when there is no such study; UsageError naming a field that disagrees.
    """
    from autoslapo.cluster import ClusterSpec

    record = store.get_study(study)
    cluster = ClusterSpec.from_dict(record.cluster)
    for key, value in given.items():
        has = getattr(cluster, key)
        if value is not None and value != has:
            raise UsageError(f"{name('cluster_from')} {study} estimates on that study's cluster: got {name(key)} "
                             f"{json.dumps(value)}, the study has {json.dumps(has)}; leave {name(key)} out or "
                             "pick another study")
    return StudyCluster(cluster, store.calibration(record.cluster_fingerprint), record.backend in REAL_BACKENDS)
