"""Study requests as data: the inline search space is parsed by the space-file code, kept, and reused."""

from __future__ import annotations

import dataclasses
import time

import pytest

from autoslapo.errors import UsageError
from autoslapo.service import Worker
from autoslapo.service.jobs import StudyRequest
from search_spaces import get_space, space_from_dict
from store import Store
from tuner import tune

SPACE = {"name": "small", "version": "7", "knobs": {"tp": [1, 2], "pp": [1], "micro_batch": [1, 2, 4],
                                                    "ckpt_ratio": [0.0, 1.0]},
         "fixed": {"zero_stage": 1, "attn_kernel": "sdpa"}}
BASE = {"model": "bert", "gpus": 8, "backend": "sim", "sampler": "tpe", "baselines": False}


def test_an_inline_space_is_checked_normalised_and_used() -> None:
    request = StudyRequest.from_json({**BASE, "space": SPACE})
    assert request.space == space_from_dict(SPACE).to_dict()  # what the job row keeps
    options = request.to_options(name="s")
    assert options.space == space_from_dict(SPACE)
    assert StudyRequest(**request.to_dict()).to_options(name="s", resume=True).space == options.space
    assert StudyRequest.from_json(BASE).to_options(name="s").space is None  # the family's space


def test_a_space_as_toml_text_is_read_as_data() -> None:
    text = 'name = "t"\n[knobs]\ntp = [1, 2]\n[fixed]\nzero_stage = 2\n'
    request = StudyRequest.from_json({**BASE, "space": text})
    assert request.space == space_from_dict({"name": "t", "knobs": {"tp": [1, 2]}, "fixed": {"zero_stage": 2}}).to_dict()


@pytest.mark.parametrize(("space", "words"), [
    ({"knobs": {"tp": [1]}}, "needs a name"),
    ({"name": "x", "knobs": {"colour": [1]}}, "unknown knob 'colour'"),
    ({"name": "x", "knobs": {"dp": [1, 2]}}, "derived"),
    ({"name": "x", "knobs": {"tp": [3]}}, "no value of tp in 'x' can run bert-large on 8 a100-80gb"),
    ({"name": "x", "knobs": {"tp": ["2"]}}, "tp must be a positive integer: got '2'"),
    ({"name": "x", "fixed": {"zero_stage": 9}}, "zero_stage"),
    ({"name": "x", "knobs": {"tp": [1], "zero_stage": [0]}, "fixed": {"zero_stage": 1}}, "either searched or fixed"),
    ({"name": "x", "import": "os"}, "unknown key 'import'"),
    ("name = ", "TOML"),
    ([1, 2], "dict or str"),
])
def test_a_bad_space_is_one_line_naming_the_problem(space: object, words: str) -> None:
    with pytest.raises(UsageError, match=words) as err:
        StudyRequest.from_json({**BASE, "space": space})
    assert "\n" not in str(err.value)


def test_a_worker_that_takes_a_job_over_searches_its_space(service_store: Store) -> None:
    request = StudyRequest.from_json({**BASE, "trials": 6, "name": "inline", "space": SPACE})
    service_store.jobs.submit("inline", request.to_dict())
    ghost = service_store.jobs.claim("ghost", 0.3)  # a worker that ran three trials, then died
    assert ghost is not None
    first = dataclasses.replace(StudyRequest(**ghost.request).to_options(name="inline"), trials=3)
    tune(first, service_store)
    time.sleep(0.5)  # its lease lapses
    said: list[str] = []  # what the worker logs (it logged only "waiting for jobs")
    assert Worker(service_store, lease_s=5, poll_s=0.1, log=said.append).run(once=True) == 1
    assert said == ["claimed study 'inline': 6 trials of sim, attempt 2 (taken over from a worker that stopped)",
                    "study 'inline': complete"], said
    job = service_store.jobs.get("inline")
    assert job is not None and job.status == "complete" and job.attempts == 2
    study = service_store.get_study("inline")
    assert (study.space_name, study.space_version) == ("small", "7")
    launched = [t for t in service_store.trials("inline") if t.status != "pruned"]
    assert len(launched) == 6 and len({t.config_hash for t in launched}) == 6
    for t in launched:
        assert (t.config["zero_stage"], t.config["attn_kernel"], t.config["pp"]) == (1, "sdpa", 1)
        assert t.config["tp"] in (1, 2) and t.config["micro_batch"] in (1, 2, 4)
    assert get_space("bert").fixed != SPACE["fixed"]  # the family's space would have searched these


def test_a_submitted_study_resumed_locally_goes_on_over_its_inline_space(service_store: Store) -> None:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.spec import ModelSpec
    from tuner import TuneOptions

    request = StudyRequest.from_json({**BASE, "trials": 3, "name": "sent", "space": SPACE})
    service_store.jobs.submit("sent", request.to_dict())
    assert Worker(service_store, lease_s=5, poll_s=0.1).run(once=True) == 1
    # `autoslapo tune bert --gpus 8 --study sent --resume --trials 6` on a machine with the same store
    again = TuneOptions(model=ModelSpec.from_name("bert"), cluster=ClusterSpec(gpus=8), backend="sim",
                        trials=6, study="sent", resume=True, sampler="tpe", baselines=False)
    before = len(service_store.trials("sent"))
    tune(again, service_store)
    study = service_store.get_study("sent")
    assert (study.space_name, study.space_version) == ("small", "7")
    launched = [t for t in service_store.trials("sent") if t.status != "pruned"]
    assert len(service_store.trials("sent")) > before
    for t in launched:
        assert (t.config["zero_stage"], t.config["attn_kernel"], t.config["pp"]) == (1, "sdpa", 1)
        assert t.config["tp"] in (1, 2) and t.config["micro_batch"] in (1, 2, 4)
