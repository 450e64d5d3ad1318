"""``nf4-tune search``: one optuna study per (GPU model, problem), every trial stored.

The search space is the family's parametrisation (:meth:`nf4tune.family.Family.search_space`):
knobs tied by a constraint are one categorical parameter whose choices are the valid
combinations, so every sample is a valid config and the constraints cost no trials. Studies
live in the same database as the measurements (optuna's RDB storage), named
``nf4-tune/<gpu>/<problem>``, so running the same command again resumes them, and several
workers (one per GPU) can share one. Each measuring worker records a heartbeat; a trial left
RUNNING by a killed worker is failed (optuna's ``fail_stale_trials``) once its heartbeat is
older than the grace period, by the resumed search or by another worker before each of its
trials, so no study keeps a RUNNING trial forever and no finished trial is lost. Workers that
share a study measure each config once: only the worker whose ``create_study`` made the study
queues its start points, SQLite transactions take the write lock when they begin (so a queued
trial is popped once; PostgreSQL locks the row), and a trial whose config another worker started
measuring first waits for that measurement and takes it from the database. The interval
and the grace period are read when the storage is made: ``NF4TUNE_HEARTBEAT_S`` and
``NF4TUNE_GRACE_S`` (whole seconds; default :data:`HEARTBEAT_S` and :data:`GRACE_S`).

A trial is measured by a :class:`Measurer`. The real one runs every candidate in a worker
process that is restarted when it dies or hangs, so an illegal memory access (which poisons
the CUDA context) or a hung kernel becomes an invalid trial and the search goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..families import get as get_family
from ..vocabulary import InvalidConfig, Problem, speedup
from .trial import Measurer, TrialOutcome

__all__ = ["study_name", "TrialOutcome", "Measurer", "SearchSummary", "run_search", "run_searches", "SearchRun",
           "make_sampler", "SAMPLERS", "fail_stale_trials",
           "nearest_best", "warm_starts", "WARM_STARTS", "refine_trials", "HEARTBEAT_S", "GRACE_S", "heartbeat_settings", "summarize_study",
           "load_study", "space_key", "space_study_name"]

SAMPLERS = ("tpe", "gp", "random", "grid")
#: a measuring worker records a heartbeat this often; a RUNNING trial whose heartbeat is older
#: than the grace period belongs to a dead process and is failed (on resume or by another worker)
HEARTBEAT_S = 5
GRACE_S = 20


def _env_seconds(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a whole number of seconds") from None
    if value < 1:
        raise ValueError(f"{name}={text!r} must be at least 1 second")
    return value


def heartbeat_settings() -> tuple[int, int]:
    """(heartbeat interval, grace period) in whole seconds: ``NF4TUNE_HEARTBEAT_S`` and
    ``NF4TUNE_GRACE_S`` where set, else :data:`HEARTBEAT_S` and :data:`GRACE_S`. ValueError for
    a value that is not a positive whole number or a grace period not longer than the interval
    (a live worker's trial would be failed)."""
    beat = _env_seconds("NF4TUNE_HEARTBEAT_S", HEARTBEAT_S)
    grace = _env_seconds("NF4TUNE_GRACE_S", GRACE_S)
    if grace <= beat:
        raise ValueError(f"the grace period (NF4TUNE_GRACE_S={grace}) must be longer than the heartbeat interval "
                         f"(NF4TUNE_HEARTBEAT_S={beat})")
    return beat, grace



def _ignore_heartbeat_notes():
    """The heartbeat is what this module is built on (ask/tell with its own heartbeat thread):
    optuna's warnings that it is experimental and meant for Study.optimize are expected here."""
    warnings.filterwarnings("ignore", message=r"Heartbeat of storage is supposed to be used with Study\.optimize")
    warnings.filterwarnings("ignore", message=r".*(heartbeat_interval|grace_period|fail_stale_trials).*experimental")


def study_name(gpu_name: str, problem: Problem) -> str:
    return f"nf4-tune/{gpu_name}/{problem.label().replace(' ', '/')}"


def make_sampler(name: str, seed: Optional[int], search_space: Optional[dict] = None):
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=True, group=False)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(search_space, seed=seed)
    raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


