"""Get the data: everything the report shows, as plain Python values (read through db.Repository).

What the report answers first is "what regressed, since when, and why?", so the unit is the
nightly verdict of one GPU x problem:

- the **status** of a problem is its latest night's verdict (never the best time ever stored,
  which a fake or stale entry can make look good), shown as a noisy reference instead of "ok"
  when that night's peer (bnb) measurement was far noisier than the problem's other nights;
- the best time ever stored against the peer is its own, labelled column, and a "median" made
  of fewer than :data:`MIN_SAMPLES` samples (a planted or hand-entered value) is marked as such
  and never feeds the knob heatmap;
- every run has a block: its command, what changed against its baseline (the environment and
  the configs), and the labels of what it measured.

Nothing here assumes one kernel family: the peer and the ceiling of a problem come from its
family's declaration (:data:`nf4tune.families.FAMILIES`), or a generic bnb reference for a family
this version does not know.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from nf4tune.db import ENV_FIELDS
from nf4tune.families import FAMILIES
from nf4tune.vocabulary import FAILING_FLAGS, FLAGS, NOISY_REFERENCE, speedup

#: a median of fewer samples is not a measurement (ci/plant_slow_config.py stores one sample)
MIN_SAMPLES = 3
#: a night's peer is noisy when its relative IQR is above this many times the median relative
#: IQR of the problem's other nights, and above NOISY_FLOOR
NOISY_FACTOR = 3.0
NOISY_FLOOR = 0.10
#: the baseline band of the x-peer panel: the last good nights before each night (the nightly
#: judge's rolling window, nf4tune.track.regression.BASELINE_NIGHTS)
BASELINE_NIGHTS = 10
#: the status of a problem that no night has judged
NOT_JUDGED = "not judged"
#: ... and of one without a single valid config
NO_VALID = "no valid config"

# severity of a displayed status, worst highest (FLAGS is mildest first)
_RANK = {f: i for i, f in enumerate(FLAGS)}
_RANK[NO_VALID] = _RANK["broken"]
_RANK[NOT_JUDGED] = -1


def rank(status: str) -> int:
    """How bad a displayed status is (higher is worse); an unknown flag ranks as suspicious."""
    return _RANK.get(status, _RANK["suspicious"])


def status_kind(status: Optional[str]) -> str:
    """``bad`` (fails a night), ``warn``, ``ok`` or ``none``: the colour class of a status."""
    if status in FAILING_FLAGS or status == NO_VALID:
        return "bad"
    if status == "ok":
        return "ok"
    if status in (None, NOT_JUDGED):
        return "none"
    return "warn"


@dataclass
class ReportData:
    meta: dict = field(default_factory=dict)          # generated, database, gpus, families
    overview: list = field(default_factory=list)      # one row per GPU x problem, worst first
    counts: dict = field(default_factory=dict)        # status -> problems, of the latest nights
    flags: list = field(default_factory=list)         # every nightly verdict, oldest first
    history: dict = field(default_factory=dict)       # problem key -> dict(nights, others)
    runs: list = field(default_factory=list)          # one block per run, oldest first
    studies: list = field(default_factory=list)       # optuna studies: name, trials, importance
    knob_speed: list = field(default_factory=list)    # (problem sort key, label, knob, value, us)
    families: list = field(default_factory=list)      # one entry per family present
    batch_curves: list = field(default_factory=list)  # per GPU x family x shape: x peer against the batch m
    unreadable: list = field(default_factory=list)    # rows whose problem could not be read


# -- small helpers ---------------------------------------------------------------------------
def _when(t) -> Optional[str]:
    """A run's time as ``YYYY-MM-DD HH:MM:SS.mmm`` (UTC, as stored; runs a second apart stay
    apart on a date axis), or None."""
    if t is None:
        return None
    if isinstance(t, dt.datetime):
        return t.strftime("%Y-%m-%d %H:%M:%S.%f")[:23]
    return str(t)


def _finite(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _slug(text: str, seen: set) -> str:
    """A stable anchor id for ``text``: lower-case letters, digits and dashes; unique in ``seen``."""
    base = "p-" + (re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "x")
    slug, n = base, 2
    while slug in seen:
        slug, n = f"{base}-{n}", n + 1
    seen.add(slug)
    return slug


def config_label(family: str, knobs) -> Optional[str]:
    """A config's short label in its family's words; ``knob=value`` pairs when the family is
    unknown or the knobs are not a config of it."""
    if knobs is None:
        return None
    fam = FAMILIES.get(family)
    if fam is not None and isinstance(knobs, dict):
        try:
            return fam.from_dict(knobs).short()
        except Exception:
            pass
    if isinstance(knobs, dict):
        return " ".join(f"{k}={v}" for k, v in sorted(knobs.items(), key=lambda kv: str(kv[0])))
    return str(knobs)


def knob_diff(before, after) -> dict:
    """``{knob: [before, after]}`` for every knob that differs (values as given)."""
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
    return {str(k): [before.get(k), after.get(k)] for k in sorted(set(before) | set(after), key=str)
            if before.get(k) != after.get(k)}


def _peer_label(problem, items: list) -> tuple[str, str]:
    """(label the peer's measurements carry, the name shown) for a problem: its family's
    declared peer, or, for a family this version does not know, the most frequent reference
    whose label starts with "bnb"."""
    fam = FAMILIES.get(problem.family)
    if fam is not None and fam.peer_label:
        return fam.peer_label, fam.peer_label
    refs = Counter(m["label"] for m in items if m["status"] == "reference" and str(m["label"]).startswith("bnb"))
    if refs:
        label = sorted(refs.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))[0][0]
        return label, label
    return "bnb", "bnb"


def _family_entry(name: str, peer_shown: str) -> dict:
    fam = FAMILIES.get(name)
    return dict(name=name, known=fam is not None, title=getattr(fam, "title", "") if fam else "",
                peer=fam.peer_label if fam else peer_shown, ceiling=fam.ceiling_label if fam else "ceiling")


def _rel_iqr(m) -> Optional[float]:
    if not m or not m.get("median_us") or m.get("iqr_us") is None:
        return None
    return m["iqr_us"] / m["median_us"]


# -- the nights of one problem -----------------------------------------------------------------
def _nights(flags: list, by_run: dict, runs: dict, peer: str, family: str) -> list:
    """One record per nightly verdict of a problem, oldest first, with its peer measurement,
    the noisy-reference reading and the baseline band."""
    nights = []
    for f in sorted(flags, key=lambda f: (f["run"], f["id"])):
        here = by_run.get(f["run"], [])
        peer_m = next((m for m in here if m["label"] == peer and m["median_us"]), None)
        tuned_m = next((m for m in here if m["id"] == f["measurement_id"]), None)
        run = runs.get(f["run"], {})
        tuned_us = f["tuned_us"]
        x = f["speedup"] if f["speedup"] is not None else speedup(peer_m["median_us"] if peer_m else None, tuned_us)
        nights.append(dict(
            run=f["run"], date=_when(run.get("started")), commit=run.get("git_commit"), flag=f["flag"],
            status=f["flag"], tuned_us=tuned_us, tuned_iqr_us=f["tuned_iqr_us"],
            tuned_samples=len(tuned_m["samples_us"]) if tuned_m else None,
            peer_us=peer_m["median_us"] if peer_m else None, peer_iqr_us=peer_m["iqr_us"] if peer_m else None,
            peer_rel_iqr=_rel_iqr(peer_m), speedup=x, baseline_speedup=f["baseline_speedup"], drop=f["drop"],
            threshold=f["threshold"], p_value=f["p_value"], reason=f["reason"] or "",
            changes=f["changes"] if isinstance(f["changes"], dict) else {"changes": [None, str(f["changes"])]},
            config=f["config"], config_label=config_label(family, f["config"]),
            pct_ceiling=tuned_m["pct_copy"] if tuned_m else None, noisy=False, typical_rel_iqr=None,
            band_lo=None, band_hi=None, limit_speedup=None, window_start=None))
    for i, n in enumerate(nights):
        others = [o["peer_rel_iqr"] for j, o in enumerate(nights) if j != i and o["peer_rel_iqr"] is not None]
        if others and n["peer_rel_iqr"] is not None:
            typical = statistics.median(others)
            n["typical_rel_iqr"] = typical
            n["noisy"] = n["peer_rel_iqr"] > max(NOISY_FACTOR * typical, NOISY_FLOOR)
        elif n["peer_rel_iqr"] is not None:
            n["noisy"] = n["peer_rel_iqr"] > 2.5 * NOISY_FLOOR
        if n["flag"] == NOISY_REFERENCE or (n["noisy"] and n["flag"] == "ok"):
            n["status"] = NOISY_REFERENCE
            n["noisy"] = True
        good = [o for o in nights[:i] if o["flag"] == "ok" and not o["noisy"] and o["speedup"]]
        good = good[-BASELINE_NIGHTS:]
        if good and n["baseline_speedup"] is not None:
            n["band_lo"], n["band_hi"] = min(o["speedup"] for o in good), max(o["speedup"] for o in good)
            n["window_start"] = good[0]["date"]
        if n["baseline_speedup"] is not None and n["threshold"] is not None:
            n["limit_speedup"] = n["baseline_speedup"] * (1 - n["threshold"])
    return nights


def _other_points(items: list, runs: dict, family: str, peer: str) -> list:
    """The fastest config of each search or bench run of a problem (a history point beside the
    nights), with the label and the sample count that say whether it was measured."""
    best: dict = {}
    for m in items:
        if m["run_kind"] == "regress" or m["status"] != "ok" or not m["config"] or m["median_us"] is None:
            continue
        b = best.get(m["run"])
        if b is None or m["median_us"] < b["median_us"]:
            best[m["run"]] = m
    peers: dict = {}
    for m in items:
        if m["label"] == peer and m["median_us"]:
            peers.setdefault(m["run"], []).append(m["median_us"])
    out = []
    for run_id in sorted(best):
        m = best[run_id]
        run = runs.get(run_id, {})
        # the peer measured in the same run (the median of its medians), else the one stored beside
        peer_us = statistics.median(peers[run_id]) if run_id in peers else m["bnb_median_us"]
        out.append(dict(run=run_id, kind=m["run_kind"], date=_when(run.get("started")), commit=run.get("git_commit"),
                        tuned_us=m["median_us"], tuned_iqr_us=m["iqr_us"], label=m["label"],
                        samples=len(m["samples_us"]), measured=len(m["samples_us"]) >= MIN_SAMPLES,
                        peer_us=peer_us, speedup=speedup(peer_us, m["median_us"]),
                        config=m["config"], config_label=config_label(family, m["config"])))
    return out


# -- runs ------------------------------------------------------------------------------------------
def _run_blocks(runs: list, flags: list, meas: list, keys: dict, night_status: dict) -> list:
    """One block per run: command, environment, the baseline it is compared with, the env and
    config diffs against it, its verdicts and the labels of what it measured."""
    flags_of: dict = {}
    for f in flags:
        flags_of.setdefault(f["run"], []).append(f)
    meas_of: dict = {}
    for m in meas:
        meas_of.setdefault(m["run"], []).append(m)

    def configs(run_id) -> dict:
        """(gpu, problem) -> the config this run stands for: the judged one of a night, else
        the fastest valid one it measured."""
        out = {}
        for f in flags_of.get(run_id, []):
            if f["config"] is not None:
                out[(f["gpu"], f["problem"])] = f["config"]
        fastest: dict = {}
        for m in meas_of.get(run_id, []):
            k = (m["gpu"], m["problem"])
            if k in out or m["status"] != "ok" or not m["config"] or m["median_us"] is None:
                continue
            if k not in fastest or m["median_us"] < fastest[k]["median_us"]:
                fastest[k] = m
        out.update({k: m["config"] for k, m in fastest.items()})
        return out

    def clean(run_id) -> bool:
        statuses = [night_status.get((f["gpu"], f["problem"], run_id), f["flag"]) for f in flags_of.get(run_id, [])]
        return bool(statuses) and all(s in ("ok", NOISY_REFERENCE) for s in statuses)

    blocks = []
    for i, r in enumerate(runs):
        earlier = [o for o in runs[:i] if o["gpu"] == r["gpu"]]
        nights = [o for o in earlier if o["kind"] == "regress" and clean(o["run"])]
        base, why = (nights[-1], "the last clean night") if nights else (
            (earlier[-1], "the previous run") if earlier else (None, ""))
        env = {k: r.get(k) for k in ENV_FIELDS}
        env_diff = {k: [base.get(k), r.get(k)] for k in ENV_FIELDS if base and base.get(k) != r.get(k)}
        mine = configs(r["run"])
        theirs = configs(base["run"]) if base else {}
        cdiff = []
        for (gname, prob), knobs in sorted(mine.items(), key=lambda kv: (kv[0][0], kv[0][1].sort_key())):
            before = theirs.get((gname, prob))
            if before is not None and before != knobs:
                cdiff.append(dict(gpu=gname, problem=prob.label(), key=keys.get((gname, prob)),
                                  before=config_label(prob.family, before), after=config_label(prob.family, knobs),
                                  knobs=knob_diff(before, knobs)))
        labels: dict = {}
        for m in meas_of.get(r["run"], []):
            e = labels.setdefault((m["label"], m["status"], m["reason"] or ""), dict(
                label=m["label"], status=m["status"], reason=m["reason"] or "", count=0, samples=len(m["samples_us"])))
            e["count"] += 1
            e["samples"] = min(e["samples"], len(m["samples_us"]))
        # what needs reading first: measurements with a reason or too few samples to be one
        ordered = sorted(labels.values(), key=lambda e: (not (e["reason"] or e["status"] == "ok"
                                                              and e["samples"] < MIN_SAMPLES),
                                                         e["status"] != "reference", str(e["label"])))
        verdicts = [dict(gpu=f["gpu"], problem=f["problem"].label(), key=keys.get((f["gpu"], f["problem"])),
                         flag=f["flag"], status=night_status.get((f["gpu"], f["problem"], r["run"]), f["flag"]))
                    for f in flags_of.get(r["run"], [])]
        verdicts.sort(key=lambda v: (-rank(v["status"]), v["problem"]))
        blocks.append(dict(run=r["run"], kind=r["kind"], started=_when(r["started"]), ended=_when(r["ended"]),
                           gpu=r["gpu"], compute_capability=r["compute_capability"], command=r["command"] or "",
                           env=env, baseline=base["run"] if base else None, baseline_why=why, env_diff=env_diff,
                           config_diff=cdiff, labels=ordered, measurements=len(meas_of.get(r["run"], [])),
                           verdicts=verdicts))
    return blocks


# -- the whole report ------------------------------------------------------------------------------
def collect(repo, storage_url: str = None, now: Optional[dt.datetime] = None) -> ReportData:
    """Read the report's data out of ``repo`` (and its optuna studies). ``storage_url`` is
    accepted for older callers and unused: the studies are read through ``repo``."""
    data = ReportData()
    rows = repo.report_rows()
    data.unreadable = rows.get("unreadable", [])
    runs = {r["run"]: r for r in rows["runs"]}
    per_problem: dict = {}
    for m in rows["measurements"]:
        per_problem.setdefault((m["gpu"], m["problem"]), []).append(m)
    flags_of: dict = {}
    for f in rows["flags"]:
        flags_of.setdefault((f["gpu"], f["problem"]), []).append(f)
    pairs = sorted(set(per_problem) | set(flags_of), key=lambda k: (k[1].family, k[0], k[1].sort_key()))
    seen: set = set()
    keys = {k: _slug(f"{k[0]} {k[1].label()}", seen) for k in pairs}

    families: dict = {}
    night_status: dict = {}
    for gname, problem in pairs:
        key = keys[(gname, problem)]
        items = per_problem.get((gname, problem), [])
        peer, peer_shown = _peer_label(problem, items)
        families.setdefault(problem.family, _family_entry(problem.family, peer_shown))
        by_run: dict = {}
        for m in items:
            by_run.setdefault(m["run"], []).append(m)
        nights = _nights(flags_of.get((gname, problem), []), by_run, runs, peer, problem.family)
        for n in nights:
            night_status[(gname, problem, n["run"])] = n["status"]
        others = _other_points(items, runs, problem.family, peer)
        data.history[key] = dict(gpu=gname, problem=problem.label(), family=problem.family, peer=peer_shown,
                                 nights=nights, others=others)

        ok = [m for m in items if m["status"] == "ok" and m["config"] and m["median_us"] is not None]
        measured = [m for m in ok if len(m["samples_us"]) >= MIN_SAMPLES]
        peer_all = [m["median_us"] for m in items if m["label"] == peer and m["median_us"]]
        peer_us = statistics.median(peer_all) if peer_all else None
        best = min(ok, key=lambda m: (m["median_us"], m["id"])) if ok else None
        best_measured = min(measured, key=lambda m: (m["median_us"], m["id"])) if measured else None
        last = nights[-1] if nights else None
        status = last["status"] if last else (NOT_JUDGED if ok else NO_VALID)
        family = FAMILIES.get(problem.family)
        data.overview.append(dict(
            key=key, gpu=gname, family=problem.family, problem=problem.label(), **_problem_fields(problem),
            peer=peer_shown, ceiling=family.ceiling_label if family else "ceiling", status=status,
            flag=last["flag"] if last else None, noisy=bool(last and last["noisy"]),
            night_run=last["run"] if last else None, night_date=last["date"] if last else None,
            tuned_us=last["tuned_us"] if last else None, tuned_iqr_us=last["tuned_iqr_us"] if last else None,
            peer_us=last["peer_us"] if last else None, peer_iqr_us=last["peer_iqr_us"] if last else None,
            speedup=last["speedup"] if last else None,
            baseline_speedup=last["baseline_speedup"] if last else None,
            drop=last["drop"] if last else None, threshold=last["threshold"] if last else None,
            p_value=last["p_value"] if last else None, reason=last["reason"] if last else "",
            changes=last["changes"] if last else {},
            config=last["config_label"] if last else (config_label(problem.family, best_measured["config"])
                                                      if best_measured else None),
            pct_ceiling=(last["pct_ceiling"] if last else None) or (best_measured["pct_copy"] if best_measured else None),
            best_us=best["median_us"] if best else None, best_label=best["label"] if best else None,
            best_run=best["run"] if best else None, best_samples=len(best["samples_us"]) if best else None,
            best_is_measured=bool(best and len(best["samples_us"]) >= MIN_SAMPLES),
            best_measured_us=best_measured["median_us"] if best_measured else None,
            peer_all_us=peer_us, best_speedup=speedup(peer_us, best["median_us"]) if best else None,
            best_measured_speedup=speedup(peer_us, best_measured["median_us"]) if best_measured else None,
            valid=len(ok), invalid=sum(1 for m in items if m["status"] == "invalid"),
            nights=len(nights), sort=(-rank(status), problem.sort_key(), gname)))
        skip = set(family.problem_knobs) if family else {"dtype", "quant"}
        for m in measured:
            if not isinstance(m["config"], dict):
                continue
            for knob, value in m["config"].items():
                if knob not in skip:
                    data.knob_speed.append((problem.sort_key(), problem.label(), str(knob), str(value), m["median_us"]))
    data.overview.sort(key=lambda r: r["sort"])
    for r in data.overview:
        del r["sort"]
    data.batch_curves = _batch_curves(data.overview)
    data.counts = dict(sorted(Counter(r["status"] for r in data.overview).items(), key=lambda kv: -rank(kv[0])))
    data.families = [families[k] for k in sorted(families)]

    for f in rows["flags"]:
        k = (f["gpu"], f["problem"])
        night = next(n for n in data.history[keys[k]]["nights"] if n["run"] == f["run"])
        data.flags.append(dict(
            run=f["run"], date=night["date"], gpu=f["gpu"], family=f["problem"].family, problem=f["problem"].label(),
            key=keys[k], flag=f["flag"], status=night["status"], speedup=night["speedup"],
            baseline_speedup=f["baseline_speedup"], drop=f["drop"], threshold=f["threshold"], p_value=f["p_value"],
            tuned_us=f["tuned_us"], peer_us=night["peer_us"], peer_iqr_us=night["peer_iqr_us"],
            peer_rel_iqr=night["peer_rel_iqr"], typical_rel_iqr=night["typical_rel_iqr"], reason=f["reason"] or "",
            changes=night["changes"], config=night["config_label"]))
    data.runs = _run_blocks(rows["runs"], rows["flags"], rows["measurements"], keys, night_status)
    gpus = sorted({(r["gpu"], r["compute_capability"]) for r in rows["runs"]})
    data.meta = dict(generated=(now or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC"),
                     database=repo.display_url, gpus=[dict(name=g, compute_capability=c) for g, c in gpus],
                     latest_night=max((f["run"] for f in rows["flags"]), default=None))
    if data.meta["latest_night"] is not None:
        data.meta["latest_night_date"] = _when(runs[data.meta["latest_night"]]["started"])
    data.studies = _studies(repo)
    return data


def _batch_curves(overview: list) -> list:
    """For families with a batch (the matmul family's m): per GPU x family x shape x dtype x
    quant x blocksize, the best measured x peer at each batch bucket, in m order."""
    groups: dict = {}
    for r in overview:
        if r.get("m") is None:
            continue
        k = (r["gpu"], r["family"], r["shape"], r["dtype"], r["quant"], r["blocksize"])
        groups.setdefault(k, []).append(r)
    out = []
    for (gpu, family, shape, dtype, quant, bs), rows in sorted(groups.items(), key=lambda kv: kv[0]):
        rows.sort(key=lambda r: r["m"])
        out.append(dict(gpu=gpu, family=family, label=f"{family} {shape} {dtype} {quant} bs{bs}", peer=rows[0]["peer"],
                        m=[r["m"] for r in rows], speedup=[r["best_measured_speedup"] for r in rows],
                        keys=[r["key"] for r in rows]))
    return out


def _problem_fields(problem) -> dict:
    return dict(shape=problem.shape_text, dtype=problem.dtype, quant=problem.quant, blocksize=problem.blocksize,
                m=problem.m)


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
    for summ in sorted(summaries, key=lambda s: str(s.study_name)):
        study = optuna.load_study(study_name=summ.study_name, storage=storage)
        trials = []
        for t in study.get_trials(deepcopy=False):
            if t.state not in (TrialState.COMPLETE, TrialState.FAIL):
                continue
            value = _finite(t.value) if t.state == TrialState.COMPLETE else None
            state = "complete" if value is not None else str(t.user_attrs.get("status") or "failed")
            if state == "ok":
                state = "failed"
            reason = str(t.user_attrs.get("reason") or "")
            if value is None and not reason:
                reason = "no value (the trial failed without a stored reason)"
            trials.append(dict(number=t.number, value=value, state=state,
                               params={str(k): str(v) for k, v in t.params.items()}, reason=reason))
        out.append(dict(name=str(summ.study_name), trials=trials, importance=_importance(study)))
    return out


def _importance(study) -> dict:
    """optuna's parameter importances (fANOVA) of a study; empty when it cannot be computed
    (too few finished trials, a single distinct value)."""
    import warnings

    import optuna

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # "too few trials": then the importances say so
            return {str(k): float(v) for k, v in optuna.importance.get_param_importances(study).items()}
    except Exception:
        return {}


def to_plain(value):
    """``value`` with every float made JSON-safe (NaN and infinities as None) and tuples as
    lists: what the JSON downloads and the page's embedded data are made of."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


__all__ = ["ReportData", "collect", "rank", "status_kind", "config_label", "knob_diff", "to_plain",
           "MIN_SAMPLES", "NOT_JUDGED", "NO_VALID"]
