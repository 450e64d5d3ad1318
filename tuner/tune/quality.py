"""Search quality: does a short search from a fresh database find what a long one finds?

:func:`search_quality` runs, per problem, a ``short``-trial and a ``long``-trial search (warm-started as every
search is), each into a fresh temporary database, as a user starts, and compares their best medians (a
search's last third refines around its best, so a short search is not the start of a long one). The target:
within 5% at M = 1 and 16 with 30 trials against 300.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from ..vocabulary import Problem

__all__ = ["QualityRow", "best_after", "search_quality", "format_quality", "TARGET"]

#: the short search's best may be at most this much slower than the long one's
TARGET = 0.05


@dataclass
class QualityRow:
    problem: dict
    short: int
    long: int
    short_best_us: Optional[float]
    long_best_us: Optional[float]
    short_config: Optional[str]
    long_config: Optional[str]
    found_at: Optional[int]            # the trial (1-based, finished order) that found the long search's best

    @property
    def ratio(self) -> Optional[float]:
        if not self.short_best_us or not self.long_best_us:
            return None
        return self.short_best_us / self.long_best_us

    def to_dict(self) -> dict:
        return dict(asdict(self), ratio=self.ratio)


def best_after(values: Sequence[Optional[float]], n: int) -> tuple:
    """(best value, its index) among the first ``n`` entries of ``values`` (None: a failed trial)."""
    seen = [(v, i) for i, v in enumerate(values[:n]) if v is not None]
    return min(seen) if seen else (None, None)


def search_quality(problems, *, gpu, short: int = 30, long: int = 300, seed: int = 0, measurer=None,
                   progress=None) -> list:
    """A ``short``- and a ``long``-trial search per problem, each into a fresh database (:class:`QualityRow`)."""
    import optuna

    from .search import run_searches, study_name

    def search(tmp, prob, n, tag):
        url = f"sqlite:///{os.path.join(tmp, f'fresh-{tag}.db')}"
        run_searches([prob], url=url, gpu=gpu, n_trials=n, seed=seed, measurer=measurer,
                     progress_for=(lambda p: progress) if progress else None)
        study = optuna.load_study(study_name=study_name(gpu.name, prob), storage=url)
        done = sorted((t for t in study.trials if t.state.is_finished()), key=lambda t: t.datetime_complete)
        values = [t.value if t.state == optuna.trial.TrialState.COMPLETE else None for t in done]
        best, at = best_after(values, len(values))
        return best, (done[at].user_attrs.get("config") if at is not None else None), at, len(values)

    rows = []
    with tempfile.TemporaryDirectory(prefix="nf4tune-quality-") as tmp:
        for i, prob in enumerate(problems):
            s_us, s_cfg, _, s_n = search(tmp, prob, short, f"{i}-short")
            l_us, l_cfg, l_at, l_n = search(tmp, prob, long, f"{i}-long")
            rows.append(QualityRow(prob.to_dict(), s_n, l_n, s_us, l_us, s_cfg, l_cfg,
                                   None if l_at is None else l_at + 1))
    return rows


def format_quality(rows: Sequence[QualityRow]) -> str:
    lines = [f"{'problem':<34} {'best@short us':>13} {'best@long us':>12} {'short/long':>10} {'found at':>8}  target "
             f"(within {100 * TARGET:.0f}%)"]
    for r in rows:
        label = Problem.from_dict(r.problem).label()
        ratio = r.ratio
        ok = "met" if ratio is not None and ratio <= 1 + TARGET else "MISSED"
        lines.append(f"{label:<34} {r.short_best_us or float('nan'):>13.2f} {r.long_best_us or float('nan'):>12.2f} "
                     f"{ratio or float('nan'):>10.3f} {r.found_at or 0:>8}  {ok} ({r.short} vs {r.long} trials)")
    return "\n".join(lines)