@dataclass
class SearchSummary:
    problem: Problem
    study: str
    trials: int                       # finished trials in the study
    new_trials: int                   # finished by this call
    measured: int                     # of those, measured on the GPU (the rest came from the database)
    best_config: object                # a nf4tune.family.Config, or None
    best_us: Optional[float]
    best_result: Optional[dict]
    blog_us: Optional[float]
    seconds: float
    stale_failed: list = field(default_factory=list)   # trials a killed search left RUNNING, failed by this one


def _storage(url: str, attempts: int = 8):
    """optuna's RDB storage on ``url``, with heartbeats. Workers that start together on a fresh
    database race to create optuna's tables; the loser retries and finds them made."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from nf4tune.db._engine import bound_lock_waits, engine_kwargs, is_lock_error

    kwargs = engine_kwargs(url)         # waits for another process's lock as long as the repository's engine
    beat, grace = heartbeat_settings()
    for i in range(attempts):
        try:
            with warnings.catch_warnings():
                _ignore_heartbeat_notes()
                storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=beat,
                                                     grace_period=grace)
            break
        except (SQLAlchemyError, RuntimeError) as e:
            if i == attempts - 1 or is_lock_error(e):      # a lock already waited for up to the lock timeout
                raise
            time.sleep(0.2 * (i + 1))
    if url.startswith("sqlite"):
        _serialize_sqlite_transactions(storage.engine)
    bound_lock_waits(storage.engine)
    return storage


def _serialize_sqlite_transactions(engine) -> None:
    """Make every transaction on ``engine`` (optuna's, on SQLite) take the write lock when it
    begins (``BEGIN IMMEDIATE``; SQLAlchemy's pysqlite recipe). optuna pops a queued trial by
    reading its state and then writing RUNNING; SQLite has no ``SELECT ... FOR UPDATE`` and
    pysqlite starts the transaction only at the write, so two workers could both read WAITING
    and both take (and measure) the same trial. PostgreSQL locks the row and needs none of this."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_conn, _record):
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()    # connections opened before the listeners existed are not reused


def _finished(study) -> list:
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.FAIL)]


class _Heartbeat:
    """Records a running trial's heartbeat on entry and then every ``storage.heartbeat_interval``
    seconds, from the ask to the measurement's end, so that a worker that dies mid-trial leaves a
    trial other workers (or a resume) can fail."""

    def __init__(self, storage, trial_id: int):
        self._storage, self._trial_id = storage, trial_id
        self._interval = storage.heartbeat_interval or HEARTBEAT_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _record(self):
        try:
            self._storage.record_heartbeat(self._trial_id)
        except Exception:   # the storage is busy or gone: the next beat tries again
            pass

    def _beat(self):
        while not self._stop.wait(self._interval):
            self._record()

    def __enter__(self):
        self._record()      # stored before the trial is claimed (its "config" attribute)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)


def space_key(distributions: dict) -> str:
    """A short hash of a search space (each parameter's choices, in order)."""
    text = json.dumps({k: [str(c) for c in d.choices] for k, d in sorted(distributions.items())})
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _distributions(space: dict) -> dict:
    """optuna's distributions of a family's search space (:meth:`nf4tune.family.Family.search_space`)."""
    import optuna

    return {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}


def _fits_space(study, distributions: dict, key: str) -> bool:
    """Whether ``study`` can take trials drawn from ``distributions``: optuna refuses a parameter
    whose choices differ from those of the study's earlier trials ("CategoricalDistribution does not
    support dynamic value space"), which happens once the family's space changed since the study
    began (a knob value added, a constraint changed). ``key``: :func:`space_key` of ``distributions``."""
    if study.user_attrs.get("space") == key:
        return True
    return all(distributions.get(p, d) == d for t in study.get_trials(deepcopy=False)
               for p, d in t.distributions.items())


def _open_study(name: str, storage, sampler, distributions: dict):
    """(study, created): the study ``name``, made by this call when ``created``. create_study
    inserts the unique study name, so of several workers opening a fresh study at once exactly
    one gets ``created``; the others load what it made. A study begun under another search space
    (:func:`_fits_space`) keeps its trials, and the search goes on in the study ``name [space
    KEY]`` of the current space (:func:`space_study_name`), made the same way."""
    import optuna

    key = space_key(distributions)
    for candidate in (name, space_study_name(name, distributions)):
        try:
            study = optuna.create_study(study_name=candidate, storage=storage, direction="minimize", sampler=sampler)
            study.set_user_attr("space", key)
            if candidate != name:
                warnings.warn(f"study {name!r} began under another search space of the family (its trials stay "
                              f"there); the search goes on in the new study {candidate!r}", stacklevel=2)
            return study, True
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=candidate, storage=storage, sampler=sampler)
        if _fits_space(study, distributions, key):
            return study, False
    raise RuntimeError(f"study {study.study_name!r} holds trials of another search space under its space's own name")


