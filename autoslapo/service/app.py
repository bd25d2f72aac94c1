"""The HTTP API: a thin FastAPI layer over the store, the tuner's request checks and the cost model.

Every answer that is not a success is ``{"error": "<one line>"}``; bad input never changes the
store. Submitting a study only writes a queued job: workers (``autoslapo worker``) run it.

The hot reads stay off the database and the GIL's queue: ``GET /v1/best`` and ``GET /v1/studies``
answer from an ``AnswerCache`` (at most ``answer_cache_s`` old, refreshed in the background) on
the event loop, with a token verified in the last ``token_cache_s`` seconds; everything else runs
in the thread pool as plain FastAPI sync endpoints.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.concurrency import run_in_threadpool

from autoslapo import api
from autoslapo.cluster import ClusterSpec
from autoslapo.errors import AutoslapoError, StorageError, UsageError
from autoslapo.models.modcache import max_age_days
from autoslapo.models.modcache import prune as prune_model_cache
from autoslapo.redact import redact
from autoslapo.service import apidocs, handlers, pages
from autoslapo.service.answers import FRESH_S, STALE_S, AnswerCache
from autoslapo.service.auth import CACHE_S, Caller, TokenCheck
from autoslapo.service.bodies import ApiError, known_query, one_line, read_json
from autoslapo.service.estimate import estimate_router
from autoslapo.service.events import study_events
from autoslapo.service.jobs import StudyRequest, check_name, study_body
from autoslapo.service.join import JoinPlan, JoinRefused, plan_join
from autoslapo.service.looplag import loop_lag_histogram, loop_lag_lifespan
from autoslapo.service.measure import Measure
from autoslapo.service.messages import best_missing
from autoslapo.service.modfile import TRACE_TIMEOUT_S, ModuleFilesOff, trace_memory_bytes
from autoslapo.service.resume import check_resume, resume_reached, shown_budget
from autoslapo.service.views import all_studies, apply_snippet, study_family, study_view, trial_view
from autoslapo.storage import config_global_batch
from store import RANK_METRICS, TRIAL_STATUSES, JobLimitError, Store

MAX_BODY_BYTES = 64 * 1024
EVENTS_POLL_S = 0.5
COOKIE = "autoslapo_token"
JOIN_TRIES = 3  # a join that loses a race to another write looks again; a third loss is a 409


@dataclass(frozen=True)
class ServiceSettings:
    """How the server answers: anonymous reads, the local backend, the request body limit, the
    events' polling interval, how many unfinished studies one token may have, how old an answer of
    ``GET /v1/best`` or ``GET /v1/studies`` may be (0: always read the store), how long a verified
    token is trusted before the store is asked again (so a revocation is seen within that time), and
    whether a model file (code) may be sent, with how long its trace (in a child process) may take."""

    allow_anonymous_read: bool = False
    allow_local: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    events_poll_s: float = EVENTS_POLL_S
    max_queued_per_token: int | None = None
    answer_cache_s: float = FRESH_S
    token_cache_s: float = CACHE_S
    allow_module_files: bool = False
    module_timeout_s: float = TRACE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 <= self.answer_cache_s <= STALE_S or self.token_cache_s < 0:
            raise UsageError(f"answer_cache_s must be 0-{STALE_S:g} and token_cache_s >= 0: got "
                             f"{self.answer_cache_s}, {self.token_cache_s}")
        if self.max_queued_per_token is not None and self.max_queued_per_token < 1:
            raise UsageError(f"--max-queued-per-token must be at least 1: got {self.max_queued_per_token}; "
                             "leave it out for no limit")
        if self.max_body_bytes < 1 or self.events_poll_s <= 0 or self.module_timeout_s <= 0:
            raise UsageError(f"max_body_bytes must be >= 1, events_poll_s and module_timeout_s > 0: got "
                             f"{self.max_body_bytes}, {self.events_poll_s}, {self.module_timeout_s}")
        if self.allow_module_files:
            trace_memory_bytes()  # a bad $AUTOSLAPO_TRACE_MEMORY_MIB is refused at start, not on each request
            max_age_days()  # likewise $AUTOSLAPO_MODEL_CACHE_DAYS


def create_app(store: Store, settings: ServiceSettings | None = None) -> FastAPI:
    """The service's app over an open ``store`` (the caller closes it)."""
    cfg = settings or ServiceSettings()
    if cfg.allow_module_files:
        prune_model_cache()  # sent files no study has used for $AUTOSLAPO_MODEL_CACHE_DAYS
    tokens = TokenCheck(store, cache_s=cfg.token_cache_s)
    answers = AnswerCache(cfg.answer_cache_s, STALE_S)
    registry = CollectorRegistry()
    app = FastAPI(title="autoslapo", description="Automatic schedule tuner: studies, trials, best schedules.",
                  version="1", lifespan=loop_lag_lifespan(loop_lag_histogram(registry)),
                  dependencies=[Depends(known_query)], docs_url=None, redoc_url=None)  # /docs: apidocs's page
    requests = Counter("autoslapo_http_requests", "HTTP requests", ["route", "method", "code"], registry=registry)
    latency = Histogram("autoslapo_http_request_seconds", "request latency", ["route"], registry=registry,
                        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
    studies_gauge = Gauge("autoslapo_studies", "studies by status", ["status"], registry=registry)
    trials_gauge = Gauge("autoslapo_trials_stored", "trials stored by the service's studies", registry=registry)

    def allowed(found: Caller | None, need: str) -> Caller:
        if found is None:
            if need == "read" and cfg.allow_anonymous_read:
                return Caller("anonymous", "read")
            raise ApiError(401, "a valid token is required: send `Authorization: Bearer <token>` "
                                "(make one with `autoslapo token create`)")
        if not found.may(need):
            raise ApiError(403, f"token {found.name!r} has role {found.role}: this needs {need} or above")
        return found

    def caller(request: Request, need: str, *, recheck: bool = False) -> Caller:
        found = tokens.caller(request.headers.get("authorization"), recheck=recheck)
        if found is None and COOKIE in request.cookies:
            found = tokens.caller(f"Bearer {request.cookies[COOKIE]}", recheck=recheck)
        return allowed(found, need)

    rechecks: set[asyncio.Task[Any]] = set()  # held until done (the loop keeps only weak references)

    async def caller_on_loop(request: Request, need: str) -> Caller:
        """``caller`` for async endpoints: a recently verified token is checked in memory (and, when
        ``due``, rechecked in the background); anything else (the store, argon2) runs in the thread
        pool, off the event loop."""
        header = request.headers.get("authorization")
        found = tokens.cached(header)
        if found is None and COOKIE in request.cookies:
            header = f"Bearer {request.cookies[COOKIE]}"
            found = tokens.cached(header)
        if found is None:
            return await run_in_threadpool(caller, request, need)
        if tokens.claim_recheck(header):
            task = asyncio.get_running_loop().create_task(run_in_threadpool(tokens.caller, header, recheck=True))
            rechecks.add(task)
            task.add_done_callback(_settled(rechecks))
        return allowed(found, need)

    app.add_middleware(Measure, latency=latency, requests=requests)

    handlers.install(app)
    apidocs.install(app)  # /docs needs nothing from a CDN (Swagger UI's did)

    # -- studies -----------------------------------------------------------------------------

    @app.post("/v1/studies", status_code=202, openapi_extra=study_body())
    async def submit(request: Request) -> JSONResponse:
        """Queue a study. Body: ``model``, ``gpus`` and optionally ``gpu_type``, ``gpus_per_node``,
        ``backend``, ``trials``, ``sampler``, ``seed``, ``global_batch``, ``timeout_s``, ``patience``,
        ``baselines``, ``name``, ``space``, ``resume`` (queue an ended study again) or ``join`` (submit
        the named study, follow it while queued or running, raising its budget to ``trials``, continue
        it when it ended short of ``trials``). Answers ``{name, url, status, budget, joined}``: 202,
        or 200 when a join or a resume found the study ended with ``trials`` launched (nothing written;
        a resume's answer adds a ``note`` on how to run more). ``budget`` is the one GET shows."""
        who = await caller_on_loop(request, "submit")
        doc = await read_json(request, cfg.max_body_bytes)
        try:
            # Checking a request binds its search space (and traces a model file, in a child process)
            # and naming it reads the store: off the event loop.
            study = await run_in_threadpool(StudyRequest.from_json, doc, allow_local=cfg.allow_local,
                                            allow_module_files=cfg.allow_module_files,
                                            module_timeout_s=cfg.module_timeout_s)
            name = study.name if study.name else await run_in_threadpool(_free_name, store, study.default_name())
        except AutoslapoError as err:
            raise ApiError(403 if isinstance(err, ModuleFilesOff) else 400, one_line(err)) from None
        url = str(request.url_for("get_study", name=name))
        if study.join:
            plan = await run_in_threadpool(_join, store, name, study, who, cfg.max_queued_per_token)
            if plan.action != "follow":
                answers.expire()
            ended = plan.action == "follow" and plan.status not in ("queued", "running")
            return JSONResponse({"name": name, "url": url, "status": plan.status,
                                 "joined": plan.action in ("follow", "raise"),
                                 "budget": await run_in_threadpool(shown_budget, store, name)},
                                status_code=200 if ended else 202, headers={"Location": url})
        try:
            if study.resume:
                await run_in_threadpool(check_resume, store, name, study, who)
                reached = await run_in_threadpool(resume_reached, store, name, study)
                if reached is not None:  # as a join of it: nothing to run, nothing written
                    return JSONResponse({"name": name, "url": url, "joined": False, **reached}, status_code=200,
                                        headers={"Location": url})
                await run_in_threadpool(store.jobs.requeue, name, {**study.to_dict(), "name": name}, owner=who.name,
                                        max_unfinished=cfg.max_queued_per_token)
            else:
                await run_in_threadpool(store.jobs.submit, name, {**study.to_dict(), "name": name}, owner=who.name,
                                        max_unfinished=cfg.max_queued_per_token)
        except JobLimitError as err:
            raise ApiError(429, f"token {one_line(err)}") from None
        except StorageError as err:
            raise ApiError(409, one_line(err)) from None
        answers.expire()  # the next list request starts a refresh that shows the new job
        budget = await run_in_threadpool(shown_budget, store, name) if study.resume else study.trials
        return JSONResponse({"name": name, "url": url, "status": "queued", "joined": False, "budget": budget},
                            status_code=202, headers={"Location": url})

    @app.get("/v1/studies")
    async def list_studies(request: Request, show_all: bool = Query(False, alias="all")) -> Response:
        """Every study and queued job; the tuner's ``<study>.baselines`` companions only with ``all=true``."""
        await caller_on_loop(request, "read")
        server = _server(request)
        body = await answers.get(("studies", server, show_all), lambda: _json_bytes(
            {"studies": all_studies(store, server=server, include_baselines=show_all)}))
        return Response(body, media_type="application/json")

    def _find(name: str, request: Request) -> dict[str, Any]:
        check_path_name(name)
        job = store.jobs.get(name)
        study = store.get_study(name) if store.has_study(name) else None
        if study is None and job is None:
            raise ApiError(404, f"no study named {name!r}: see GET /v1/studies")
        return study_view(store, study, job, baselines=True, server=_server(request))

    @app.get("/v1/studies/{name}", name="get_study")
    def get_study(name: str, request: Request) -> dict[str, Any]:
        caller(request, "read")
        return _find(name, request)

    @app.get("/v1/studies/{name}/trials")
    def get_trials(name: str, request: Request, offset: int = 0, limit: int = 100, sort: str = "number",
                   status: str | None = None) -> dict[str, Any]:
        caller(request, "read")
        check_path_name(name)
        if not store.has_study(name):
            raise ApiError(404, f"no trials yet for {name!r}: the study has not started or does not exist")
        if offset < 0 or not 1 <= limit <= 1000:
            raise ApiError(400, f"offset must be >= 0 and limit 1-1000: got offset={offset}, limit={limit}")
        keys = {"number": lambda t: t.number, "samples_per_s": lambda t: -(t.samples_per_s or 0.0)}
        if sort not in keys:
            raise ApiError(400, f"sort must be one of {', '.join(keys)}: got {sort[:40]!r}")
        if status is not None and status not in TRIAL_STATUSES:
            raise ApiError(400, f"status must be one of {', '.join(TRIAL_STATUSES)}: got {status[:40]!r}")
        rows = [t for t in store.trials(name) if status is None or t.status == status]
        rows.sort(key=keys[sort])
        family = study_family(store.get_study(name))
        return {"name": name, "total": len(rows), "offset": offset,
                "trials": [trial_view(t, family) for t in rows[offset:offset + limit]]}

    @app.get("/v1/studies/{name}/events")
    def events(name: str, request: Request) -> StreamingResponse:
        """Server-sent events: ``trial`` (one per launched trial that ended, as in ``/trials``) and a
        last ``done`` (the study as in ``GET /v1/studies/{name}``) once the study is no longer queued/running."""
        caller(request, "read")
        _find(name, request)

        def refused() -> str | None:  # the token rechecked while the stream is open: a revoked one ends it
            try:
                caller(request, "read", recheck=True)
            except ApiError as err:
                return f"{err.message}; the stream ended: open it again with a valid token"
            return None

        return StreamingResponse(study_events(store, name, cfg.events_poll_s, server=_server(request),
                                              refused=refused), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/v1/studies/{name}/report", response_class=HTMLResponse)
    def report(name: str, request: Request) -> HTMLResponse:
        """The study's report as ``autoslapo report`` writes it: one HTML page, figures inlined."""
        from autoslapo.report import write_report

        caller(request, "read")
        check_path_name(name)
        if not store.has_study(name):
            raise ApiError(404, f"no trials yet for {name!r}: the study has not started or does not exist")
        with tempfile.TemporaryDirectory(prefix="autoslapo-report-") as out:
            page = write_report(store, name, out).html.read_text(encoding="utf-8")
        return HTMLResponse(page)

    @app.post("/v1/studies/{name}/cancel", status_code=202)
    def cancel(name: str, request: Request) -> dict[str, Any]:
        who = caller(request, "submit")
        check_path_name(name)
        job = store.jobs.get(name)
        if job is None:
            raise ApiError(404, f"no submitted study named {name!r}: only the service's studies can be cancelled")
        if job.owner != who.name and not who.may("admin"):
            raise ApiError(403, f"token {who.name!r} may cancel only its own studies: {name!r} is {job.owner!r}'s")
        if job.status not in ("queued", "running"):
            raise ApiError(409, f"study {name!r} already ended ({job.status}): nothing to cancel, nothing was changed")
        job = store.jobs.cancel(name)
        if job.status not in ("queued", "running", "cancelled"):  # it ended between the read and the cancel
            raise ApiError(409, f"study {name!r} already ended ({job.status}): nothing to cancel, nothing was changed")
        answers.expire()
        return {"name": name, "status": job.status, "cancel_requested": job.cancel_requested}

    # -- answers -----------------------------------------------------------------------------

    @app.get("/v1/best")
    async def best(request: Request, model: str, gpus: int, gpu_type: str | None = None,
                   metric: str = "samples_per_s", measured_only: bool = False,
                   intra_node_gbps: float | None = None, inter_node_gbps: float | None = None,
                   gpus_per_node: int | None = None, global_batch: int | None = None) -> Response:
        await caller_on_loop(request, "read")
        if metric not in RANK_METRICS:
            raise ApiError(400, f"metric must be one of {', '.join(RANK_METRICS)}: got {redact(metric)[:40]!r}; "
                                "leave it out for samples_per_s")
        if gpus_per_node is not None:  # the node rule up front (400, as a study's), not a 404 naming a refused tune
            ClusterSpec(gpus=gpus, gpus_per_node=gpus_per_node)
        links = {"intra_node_gbps": intra_node_gbps, "inter_node_gbps": inter_node_gbps}
        server = _server(request)

        def answer() -> bytes:
            try:
                t = api.best_trial(model, gpus=gpus, gpu_type=gpu_type, storage=store, metric=metric,
                                   measured_only=measured_only, links={k: v for k, v in links.items() if v is not None},
                                   gpus_per_node=gpus_per_node, global_batch=global_batch)
            except UsageError as err:
                if "no recorded schedule" in str(err) or "a model a stored study tuned" in str(err):
                    raise ApiError(404, best_missing(one_line(err), server, model)) from None
                raise ApiError(400, one_line(err)) from None
            study = store.get_study(t.study)
            return _json_bytes({"model": study.model_name, "gpus": study.gpus, "gpu_type": study.gpu_type,
                                "model_spec": study.model,  # what apply_best builds for a model named by signature
                                "study": t.study, "trial": t.number, "backend": study.backend,
                                **trial_view(t, study_family(study)), "global_batch": config_global_batch(t.config),
                                "apply_best": apply_snippet(study, server, global_batch)})

        body = await answers.get(("best", model, gpus, gpu_type, metric, measured_only, intra_node_gbps,
                                  inter_node_gbps, gpus_per_node, global_batch, server), answer)
        return Response(body, media_type="application/json")

    app.include_router(estimate_router(store, caller, allow_module_files=cfg.allow_module_files,
                                       module_timeout_s=cfg.module_timeout_s, max_body_bytes=cfg.max_body_bytes))

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "store": store.backend, "revision": store.revision()}

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        caller(request, "read")
        studies = all_studies(store, include_baselines=True)  # every study the store holds, as before
        for status in {s["status"] for s in studies} | {"queued", "running", "complete"}:
            studies_gauge.labels(status).set(sum(1 for s in studies if s["status"] == status))
        trials_gauge.set(sum(sum(s["counts"].values()) for s in studies))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # -- the web page --------------------------------------------------------------------------

    def page_caller(request: Request) -> Caller | None:
        try:
            return caller(request, "read")
        except ApiError:
            return None

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request, show_all: bool = Query(False, alias="all")) -> HTMLResponse:
        who = page_caller(request)
        if who is None:
            return HTMLResponse(pages.login_page(), status_code=401)
        return HTMLResponse(pages.studies_page(all_studies(store, server=_server(request), include_baselines=show_all), who))

    @app.get("/studies/{name}", response_class=HTMLResponse)
    def study_page(name: str, request: Request) -> HTMLResponse:
        who = page_caller(request)
        if who is None:
            return HTMLResponse(pages.login_page(), status_code=401)
        try:
            doc = _find(name, request)
        except ApiError as err:  # a page, not the API's JSON, for a browser's mistyped study
            return HTMLResponse(pages.missing_page(err.message), status_code=err.status)
        study = store.get_study(name) if store.has_study(name) else None
        family = study_family(study)
        trials = [trial_view(t, family) for t in store.trials(name)] if study is not None else []
        return HTMLResponse(pages.study_page(doc, trials))

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = (await request.body())[: cfg.max_body_bytes].decode(errors="replace")
        token = (parse_qs(form).get("token") or [""])[0].strip()
        if await run_in_threadpool(tokens.caller, f"Bearer {token}") is None:
            return HTMLResponse(pages.login_page("that token is not valid"), status_code=401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.get("/robots.txt", response_class=PlainTextResponse)
    def robots() -> str:
        return "User-agent: *\nDisallow: /\n"

    return app


def _settled(held: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """A done-callback that lets go of a background task and reads its error (a failed recheck is
    retried by the next request; asyncio must not report it as never retrieved)."""

    def done(task: asyncio.Task[Any]) -> None:
        held.discard(task)
        if not task.cancelled():
            task.exception()

    return done


def _json_bytes(doc: Any) -> bytes:
    """``doc`` as the JSON body FastAPI would send for it (encoded once, then served many times).

    The views are plain JSON already: ``json.dumps`` (C) takes them; FastAPI's encoder (slow, pure
    Python, and holding the GIL the event loop needs) only serves what it refuses."""
    try:
        return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return bytes(JSONResponse(jsonable_encoder(doc)).body)


def _server(request: Request) -> str:
    """This service's URL as the client reached it (what ``apply_best(..., server=)`` takes)."""
    return str(request.base_url).rstrip("/")


def check_path_name(name: str) -> None:
    """A study name in a URL path that breaks the study-name rule: 400 with the rule (bad input,
    as in a body), not 404."""
    try:
        check_name(name)
    except UsageError as err:
        raise ApiError(400, one_line(err)) from None


def _join(store: Store, name: str, study: StudyRequest, who: Caller, max_unfinished: int | None) -> JoinPlan:
    """Carry out ``plan_join``: submit, queue again, or write nothing. When another request wrote
    between the plan and the write (two joins of a new name, a requeue racing a requeue), the
    store refuses the write and the join looks again: one job per study, never run twice."""
    for attempt in range(JOIN_TRIES):
        try:
            plan = plan_join(store, name, study, who)
        except JoinRefused as err:
            raise ApiError(err.status, str(err)) from None
        if plan.action == "raise":
            if store.jobs.raise_budget(name, plan.budget) is not None:
                return plan
            if attempt == JOIN_TRIES - 1:
                raise ApiError(409, f"study {name!r} kept ending while its budget was raised: join again")
            continue  # the job ended meanwhile: look again (now it is queued again or followed)
        write = {"submit": store.jobs.submit, "requeue": store.jobs.requeue}.get(plan.action)
        if write is None:
            return plan
        try:
            write(name, {**study.to_dict(), "name": name}, owner=who.name, max_unfinished=max_unfinished)
            return plan
        except JobLimitError as err:
            raise ApiError(429, f"token {one_line(err)}") from None
        except StorageError as err:
            if attempt == JOIN_TRIES - 1:
                raise ApiError(409, one_line(err)) from None
    raise AssertionError("unreachable: the last try returns or raises")


def _free_name(store: Store, base: str) -> str:
    name, i = base, 2
    while store.has_study(name) or store.jobs.get(name) is not None:
        name, i = f"{base}-{i}", i + 1
    return name
