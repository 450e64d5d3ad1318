"""Get the data: everything the report shows, as plain Python values (read through db.Repository)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tuner.families import FAMILIES
from tuner.vocabulary import speedup


@dataclass
class ReportData:
    overview: list = field(default_factory=list)     # one row per GPU x problem
    history: dict = field(default_factory=dict)      # (gpu, problem label) -> list of run points
    studies: list = field(default_factory=list)      # optuna studies: name, trials
    knob_speed: list = field(default_factory=list)   # (problem label, knob, value, best us)
    environments: list = field(default_factory=list)
    flags: list = field(default_factory=list)        # every nightly verdict, oldest first


def _peer_label(problem) -> str:
    fam = FAMILIES.get(problem.family)
    return fam.peer_label if fam else "bnb"


def collect(repo, storage_url: str = None) -> ReportData:
    """Read the report's data out of ``repo`` (and its optuna studies)."""
    data = ReportData()
    rows = repo.report_rows()
    latest_flag: dict = {}
    flags_by_run: dict = {}
    for f in rows["flags"]:
        label = f["problem"].label()
        row = dict(f, problem=label)
        data.flags.append(row)
        latest_flag[(f["gpu"], label)] = row
        flags_by_run[(f["gpu"], label, f["run"])] = row
    per_problem: dict = {}
    for m in rows["measurements"]:
        per_problem.setdefault((m["gpu"], m["problem"]), []).append(m)
    for (gname, problem), items in sorted(per_problem.items(), key=lambda kv: (kv[0][0], kv[0][1].sort_key())):
        label = problem.label()
        peer = _peer_label(problem)
        ok = [m for m in items if m["status"] == "ok" and m["config"]]
        bnb = [m for m in items if m["label"] == peer and m["median_us"]]
        best = min(ok, key=lambda m: m["median_us"]) if ok else None
        bnb_us = statistics.median(b["median_us"] for b in bnb) if bnb else None
        invalid = sum(1 for m in items if m["status"] == "invalid")
        data.overview.append(dict(
            gpu=gname, problem=label, family=problem.family, best_us=best["median_us"] if best else None,
            bnb_us=bnb_us,
            # against the median of every peer measurement of the problem: one trial's peer
            # median alone varies more than the kernels compared
            speedup=speedup(bnb_us, best["median_us"]) if best else None,
            pct_copy=best["pct_copy"] if best else None,
            config=best["config"] if best else None, measured=len(ok), invalid=invalid,
            status="ok" if best and bnb_us and best["median_us"] <= bnb_us else (
                "no valid config" if not best else "slower than bnb"),
            nightly=latest_flag.get((gname, label))))
        points = {}
        for m in ok:
            p = points.setdefault(m["run"], dict(run=m["run"], kind=m["run_kind"], started=str(m["started"]),
                                                 tuned_us=None, iqr=None))
            if p["tuned_us"] is None or m["median_us"] < p["tuned_us"]:
                p["tuned_us"], p["iqr"] = m["median_us"], m["iqr_us"]
        for m in items:
            if m["label"] == peer and m["run"] in points:
                points[m["run"]]["bnb_us"] = m["median_us"]
        for run_id, p in points.items():
            f = flags_by_run.get((gname, label, run_id))
            if f is not None:
                p["flag"] = f["flag"]
                if f["tuned_us"] is not None:   # the nightly point is the judged measurement
                    p["tuned_us"] = f["tuned_us"]
        data.history[(gname, label)] = [points[k] for k in sorted(points)]
        for m in ok:
            for knob, value in m["config"].items():
                if knob in ("dtype", "quant"):
                    continue
                data.knob_speed.append((label, knob, str(value), m["median_us"]))
    for r in rows["runs"]:
        data.environments.append(dict(r, started=str(r["started"]), ended=str(r["ended"])))
    data.studies = _studies(repo)
    return data


def _studies(repo) -> list:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = []
    try:
        storage = repo.db.optuna_storage()
        if storage is None:
            return out
        summaries = optuna.get_all_study_summaries(storage=storage)
    except Exception:  # a database without optuna tables holds no studies
        return out
    for summ in summaries:
        study = optuna.load_study(study_name=summ.study_name, storage=storage)
        trials = []
        for t in study.get_trials(deepcopy=False):
            if t.state not in (TrialState.COMPLETE, TrialState.FAIL):
                continue
            trials.append(dict(number=t.number, value=t.value, state=t.state.name, params=dict(t.params),
                               reason=t.user_attrs.get("reason", "")))
        out.append(dict(name=summ.study_name, trials=trials, importance=_importance(study)))
    return out


def _importance(study) -> dict:
    """optuna's parameter importances (fANOVA) of a study; empty when it cannot be computed
    (too few finished trials, a single distinct value)."""
    import optuna

    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
    except Exception:
        return {}
