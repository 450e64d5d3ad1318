"""How far the serving table's answer for a problem it was not tuned on (the nearest tuned
problem's config, or the built-in default) is from a config tuned on that very problem:
both gated and timed side by side in one harness run (``nf4-tune bench --fallback-vs URL``)."""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from ..families import get as get_family
from ..vocabulary import Problem

__all__ = ["FallbackReport", "fallback_distance", "format_fallback"]


@dataclass
class FallbackReport:
    problem: str
    served: str                        # Choice.describe() of what the table serves
    source: str                        # exact, nearest or default
    tuned: str                         # the tuned config (short form)
    served_us: Optional[float]
    tuned_us: Optional[float]
    slowdown: Optional[float]          # served / tuned median time (1.0: as fast); None if either failed
    bench: dict                        # the full ProblemReport

    def to_dict(self) -> dict:
        return asdict(self)


def fallback_distance(problems: Sequence[Problem], table, tuned_repo, gpu_name: str, seed: Optional[int] = None,
                      progress=None, **timing) -> list:
    """For each problem: the config ``table`` (a :class:`nf4tune.serve.table.ConfigTable`) serves on
    ``gpu_name`` against the best config stored for that problem in ``tuned_repo``, gated and
    timed together (with the family's peers and ceiling). A problem with no tuned config in
    ``tuned_repo`` is an error (ValueError), checked for every problem before any timing."""
    from ..measure.bench import bench_problem

    tuned = {}
    for prob in problems:
        best = tuned_repo.best(gpu_name, prob)
        if best is None:
            raise ValueError(f"{prob.label()}: nothing tuned on {gpu_name} in {tuned_repo.url}")
        tuned[prob] = get_family(prob.family).from_dict(best[0])
    seed = secrets.randbits(31) if seed is None else seed
    out = []
    for i, prob in enumerate(problems):
        choice = table.choose(gpu_name, prob)
        if progress:
            progress(i, len(problems), prob)
        served_label, tuned_label = "served: " + choice.describe(), "tuned: " + tuned[prob].short()
        rep = bench_problem(prob, [(served_label, choice.config), (tuned_label, tuned[prob])],
                            seed=seed + 1000 * i, **timing)
        s, t = rep.result(served_label), rep.result(tuned_label)
        s_us = s.median_us if s is not None and s.status == "ok" else None
        t_us = t.median_us if t is not None and t.status == "ok" else None
        out.append(FallbackReport(prob.label(), choice.describe(), choice.source, tuned[prob].short(), s_us, t_us,
                                  s_us / t_us if s_us and t_us else None, rep.to_dict()))
    return out


def format_fallback(reports: Sequence[FallbackReport], target: float = 0.05) -> str:
    lines = [f"{'problem':<34} {'source':<8} {'served us':>10} {'tuned us':>9} {'served/tuned':>13}"]
    for r in reports:
        ratio = f"{r.slowdown:.3f}" if r.slowdown else "invalid"
        su = f"{r.served_us:.2f}" if r.served_us else "-"
        tu = f"{r.tuned_us:.2f}" if r.tuned_us else "-"
        lines.append(f"{r.problem:<34} {r.source:<8} {su:>10} {tu:>9} {ratio:>13}")
        lines.append(f"    {r.served}")
    ok = [r.slowdown for r in reports if r.slowdown]
    if ok:
        worst = max(ok)
        lines.append(f"worst served/tuned {worst:.3f} ({100 * (worst - 1):+.1f}%); target within {100 * target:.0f}%: "
                     + ("met" if worst <= 1 + target and len(ok) == len(reports) else "NOT met"))
    return "\n".join(lines)
