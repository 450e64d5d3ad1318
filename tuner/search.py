"""``nf4-tune search``: one optuna study per (GPU model, problem), every trial stored.

The search space is parametrised so that every sample is a valid config: the (bytes per
thread, steps in flight) pairs and the (threads, grid) pairs the constraints allow are each one
categorical parameter, so the space's constraints cost no trials. Studies live in the same
database as the measurements (optuna's RDB storage), named ``nf4-tune/<gpu>/<problem>``, so
running the same command again resumes them, and several workers (one per GPU) can share one.

A trial is measured by a :class:`Measurer`. The real one runs every candidate in a worker
process that is restarted when it dies or hangs, so an illegal memory access (which poisons
the CUDA context) or a hung kernel becomes an invalid trial and the search goes on.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from .gate import Problem
from .space import KNOBS, MAX_INFLIGHT_BYTES, MAX_RESIDENT_THREADS, KernelConfig, PRESETS, preset

__all__ = ["SEARCH_SPACE", "config_from_params", "params_from_config", "study_name", "TrialOutcome",
           "Measurer", "SearchSummary", "run_search", "make_sampler", "SAMPLERS", "grid_size", "nearest_best"]

SAMPLERS = ("tpe", "gp", "random", "grid")


def _vector_choices() -> list[str]:
    return [f"{b}x{u}" for b in KNOBS["bytes_per_thread"] for u in KNOBS["unroll"] if b * u <= MAX_INFLIGHT_BYTES]


def _launch_choices() -> list[str]:
    out = []
    for t in KNOBS["threads"]:
        out.append(f"t{t}/oneshot")
        for c in KNOBS["ctas_per_sm"]:
            if c is not None and t * c <= MAX_RESIDENT_THREADS:
                out.append(f"t{t}/persistent{c}")
    return out


#: optuna parameters -> choices; their product is exactly the valid space of one dtype/quant
SEARCH_SPACE = {
    "vector": _vector_choices(),
    "launch": _launch_choices(),
    "lut": list(KNOBS["lut"]),
    "index": list(KNOBS["index"]),
    "store": list(KNOBS["store"]),
}


def config_from_params(params: dict, dtype: str, quant: str) -> KernelConfig:
    b, u = (int(x) for x in params["vector"].split("x"))
    threads, grid = params["launch"].split("/")
    cps = None
    if grid.startswith("persistent"):
        cps = int(grid[len("persistent"):])
        grid = "persistent"
    return KernelConfig(bytes_per_thread=b, unroll=u, threads=int(threads[1:]), grid=grid, ctas_per_sm=cps,
                        lut=params["lut"], index=params["index"], store=params["store"], dtype=dtype, quant=quant)


def params_from_config(c: KernelConfig) -> dict:
    grid = "oneshot" if c.grid == "oneshot" else f"persistent{c.ctas_per_sm}"
    return dict(vector=f"{c.bytes_per_thread}x{c.unroll}", launch=f"t{c.threads}/{grid}", lut=c.lut,
                index=c.index, store=c.store)


def neighbours(c: KernelConfig) -> list[KernelConfig]:
    """Valid configs one knob step from ``c``, most promising knob first (threads, store, grid,
    then the vector shape, the LUT and the index arithmetic): the moves of the local refinement
    that ends a search."""
    from .space import InvalidConfig

    moves = [dict(threads=t) for t in KNOBS["threads"] if t != c.threads]
    moves.append(dict(store="streaming" if c.store == "plain" else "plain"))
    moves += ([dict(grid="oneshot", ctas_per_sm=None)] if c.grid == "persistent" else
              [dict(grid="persistent", ctas_per_sm=k) for k in (1, 2, 4, 8)])
    moves += [dict(unroll=c.unroll * 2), dict(unroll=c.unroll // 2),
              dict(bytes_per_thread=c.bytes_per_thread * 2, unroll=max(1, c.unroll // 2)),
              dict(bytes_per_thread=c.bytes_per_thread // 2, unroll=c.unroll * 2),
              dict(bytes_per_thread=c.bytes_per_thread * 2), dict(bytes_per_thread=c.bytes_per_thread // 2)]
    moves += [dict(lut=l) for l in ("shared", "register", "global", "constant", "branch") if l != c.lut]
    moves += [dict(index=i) for i in ("hoisted", "shift", "div") if i != c.index]
    out = []
    for m in moves:
        try:
            n = c.replace(**m)
        except (InvalidConfig, ValueError, TypeError):
            continue
        if n != c and n not in out:
            out.append(n)
    return out


def study_name(gpu_name: str, problem: Problem) -> str:
    return f"nf4-tune/{gpu_name}/{problem.label().replace(' ', '/')}"


@dataclass
class TrialOutcome:
    """What measuring one config gave: a time, or why it is invalid. ``results`` holds the
    BenchResult dicts to store (the candidate and the references it was timed with)."""

    status: str                       # "ok" or "invalid"
    median_us: Optional[float] = None
    reason: str = ""
    results: list = field(default_factory=list)
    gpu_state: dict = field(default_factory=dict)
    bnb_median_us: Optional[float] = None
    copy_gbps: Optional[float] = None


class Measurer(Protocol):
    def measure(self, problem: Problem, config: KernelConfig) -> TrialOutcome: ...


def make_sampler(name: str, seed: Optional[int]):
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=True, group=False)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(SEARCH_SPACE, seed=seed)
    raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def grid_size() -> int:
    return math.prod(len(v) for v in SEARCH_SPACE.values())


@dataclass
class SearchSummary:
    problem: Problem
    study: str
    trials: int                       # finished trials in the study
    new_trials: int                   # finished by this call
    measured: int                     # of those, measured on the GPU (the rest came from the database)
    best_config: Optional[KernelConfig]
    best_us: Optional[float]
    best_result: Optional[dict]
    blog_us: Optional[float]
    seconds: float


def _storage(url: str, attempts: int = 8):
    """optuna's RDB storage on ``url``. Workers that start together on a fresh database race to
    create optuna's tables; the loser retries and finds them made."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    for i in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except (SQLAlchemyError, RuntimeError):
            if i == attempts - 1:
                raise
            time.sleep(0.2 * (i + 1))


