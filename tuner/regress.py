"""The nightly regression job: re-measure every stored best config on this GPU, store the run,
judge each problem against its history (:mod:`tuner.regression`), store the verdicts.

``run_regress`` is the library call behind ``nf4-tune regress``; the measurement is a parameter
(default :func:`tuner.bench.bench_problem`, the shared harness: gate, then the config timed
interleaved with bnb), so the orchestration is tested on the CPU with a test double.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional

from .gate import Problem
from .regression import Night, Verdict, judge
from .space import KernelConfig

__all__ = ["ProblemVerdict", "RegressResult", "run_regress", "FAILING_FLAGS"]

#: flags that make the nightly job fail (exit 1)
FAILING_FLAGS = ("regression", "regression-vs-bnb", "broken")


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
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def _config_label(knobs) -> str:
    if knobs is None:
        return "none"
    d = json.loads(knobs) if isinstance(knobs, str) else knobs
    try:
        return KernelConfig.from_dict(d).short()
    except Exception:
        return json.dumps(d, sort_keys=True)


def _night_of(report, tuned_label: str, env: dict) -> tuple[Night, object]:
    """(Night, the tuned result) out of a :class:`tuner.bench.ProblemReport`."""
    from .bench import REF_BNB

    tuned = next(r for r in report.results if r.label == tuned_label)
    bnb = next(r for r in report.results if r.label == REF_BNB)
    st = report.gpu_after or {}
    night = Night(tuned_us=list(tuned.samples_us), bnb_us=list(bnb.samples_us), gate_ok=tuned.status == "ok",
                  env=env, sm_clock_mhz=st.get("sm_clock_mhz"), max_sm_clock_mhz=st.get("max_sm_clock_mhz"),
                  temperature_c=st.get("temperature_c"))
    return night, tuned


def _history(repo, gpu_name: str, problem: dict) -> list[Night]:
    nights = []
    for h in repo.regress_history(gpu_name, problem):
        env = dict(h["env"], config=_config_label(h["config"]))
        nights.append(Night(tuned_us=h["tuned_us"] or [float("nan")], bnb_us=h["bnb_us"] or [float("nan")],
                            gate_ok=h["flag"] != "broken", env=env, verdict=h["flag"]))
    return nights


def run_regress(repo, gpu, measure: Optional[Callable] = None, remeasure: bool = True, command: str = "",
                progress: Optional[Callable[[int, int, str], None]] = None, env: Optional[dict] = None) -> RegressResult:
    """Re-measure and judge every problem with a stored best config for ``gpu``'s model.

    ``measure(problem, [(label, config)])`` returns a :class:`tuner.bench.ProblemReport` holding
    that config and bnb's ``dequantize_4bit`` (interleaved raw samples); ``gpu`` is a
    :class:`tuner.gpu.GPUInfo`. A first significant drop is re-measured at once; if the drop
    persists there the verdict is ``regression`` the same night."""
    from . import record

    if measure is None:
        from .bench import bench_problem

        def measure(problem, candidates):
            return bench_problem(problem, candidates, time_cap_s=1.5)

    env = dict(env) if env is not None else record.environment_versions(gpu.driver_version)
    problems = repo.problems(gpu.name)
    run = repo.start_run("regress", record.gpu_row(repo, gpu), repo.environment(**env), command=command)
    verdicts = []
    for i, (gname, prob) in enumerate(problems):
        knobs, _, _ = repo.best(gname, prob)
        config = KernelConfig.from_dict(knobs)
        problem = Problem(tuple(prob["shape"]), prob["dtype"], prob["quant"], int(prob["blocksize"]))
        if progress:
            progress(i, len(problems), problem.label())
        label = f"nightly: {config.short()}"
        night_env = dict(env, config=config.short())
        history = _history(repo, gname, prob)
        report = measure(problem, [(label, config)])
        stored = record.record_report(repo, run, report)
        night, tuned = _night_of(report, label, night_env)
        verdict = judge(history, night)
        if verdict.flag == "suspicious" and remeasure:
            again = measure(problem, [(label + " (re-measure)", config)])
            record.record_report(repo, run, again)
            second, _ = _night_of(again, label + " (re-measure)", night_env)
            verdict = judge(history, night, remeasure=second)
        vd = _verdict_dict(verdict)
        repo.add_flag(run, prob, vd, stored.get(label))
        tuned_us = tuned.median_us if tuned.status == "ok" else None
        bnb_us = statistics.median(night.bnb_us) if night.bnb_us else None
        verdicts.append(ProblemVerdict(gname, problem.label(), config.short(), verdict.flag, tuned_us, bnb_us,
                                       verdict.speedup, verdict.baseline_speedup, verdict.drop, verdict.threshold,
                                       verdict.p_value, verdict.reason or (tuned.reason if tuned.status != "ok" else ""),
                                       vd["changes"]))
    if progress:
        progress(len(problems), len(problems), "")
    repo.finish_run(run)
    return RegressResult(run.id, verdicts)


def _verdict_dict(v: Verdict) -> dict:
    return dict(flag=v.flag, speedup=v.speedup, baseline_speedup=v.baseline_speedup, drop=v.drop,
                threshold=v.threshold, p_value=v.p_value, reason=v.reason,
                changes={k: [a, b] for k, (a, b) in v.changes.items()})