def space_study_name(name: str, distributions: dict) -> str:
    """The name of the study that continues ``name`` when the family's search space changed."""
    return f"{name} [space {space_key(distributions)}]"


def _wait_for_twin(study, number: int, grace_s: float, poll_s: float = 0.02, max_poll_s: float = 0.5,
                   stale_every_s: float = 1.0) -> Optional[int]:
    """Wait while another RUNNING trial of ``study`` with the params of trial ``number`` started
    before it (two workers took the same config, queued twice). Of twins, the one that started
    first (then the lower number) measures, so two never wait for each other. The wait ends: a
    twin whose worker died is failed as stale on the way (its heartbeat stopped), and a twin that
    was never claimed (no ``config`` attribute, which a live worker sets right after the trial's
    first heartbeat) within ``grace_s`` of its start died before any heartbeat and is not waited
    for. The twin's number, or None when there was none. The poll backs off from ``poll_s`` to
    ``max_poll_s`` (every read of an SQLite study takes its write lock, which the measuring twin's
    worker needs too), and stale trials are looked for every ``stale_every_s`` (a heartbeat can
    only age by that much in between)."""
    from optuna.trial import TrialState

    def alive(t) -> bool:
        return not _never_claimed(t, grace_s)

    twin, last_stale = None, time.monotonic()
    while True:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        mine = next((t for t in running if t.number == number), None)
        if mine is None:
            return twin     # this trial itself was failed meanwhile
        key = (mine.datetime_start, number)
        earlier = [t.number for t in running if t.number != number and t.params == mine.params
                   and (t.datetime_start, t.number) < key and alive(t)]
        if not earlier:
            return twin
        twin = earlier[0]
        time.sleep(poll_s)
        poll_s = min(2 * poll_s, max_poll_s)
        if time.monotonic() - last_stale >= stale_every_s:
            fail_stale_trials(study)
            last_stale = time.monotonic()


def _never_claimed(trial, grace_s: float) -> bool:
    """A RUNNING trial no worker claimed (the ``config`` attribute, which a live worker sets right
    after the trial's first heartbeat) within ``grace_s`` of its start: its worker died between the
    ask and the first heartbeat, so it has no heartbeat to age."""
    from datetime import datetime

    return "config" not in trial.user_attrs and (datetime.now() - trial.datetime_start).total_seconds() >= grace_s


def fail_stale_trials(study, grace_s: Optional[float] = None) -> list[int]:
    """Mark FAIL the RUNNING trials of dead workers: those whose worker stopped beating (killed,
    crashed) longer than the grace period ago (optuna's heartbeat check), and those never claimed
    within the grace period of their start (:func:`_never_claimed`). ``grace_s``: the grace period
    the storage was made with (:func:`heartbeat_settings`) when not given. The numbers of the trials
    this call failed."""
    import optuna
    from optuna.trial import TrialState

    running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not running:
        return []
    storage = study._storage        # optuna's cache in front of the RDB storage: no grace period of its own
    if grace_s is None:
        grace_s = heartbeat_settings()[1]
    try:
        optuna.storages.fail_stale_trials(study)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if _never_claimed(t, grace_s):
                try:
                    storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
                    pass    # finished meanwhile (its worker was alive after all)
    except Exception:       # the storage is busy: the next call tries again
        return []
    # a trial a live worker finished meanwhile carries its "status"; a stale one never got one
    failed = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
              if "status" not in t.user_attrs}
    return sorted(running & failed)