def _finished(study) -> list:
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.FAIL)]


def run_search(problem: Problem, *, repo, storage_url: str, gpu_name: str, run, measurer: Measurer,
               n_trials: int = 30, sampler: str = "tpe", seed: Optional[int] = None,
               timeout: Optional[float] = None, remeasure: bool = False,
               progress: Optional[Callable[[int, int, Optional[float], Optional[float]], None]] = None,
               template_hash: Optional[str] = None) -> SearchSummary:
    """Run (or resume) the study of ``problem`` until it holds ``n_trials`` finished trials
    (or ``timeout`` seconds pass). Every trial's measurement is stored through ``repo``."""
    import optuna
    from optuna.trial import TrialState

    from kernel_templates import template_hash as _th

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    th = template_hash or _th()
    name = study_name(gpu_name, problem)
    study = optuna.create_study(study_name=name, storage=_storage(storage_url), direction="minimize",
                                sampler=make_sampler(sampler, seed), load_if_exists=True)
    pdict = dict(shape=tuple(problem.shape), dtype=problem.dtype, quant=problem.quant, blocksize=problem.blocksize)
    if not study.get_trials(deepcopy=False):
        # start from known good points: the presets and the best of the nearest tuned problem
        starts = [preset(n, problem.dtype, problem.quant) for n in PRESETS]
        starts.insert(0, builtin_default(problem.dtype, problem.quant))
        near = nearest_best(repo, gpu_name, problem)
        if near is not None:
            starts.insert(0, near)
        for c in dict.fromkeys(starts):
            study.enqueue_trial(params_from_config(c), skip_if_exists=True)
    limit = min(n_trials, grid_size()) if sampler == "grid" else n_trials
    t0 = time.perf_counter()
    new = measured = 0
    best_us = None
    bnb_seen: list = []   # bnb's median of each trial measured here: their median is the x-bnb basis
    while True:
        done = len(_finished(study))
        if done >= limit or (timeout is not None and time.perf_counter() - t0 > timeout):
            break
        if sampler != "grid" and limit - done <= refine_trials(limit):
            _enqueue_refinement(study, problem)
        trial = study.ask({k: optuna.distributions.CategoricalDistribution(v) for k, v in SEARCH_SPACE.items()})
        config = config_from_params(trial.params, problem.dtype, problem.quant)
        trial.set_user_attr("config", config.to_json())
        stored = None if remeasure else repo.measurement_of(gpu_name, pdict, config.to_dict(), th)
        if stored is not None:
            outcome = TrialOutcome(stored.status, stored.median_us, stored.reason)
            trial.set_user_attr("from_database", True)
        else:
            try:
                outcome = measurer.measure(problem, config)
            except KeyboardInterrupt:
                study.tell(trial, state=TrialState.FAIL)
                raise
            measured += 1
            row = repo.config(config.to_dict(), th)
            for r in outcome.results:
                repo.add_measurement(run, pdict, r, row if r.get("config") else None, gpu_state=outcome.gpu_state,
                                     bnb_median_us=outcome.bnb_median_us)
        try:
            trial.set_user_attr("status", outcome.status)
            if outcome.status == "ok" and outcome.median_us is not None:
                study.tell(trial, outcome.median_us)
            else:
                trial.set_user_attr("reason", (outcome.reason or "")[:2000])
                study.tell(trial, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            # two workers popped the same enqueued trial (a storage race): the other one told it;
            # this measurement is stored all the same
            continue
        new += 1
        try:
            best_us = study.best_value
        except ValueError:
            best_us = None
        if outcome.bnb_median_us:
            bnb_seen.append(outcome.bnb_median_us)
        if progress:
            progress(len(_finished(study)), limit, best_us, statistics.median(bnb_seen) if bnb_seen else None)
    best = repo.best(gpu_name, pdict)
    best_config = KernelConfig.from_dict(best[0]) if best else None
    blog = repo.measurement_of(gpu_name, pdict, preset("blog", problem.dtype, problem.quant).to_dict(), th)
    # x bnb against the median of bnb's medians over every trial of this problem (one trial's bnb
    # median alone varies by more than the kernels being compared)
    bnb_all = repo.reference_medians(gpu_name, pdict, "bnb dequantize_4bit")
    bnb_us = statistics.median(bnb_all) if bnb_all else None
    return SearchSummary(problem=problem, study=name, trials=len(_finished(study)), new_trials=new, measured=measured,
                         best_config=best_config, best_us=best[1].median_us if best else None,
                         best_result=dict(median_us=best[1].median_us, gbps=best[1].gbps, pct_copy=best[1].pct_copy,
                                          speedup=(bnb_us / best[1].median_us) if best and bnb_us else None,
                                          speedup_same_trial=best[1].speedup) if best else None,
                         blog_us=blog.median_us if blog is not None and blog.status == "ok" else None,
                         seconds=time.perf_counter() - t0)


def refine_trials(n_trials: int) -> int:
    """How many of a search's last trials are local refinement around the best (a third)."""
    return n_trials // 3


def builtin_default(dtype: str, quant: str) -> KernelConfig:
    """The runtime's built-in default for the dtype: the family the H200 searches found best."""
    from .runtime import BUILTIN_DEFAULTS

    return KernelConfig.from_dict(dict(BUILTIN_DEFAULTS[dtype], dtype=dtype, quant=quant))


def _enqueue_refinement(study, problem: Problem) -> None:
    """Queue the first untried neighbour of the study's best config (greedy local search: the
    next call sees the new best if this one wins)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    tried = {tuple(sorted(t.params.items())) for t in trials if t.params}
    tried |= {tuple(sorted(t.system_attrs.get("fixed_params", {}).items())) for t in trials
              if t.state == TrialState.WAITING}
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    if not done:
        return
    best = min(done, key=lambda t: t.value)
    c = config_from_params(best.params, problem.dtype, problem.quant)
    for n in neighbours(c):
        p = params_from_config(n)
        if tuple(sorted(p.items())) not in tried:
            study.enqueue_trial(p, skip_if_exists=True)
            return


def _distance(a: dict, b: Problem) -> float:
    na, nb = math.prod(a["shape"]), b.numel
    d = abs(math.log(na / nb))
    d += 0.0 if a["dtype"] == b.dtype else 10.0
    d += 0.0 if a["quant"] == b.quant else 5.0
    d += 0.0 if a["blocksize"] == b.blocksize else 1.0
    return d


def nearest_best(repo, gpu_name: str, problem: Problem) -> Optional[KernelConfig]:
    """The best stored config of the nearest other problem on this GPU model, converted to this
    problem's dtype and quant type."""
    others = [p for g, p in repo.problems(gpu_name) if g == gpu_name and p != dict(
        shape=tuple(problem.shape), dtype=problem.dtype, quant=problem.quant, blocksize=problem.blocksize)]
    if not others:
        return None
    near = min(others, key=lambda p: _distance(p, problem))
    best = repo.best(gpu_name, near)
    if best is None:
        return None
    return KernelConfig.from_dict(dict(best[0], dtype=problem.dtype, quant=problem.quant))
