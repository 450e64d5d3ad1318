"""The nightly regression job: re-measure every stored best config on this GPU, store the run,
judge each problem against its history (:mod:`nf4tune.track.regression`), store the verdicts.

``run_regress`` is the library call behind ``nf4-tune regress``; the measurement is a parameter
(default :func:`nf4tune.measure.bench.bench_problem`, the shared harness: gate, then the config timed
interleaved with bnb), so the orchestration is tested on the CPU with a test double.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..families import get as get_family
from ..measure.record import environment_versions, record_report, recorded_run
from ..vocabulary import FAILING_FLAGS, NOISY_REFERENCE, Problem
from .regression import NOT_JUDGED, Night, Verdict, judge

__all__ = ["ProblemVerdict", "RegressResult", "run_regress", "FAILING_FLAGS"]


@dataclass
class ProblemVerdict:
    gpu: str
    problem: str
    config: str
    flag: str
    tuned_us: Optional[float]
    bnb_us: Optional[float]
    speedup: Optional[float]
    baseline_speedup: Optional[float]
    drop: Optional[float]
    threshold: Optional[float]
    p_value: Optional[float]
    reason: str
    changes: dict = field(default_factory=dict)


@dataclass
class RegressResult:
    run_id: int
    verdicts: list

    @property
    def failed(self) -> list:
        return [v for v in self.verdicts if v.flag in FAILING_FLAGS]

    @property
    def not_judged(self) -> list:
        """Problems whose night was not judged (a disturbed reference, an environment off)."""
        return [v for v in self.verdicts if v.flag in NOT_JUDGED]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def _config_label(family, knobs) -> str:
    if knobs is None:
        return "none"
    d = json.loads(knobs) if isinstance(knobs, str) else knobs
    try:
        return family.from_dict(d).short()
    except Exception:
        return json.dumps(d, sort_keys=True)


def timing_mode(text: Optional[str]) -> str:
    """``graph`` or ``direct`` out of a peer's timing (``direct (why not graph)``, or a stored
    reference's reason ``timing: ...``); ``direct`` where none was recorded (the harness timed
    bnb by direct calls before it used graphs)."""
    text = (text or "").removeprefix("timing:").strip()
    return "graph" if text == "graph" else "direct"


def _night_of(report, tuned_label: str, peer_label: str, env: dict) -> tuple[Night, object]:
    """(Night, the tuned result) out of a :class:`nf4tune.measure.bench.ProblemReport`."""
    tuned = report.result(tuned_label)
    peer = report.result(peer_label)
    st = report.gpu_after or {}
    env = dict(env, bnb_timing=timing_mode(getattr(report, "bnb_timing", "")))
    night = Night(tuned_us=list(tuned.samples_us), bnb_us=list(peer.samples_us), gate_ok=tuned.status == "ok",
                  env=env, sm_clock_mhz=st.get("sm_clock_mhz"), max_sm_clock_mhz=st.get("max_sm_clock_mhz"),
                  temperature_c=st.get("temperature_c"))
    return night, tuned


def _history(repo, gpu_name: str, problem: Problem, family) -> list[Night]:
    nights = []
    for h in repo.regress_history(gpu_name, problem, family.peer_label):
        env = dict(h["env"], config=_config_label(family, h["config"]), bnb_timing=timing_mode(h.get("bnb_reason")))
        nights.append(Night(tuned_us=h["tuned_us"] or [float("nan")], bnb_us=h["bnb_us"] or [float("nan")],
                            gate_ok=h["flag"] != "broken", env=env, verdict=h["flag"]))
    return nights


def run_regress(repo, gpu, measure: Optional[Callable] = None, remeasure: bool = True, command: str = "",
                progress: Optional[Callable[[int, int, str], None]] = None, env: Optional[dict] = None) -> RegressResult:
    """Re-measure and judge every problem with a stored best config for ``gpu``'s model.

    ``measure(problem, [(label, config)])`` returns a :class:`nf4tune.measure.bench.ProblemReport`
    holding that config and the family's peer (interleaved raw samples); ``gpu`` is a
    :class:`nf4tune.kernel.gpu.GPUInfo`. A first significant drop is re-measured at once; if the
    drop persists there the verdict is ``regression`` the same night."""
    if measure is None:
        from ..measure.bench import bench_problem

        def measure(problem, candidates):
            return bench_problem(problem, candidates, time_cap_s=1.5)

    env = dict(env) if env is not None else environment_versions(gpu.driver_version)
    problems = repo.problems(gpu.name)
    verdicts = []
    with recorded_run("regress", None, gpu, command=command, env=env, repo=repo) as rec:
        for i, (gname, problem) in enumerate(problems):
            family = get_family(problem.family)
            knobs, _, _ = repo.best(gname, problem)
            config = family.from_dict(knobs)
            if progress:
                progress(i, len(problems), problem.label())
            label = f"nightly: {config.short()}"
            night_env = dict(env, config=config.short())
            history = _history(repo, gname, problem, family)
            report = measure(problem, [(label, config)])
            stored = record_report(repo, rec.run, report)
            night, tuned = _night_of(report, label, family.peer_label, night_env)
            verdict = judge(history, night)
            if verdict.flag == NOISY_REFERENCE and remeasure:
                # a disturbed reference: measure once more and judge that measurement if its
                # reference is sound (else the night stays not judged)
                again_label = label + " (re-measure: noisy reference)"
                again = measure(problem, [(again_label, config)])
                stored_again = record_report(repo, rec.run, again)
                second, tuned2 = _night_of(again, again_label, family.peer_label, night_env)
                v2 = judge(history, second)
                if v2.flag != NOISY_REFERENCE:
                    night, tuned, verdict, label = second, tuned2, v2, again_label
                    stored = stored_again
                    v2.reason = "; ".join(r for r in (v2.reason, "judged on a re-measurement: the first one's "
                                                      "reference was disturbed") if r)
            if verdict.flag == "suspicious" and remeasure:
                again = measure(problem, [(label + " (re-measure)", config)])
                record_report(repo, rec.run, again)
                second, _ = _night_of(again, label + " (re-measure)", family.peer_label, night_env)
                verdict = judge(history, night, remeasure=second)
            vd = _verdict_dict(verdict)
            repo.add_flag(rec.run, problem, vd, stored.get(label))
            tuned_us = tuned.median_us if tuned.status == "ok" else None
            bnb_us = statistics.median(night.bnb_us) if night.bnb_us else None
            verdicts.append(ProblemVerdict(gname, problem.label(), config.short(), verdict.flag, tuned_us, bnb_us,
                                           verdict.speedup, verdict.baseline_speedup, verdict.drop, verdict.threshold,
                                           verdict.p_value,
                                           verdict.reason or (tuned.reason if tuned.status != "ok" else ""),
                                           vd["changes"]))
        if progress:
            progress(len(problems), len(problems), "")
    return RegressResult(rec.run.id, verdicts)


def _verdict_dict(v: Verdict) -> dict:
    return dict(flag=v.flag, speedup=v.speedup, baseline_speedup=v.baseline_speedup, drop=v.drop,
                threshold=v.threshold, p_value=v.p_value, reason=v.reason,
                changes={k: [a, b] for k, (a, b) in v.changes.items()})