def run_search(problem: Problem, *, repo, storage_url: str, gpu_name: str, run, measurer: Measurer,
               n_trials: int = 30, sampler: str = "tpe", seed: Optional[int] = None,
               timeout: Optional[float] = None, remeasure: bool = False,
               progress: Optional[Callable[[int, int, Optional[float], Optional[float]], None]] = None,
               template_hash: Optional[str] = None, worker: Optional[str] = None,
               experimental: bool = False) -> SearchSummary:
    """Run (or resume) the study of ``problem`` until it holds ``n_trials`` finished trials
    (or ``timeout`` seconds pass). Every trial's measurement is stored through ``repo``.
    ``worker`` names this measuring process in each trial it takes (user attribute ``worker``;
    ``nf4-tune search --gpus`` runs one per GPU). ``experimental``: the family's whole space, its
    experimental knob values too (a study of its own: the space differs)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        _ignore_heartbeat_notes()
        return _run_search(problem, repo=repo, storage_url=storage_url, gpu_name=gpu_name, run=run, measurer=measurer,
                           n_trials=n_trials, sampler=sampler, seed=seed, timeout=timeout, remeasure=remeasure,
                           progress=progress, template_hash=template_hash, worker=worker,
                           experimental=experimental)


def _run_search(problem, *, repo, storage_url, gpu_name, run, measurer, n_trials, sampler, seed, timeout, remeasure,
                progress, template_hash, worker, experimental=False) -> SearchSummary:
    import optuna
    from optuna.trial import TrialState

    family = get_family(problem.family)
    family.check_problem(problem)
    th = template_hash or family.template_hash()
    space = family.search_space(problem, experimental)
    distributions = _distributions(space)
    name = study_name(gpu_name, problem)
    storage = _storage(storage_url)
    study, created = _open_study(name, storage, make_sampler(sampler, seed, space), distributions)
    stale = fail_stale_trials(study)
    if created:
        # start from known good points: the built-in default, the presets and the best of the
        # nearest tuned problem. Only the worker whose create_study made the study queues them
        # (the study name is unique in the storage, so exactly one worker does): workers that
        # reach a fresh study together would otherwise each see it empty, each queue the starts,
        # and each measure them.
        starts = warm_starts(repo, gpu_name, problem)
        starts += [family.builtin_default(problem)] + [family.preset(n, problem) for n in family.presets]
        starts = [c for c in starts if family.in_space(c, experimental)]     # a preset may be experimental
        own = repo.best(gpu_name, problem) if study.study_name != name else None   # a study of an older space measured it
        if own is not None:
            try:
                c = family.from_dict(own[0])
                if family.in_space(c, experimental):
                    starts.insert(0, c)
            except InvalidConfig:                # a config the current space no longer holds
                pass
        # at most the trials asked for (a short search measures only what is known best)
        for c in list(dict.fromkeys(starts))[:n_trials]:
            study.enqueue_trial(family.params_from_config(c), skip_if_exists=True)
    limit = min(n_trials, family.grid_size(problem, experimental)) if sampler == "grid" else n_trials
    t0 = time.perf_counter()
    new = measured = 0
    best_us = None
    peer_seen: list = []   # the peer's median of each trial measured here: their median is the x-bnb basis
    while True:
        done = len(_finished(study))
        if done >= limit or (timeout is not None and time.perf_counter() - t0 > timeout):
            break
        if sampler != "grid" and limit - done <= refine_trials(limit):
            _enqueue_refinement(study, family, problem, experimental)
        stale += fail_stale_trials(study)   # another worker of this study may have been killed
        trial = study.ask(distributions)
        config = family.config_from_params(trial.params, problem)
        # the heartbeat runs from the ask on: a worker that dies anywhere in the trial leaves a
        # trial that is failed as stale, and a twin waiting for it stops waiting
        with _Heartbeat(storage, trial._trial_id):
            try:
                trial.set_user_attr("config", config.to_json())     # the claim (after the first beat)
                if worker:
                    trial.set_user_attr("worker", worker)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue    # another worker popped the same enqueued trial and has finished it already
            if not remeasure:
                # the same config queued twice (two workers queueing one refinement at once), or
                # drawn while the other worker measures it: wait for that measurement
                _wait_for_twin(study, trial.number, grace_s=storage.grace_period or GRACE_S)
            stored = None if remeasure else repo.measurement_of(gpu_name, problem, config.to_dict(), th)
            if stored is not None:
                outcome = TrialOutcome(stored.status, stored.median_us, stored.reason)
            else:
                try:
                    outcome = measurer.measure(problem, config)
                except KeyboardInterrupt:
                    trial.set_user_attr("status", "interrupted")
                    study.tell(trial, state=TrialState.FAIL)
                    raise
                measured += 1
                row = repo.config(config.to_dict(), th, family.name)
                for r in outcome.results:
                    repo.add_measurement(run, problem, r, row if r.get("config") else None,
                                         gpu_state=outcome.gpu_state, bnb_median_us=outcome.bnb_median_us)
        try:
            if stored is not None:
                trial.set_user_attr("from_database", True)
            trial.set_user_attr("status", outcome.status)
            if outcome.status == "ok" and outcome.median_us is not None:
                study.tell(trial, outcome.median_us)
            else:
                trial.set_user_attr("reason", (outcome.reason or "")[:2000])
                study.tell(trial, state=TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as e:
            # a trial this worker measured past the grace period was failed as stale (or, on a
            # storage without row locks or BEGIN IMMEDIATE, two workers popped the same queued
            # trial): the measurement is stored all the same. optuna 4 raises
            # UpdateFinishedTrialError here, optuna 5 "ValueError: Cannot tell a COMPLETE trial."
            if isinstance(e, ValueError) and not str(e).startswith("Cannot tell a"):
                raise
            continue
        new += 1
        try:
            best_us = study.best_value
        except ValueError:
            best_us = None
        if outcome.bnb_median_us:
            peer_seen.append(outcome.bnb_median_us)
        if progress:
            progress(len(_finished(study)), limit, best_us, statistics.median(peer_seen) if peer_seen else None)
    return summarize_study(problem, repo=repo, study=study, gpu_name=gpu_name, new_trials=new, measured=measured,
                           seconds=time.perf_counter() - t0, stale_failed=stale, template_hash=th)


def summarize_study(problem: Problem, *, repo, study, gpu_name: str, new_trials: int = 0, measured: int = 0,
                    seconds: float = 0.0, stale_failed=(), template_hash: Optional[str] = None) -> SearchSummary:
    """The :class:`SearchSummary` of ``problem``'s study (an optuna Study) and stored
    measurements as they stand (also for a study that several workers searched)."""
    family = get_family(problem.family)
    th = template_hash or family.template_hash()
    best = repo.best(gpu_name, problem)
    best_config = family.from_dict(best[0]) if best else None
    blog = None
    if "blog" in family.presets:
        blog = repo.measurement_of(gpu_name, problem, family.preset("blog", problem).to_dict(), th)
    # x bnb against the median of the peer's medians over every trial of this problem (one
    # trial's peer median alone varies by more than the kernels being compared)
    peer_all = repo.reference_medians(gpu_name, problem, family.peer_label)
    peer_us = statistics.median(peer_all) if peer_all else None
    return SearchSummary(problem=problem, study=study.study_name, trials=len(_finished(study)), new_trials=new_trials,
                         measured=measured, best_config=best_config, best_us=best[1].median_us if best else None,
                         best_result=dict(median_us=best[1].median_us, gbps=best[1].gbps, pct_copy=best[1].pct_copy,
                                          speedup=speedup(peer_us, best[1].median_us),
                                          speedup_same_trial=best[1].speedup) if best else None,
                         blog_us=blog.median_us if blog is not None and blog.status == "ok" else None,
                         seconds=seconds, stale_failed=sorted(set(stale_failed)))


def load_study(problem: Problem, *, storage_url: str, gpu_name: str, experimental: bool = False):
    """The optuna study a search of ``problem`` on ``gpu_name`` at ``storage_url`` adds to: the one
    of the family's current search space (:func:`_open_study`)."""
    import optuna

    storage = _storage(storage_url)
    name = study_name(gpu_name, problem)
    keyed = space_study_name(name, _distributions(get_family(problem.family).search_space(problem, experimental)))
    return optuna.load_study(study_name=keyed if keyed in optuna.get_all_study_names(storage) else name, storage=storage)


