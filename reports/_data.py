"""Get the data: everything the report shows, as plain Python values."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from sqlalchemy import select


@dataclass
class ReportData:
    overview: list = field(default_factory=list)     # one row per GPU x problem
    history: dict = field(default_factory=dict)      # (gpu, problem label) -> list of run points
    studies: list = field(default_factory=list)      # optuna studies: name, trials
    knob_speed: list = field(default_factory=list)   # (problem label, knob, value, best us)
    environments: list = field(default_factory=list)
    flags: list = field(default_factory=list)        # every nightly verdict, oldest first


def _label(m) -> str:
    return f"{m.shape} {m.dtype} {m.quant} bs{m.blocksize}"


def collect(repo, storage_url: str = None) -> ReportData:
    """Read the report's data out of ``repo`` (and the optuna studies at ``storage_url``)."""
    from db._models import GPU, Environment, Flag, KernelConfigRow, Measurement, Run

    data = ReportData()
    with repo.db.session() as s:
        rows = s.execute(select(Measurement, Run, GPU, KernelConfigRow.knobs)
                         .join(Run, Measurement.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                         .outerjoin(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                         .order_by(Measurement.id)).all()
        envs = {e.id: e for e in s.scalars(select(Environment))}
        runs = list(s.scalars(select(Run).order_by(Run.id)))
        flag_rows = s.execute(select(Flag, GPU.name, Measurement.median_us, Measurement.bnb_median_us,
                                     KernelConfigRow.knobs)
                              .join(Run, Flag.run_id == Run.id).join(GPU, Run.gpu_id == GPU.id)
                              .outerjoin(Measurement, Flag.measurement_id == Measurement.id)
                              .outerjoin(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                              .order_by(Flag.id)).all()
    latest_flag: dict = {}
    flags_by_run: dict = {}
    for f, gname, tuned_us, bnb_us, knobs in flag_rows:
        label = f"{f.shape} {f.dtype} {f.quant} bs{f.blocksize}"
        row = dict(gpu=gname, problem=label, run=f.run_id, flag=f.flag, tuned_us=tuned_us, bnb_us=bnb_us,
                   speedup=f.speedup, baseline_speedup=f.baseline_speedup, drop=f.drop, threshold=f.threshold,
                   p_value=f.p_value, changes=f.changes or {}, reason=f.reason,
                   config=json.loads(knobs) if knobs else None)
        data.flags.append(row)
        latest_flag[(gname, label)] = row
        flags_by_run[(gname, label, f.run_id)] = row
    per_problem: dict = {}
    for m, run, gpu, knobs in rows:
        key = (gpu.name, _label(m))
        per_problem.setdefault(key, []).append((m, run, knobs))
    for (gname, label), items in sorted(per_problem.items()):
        ok = [(m, r, k) for m, r, k in items if m.status == "ok" and k]
        bnb = [m for m, _, _ in items if m.label == "bnb dequantize_4bit" and m.median_us]
        best = min(ok, key=lambda t: t[0].median_us) if ok else None
        invalid = sum(1 for m, _, _ in items if m.status == "invalid")
        data.overview.append(dict(
            gpu=gname, problem=label, best_us=best[0].median_us if best else None,
            bnb_us=statistics.median(b.median_us for b in bnb) if bnb else None,
            # against the median of every bnb measurement of the problem: one trial's bnb
            # median alone varies more than the kernels compared
            speedup=(statistics.median(b.median_us for b in bnb) / best[0].median_us) if best and bnb else None,
            pct_copy=best[0].pct_copy if best else None,
            config=json.loads(best[2]) if best else None, measured=len(ok), invalid=invalid,
            status="ok" if best and bnb and best[0].median_us <= statistics.median(b.median_us for b in bnb) else ("no valid config" if not best else "slower than bnb"),
            nightly=latest_flag.get((gname, label))))
        points = {}
        for m, r, k in ok:
            p = points.setdefault(r.id, dict(run=r.id, kind=r.kind, started=str(r.started_at), tuned_us=None, iqr=None))
            if p["tuned_us"] is None or m.median_us < p["tuned_us"]:
                p["tuned_us"], p["iqr"] = m.median_us, m.iqr_us
        for m, r, _ in items:
            if m.label == "bnb dequantize_4bit" and r.id in points:
                points[r.id]["bnb_us"] = m.median_us
        for run_id, p in points.items():
            f = flags_by_run.get((gname, label, run_id))
            if f is not None:
                p["flag"] = f["flag"]
                if f["tuned_us"] is not None:   # the nightly point is the judged measurement
                    p["tuned_us"] = f["tuned_us"]
        data.history[(gname, label)] = [points[k] for k in sorted(points)]
        for m, _, k in ok:
            for knob, value in json.loads(k).items():
                if knob in ("dtype", "quant"):
                    continue
                data.knob_speed.append((label, knob, str(value), m.median_us))
    for r in runs:
        e = envs.get(r.environment_id)
        data.environments.append(dict(run=r.id, kind=r.kind, started=str(r.started_at), ended=str(r.ended_at),
                                      **({k: getattr(e, k) for k in ("project_version", "git_commit", "nvrtc",
                                                                      "driver", "cuda_python", "bnb", "torch")}
                                         if e else {})))
    if storage_url:
        data.studies = _studies(storage_url)
    return data


def _studies(url: str) -> list:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = []
    try:
        summaries = optuna.get_all_study_summaries(storage=url)
    except Exception:  # a database without optuna tables holds no studies
        return out
    for summ in summaries:
        study = optuna.load_study(study_name=summ.study_name, storage=url)
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