def refine_trials(n_trials: int) -> int:
    """How many of a search's last trials are local refinement around the best (a third)."""
    return n_trials // 3


def _trial_config(family, trial, problem):
    """The config a finished trial measured (its stored JSON; params as a fallback)."""
    text = trial.user_attrs.get("config")
    if text:
        try:
            return family.from_json(text)
        except ValueError:
            pass
    return family.config_from_params(trial.params, problem)


def _enqueue_refinement(study, family, problem: Problem, experimental: bool = False) -> None:
    """Queue the first untried neighbour of the study's best config (greedy local search: the
    next call sees the new best if this one wins)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return            # start points still queued: they run first, and the refinement follows the best of them
    tried = {tuple(sorted(t.params.items())) for t in trials if t.params}
    tried |= {tuple(sorted(t.system_attrs.get("fixed_params", {}).items())) for t in trials
              if t.state == TrialState.WAITING}
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    if not done:
        return
    best = min(done, key=lambda t: t.value)
    for n in family.neighbours(_trial_config(family, best, problem), experimental):
        p = family.params_from_config(n)
        if tuple(sorted(p.items())) not in tried:
            study.enqueue_trial(p, skip_if_exists=True)
            return


#: start points a new study queues from what is known (the database's and the tables' nearest problems)
WARM_STARTS = 8


def warm_starts(repo, gpu_name: str, problem: Problem, table=None, limit: int = WARM_STARTS) -> list:
    """What a new study starts from, nearest first, each once, at most ``limit``: the best configs of the
    nearest tuned problems of the same family, from the database (its problems on this GPU model) and from
    the serving table (the packaged table and the per-user table: ``table``, default the runtime's), across
    batch buckets; this GPU model's first, then other models'. Carried to the problem's problem knobs; a
    config the problem's knobs make invalid is passed over."""
    from ..serve.table import current_table, shape_distance

    family = get_family(problem.family)
    table = table if table is not None else current_table()
    ranked = []
    for g, p in repo.problems(gpu_name, family=problem.family):
        if g == gpu_name and p != problem:
            best = repo.best(gpu_name, p)
            if best is not None:
                ranked.append((False, p, best[0]))
    for e in table.entries:
        if e.problem.family == problem.family and not (e.gpu == gpu_name and e.problem == problem):
            ranked.append((e.gpu != gpu_name, e.problem, e.config.to_dict()))

    def rank(item):
        other_gpu, p, _ = item
        return (other_gpu, p.dtype != problem.dtype, p.quant != problem.quant,
                abs((p.m or 1).bit_length() - (problem.m or 1).bit_length()),
                shape_distance(problem, p) if len(p.shape) == len(problem.shape) else (abs(p.numel - problem.numel),))

    out: list = []
    for _, _, knobs in sorted(ranked, key=rank):
        try:
            c = family.for_problem(family.from_dict(knobs), problem)
        except InvalidConfig:
            continue
        if c not in out:
            out.append(c)
        if len(out) == limit:
            break
    return out


def nearest_best(repo, gpu_name: str, problem: Problem):
    """The best stored config of the nearest other problem of the same family on this GPU model
    (:meth:`Problem.distance`), converted to this problem's problem knobs (dtype, quant)."""
    others = [p for g, p in repo.problems(gpu_name, family=problem.family) if g == gpu_name and p != problem]
    if not others:
        return None
    near = min(others, key=problem.distance)
    best = repo.best(gpu_name, near)
    if best is None:
        return None
    family = get_family(problem.family)
    return family.for_problem(family.from_dict(best[0]), problem)


@dataclass
class SearchRun:
    run_id: int
    url: str
    summaries: list
    seconds: float = 0.0          # wall time of the whole problem set


def run_searches(problems, *, url: str, gpu, n_trials: int = 30, sampler: str = "tpe", seed: Optional[int] = None,
                 timeout: Optional[float] = None, remeasure: bool = False, time_cap_s: float = 1.0,
                 command: str = "", progress_for=None, measurer=None, worker: Optional[str] = None,
                 experimental: bool = False) -> SearchRun:
    """Search every problem on ``gpu`` into the database at ``url`` under one recorded run,
    measuring in a restartable worker process: the library call of ``nf4-tune search`` (and of
    each GPU's worker of ``nf4-tune search --gpus``, see :mod:`nf4tune.tune.multigpu`).
    ``progress_for(problem)`` gives each search's progress callback; ``worker`` names this
    process in the trials it takes."""
    from ..measure.record import recorded_run
    from .worker import WorkerMeasurer

    t0 = time.perf_counter()
    summaries = []
    own = measurer is None
    measurer = measurer or WorkerMeasurer(options=dict(time_cap_s=time_cap_s))
    try:
        with recorded_run("search", url, gpu, command=command) as rec:
            for prob in problems:
                summaries.append(run_search(prob, repo=rec.repo, storage_url=url, gpu_name=gpu.name, run=rec.run,
                                            measurer=measurer, n_trials=n_trials, sampler=sampler, seed=seed,
                                            timeout=timeout, remeasure=remeasure,
                                            progress=progress_for(prob) if progress_for else None, worker=worker,
                                            experimental=experimental))
    finally:
        if own:
            measurer.close()
    return SearchRun(rec.run.id, url, summaries, time.perf_counter() - t0)
