"""Search quality: does a short search from a fresh database find what a long one finds?

:func:`search_quality` runs, per problem, a ``short``-trial and a ``long``-trial search (warm-started as every
search is), each into a fresh temporary database, as a user starts, and compares their best medians (a
search's last third refines around its best, so a short search is not the start of a long one). The target:
within 5% at M = 1 and 16 with 30 trials against 300.

Beside the two searches, what a user gets without searching, measured with the searches' own measurer (fresh
data, the family's gate, bnb timed beside it): the config the serving runtime picks (its exact entry, else a
transfer from the nearest tuned problems, else bnb) and the one first-use autotuning picks. Their targets on
shapes nobody tuned: the transfer within 15% of the long search's best and faster than bnb, autotuning within
5% (the long search is the reference of both; the issue names a 100-trial search for them).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from ..vocabulary import TORCH_DTYPE, Problem

__all__ = ["QualityRow", "Alternative", "best_after", "search_quality", "format_quality", "format_row",
           "quality_header", "runtime_alternatives", "TARGET", "TARGETS"]

#: the short search's best may be at most this much slower than the long one's
TARGET = 0.05
#: how much slower than the long search's best each alternative may be (and it must beat bnb)
TARGETS = {"short": TARGET, "transfer": 0.15, "autotune": 0.05}


@dataclass
class Alternative:
    """A config a user gets without searching (``name``: ``transfer``, ``exact`` or ``autotune``), measured
    with the searches' measurer, or why there is none (bnb serves: ``config`` None)."""

    name: str
    config: Optional[str] = None
    median_us: Optional[float] = None
    bnb_us: Optional[float] = None
    note: str = ""


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
    alternatives: Optional[list] = None   # Alternative: what the runtime and autotuning pick, measured alike

    @property
    def ratio(self) -> Optional[float]:
        if not self.short_best_us or not self.long_best_us:
            return None
        return self.short_best_us / self.long_best_us

    def over_long(self, us: Optional[float]) -> Optional[float]:
        return us / self.long_best_us if us and self.long_best_us else None

    def to_dict(self) -> dict:
        return dict(asdict(self), ratio=self.ratio)


def best_after(values: Sequence[Optional[float]], n: int) -> tuple:
    """(best value, its index) among the first ``n`` entries of ``values`` (None: a failed trial)."""
    seen = [(v, i) for i, v in enumerate(values[:n]) if v is not None]
    return min(seen) if seen else (None, None)


def search_quality(problems, *, gpu, short: int = 30, long: int = 300, seed: int = 0, measurer=None,
                   progress=None, alternatives: Optional[Callable] = None,
                   on_row: Optional[Callable] = None) -> list:
    """A ``short``- and a ``long``-trial search per problem, each into a fresh database (:class:`QualityRow`).

    ``alternatives(problem)`` gives ``[(name, config or None, note)]``: configs a user gets without
    searching, each measured here with the searches' measurer. ``on_row(row)`` is called as each problem
    finishes."""
    import optuna

    from .search import run_searches, study_name
    from .worker import WorkerMeasurer

    own = measurer is None
    measurer = measurer or WorkerMeasurer(options=dict(time_cap_s=1.0))   # as run_searches measures

    def search(tmp, prob, n, tag):
        url = f"sqlite:///{os.path.join(tmp, f'fresh-{tag}.db')}"
        run_searches([prob], url=url, gpu=gpu, n_trials=n, seed=seed, measurer=measurer,
                     progress_for=(lambda p: progress) if progress else None)
        study = optuna.load_study(study_name=study_name(gpu.name, prob), storage=url)
        done = sorted((t for t in study.trials if t.state.is_finished()), key=lambda t: t.datetime_complete)
        values = [t.value if t.state == optuna.trial.TrialState.COMPLETE else None for t in done]
        best, at = best_after(values, len(values))
        return best, (done[at].user_attrs.get("config") if at is not None else None), at, len(values)

    def measured(prob, name, config, note) -> Alternative:
        if config is None:
            return Alternative(name, None, None, None, note)
        out = measurer.measure(prob, config)
        if out.status != "ok":
            return Alternative(name, config.short(), None, out.bnb_median_us, f"invalid: {out.reason}")
        return Alternative(name, config.short(), out.median_us, out.bnb_median_us, note)

    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="nf4tune-quality-") as tmp:
            for i, prob in enumerate(problems):
                alts = [measured(prob, *a) for a in (alternatives(prob) if alternatives else [])]
                s_us, s_cfg, _, s_n = search(tmp, prob, short, f"{i}-short")
                l_us, l_cfg, l_at, l_n = search(tmp, prob, long, f"{i}-long")
                row = QualityRow(prob.to_dict(), s_n, l_n, s_us, l_us, s_cfg, l_cfg,
                                 None if l_at is None else l_at + 1, alts)
                rows.append(row)
                if on_row:
                    on_row(row)
    finally:
        if own:
            measurer.close()
    return rows


def _verdict(ratio: Optional[float], limit: float, us=None, bnb_us=None) -> str:
    if ratio is None:
        return "-"
    ok = ratio <= 1 + limit and (bnb_us is None or us is None or us < bnb_us)
    return "met" if ok else "MISSED"


def quality_header() -> str:
    return (f"{'problem':<34} {'who':<9} {'us':>9} {'/ long':>7} {'x bnb':>6}  target  config / note")


def format_row(r: QualityRow) -> str:
    """One problem: the short and long searches' bests, then each alternative, against the long best."""
    label = Problem.from_dict(r.problem).label()
    nan = float("nan")
    lines = [f"{label:<34} {'long':<9} {r.long_best_us or nan:>9.2f} {1.0 if r.long_best_us else nan:>7.3f} "
             f"{'':>6}  {'':<6}  {r.long} trials, best found at trial {r.found_at or 0}: {r.long_config or '-'}",
             f"{'':<34} {'short':<9} {r.short_best_us or nan:>9.2f} {r.ratio or nan:>7.3f} {'':>6}  "
             f"{_verdict(r.ratio, TARGETS['short']):<6}  {r.short} trials (within {100 * TARGETS['short']:.0f}%): "
             f"{r.short_config or '-'}"]
    for a in r.alternatives or []:
        ratio = r.over_long(a.median_us)
        x = a.bnb_us / a.median_us if a.median_us and a.bnb_us else None
        limit = TARGETS.get(a.name, TARGETS["transfer"])
        what = a.config if a.config else "bnb serves"
        lines.append(f"{'':<34} {a.name:<9} {a.median_us or nan:>9.2f} {ratio or nan:>7.3f} {x or nan:>6.2f}  "
                     f"{_verdict(ratio, limit, a.median_us, a.bnb_us):<6}  (within {100 * limit:.0f}%, faster than "
                     f"bnb) {what}{'; ' + a.note if a.note else ''}")
    return "\n".join(lines)


def format_quality(rows: Sequence[QualityRow]) -> str:
    return "\n".join([quality_header()] + [format_row(r) for r in rows])


def runtime_alternatives(device_index: int = 0, budget_s: Optional[float] = None) -> Callable:
    """``alternatives`` for :func:`search_quality` on the GPU: per problem, the config the serving runtime
    picks (matmul: exact entry, else transfer, else bnb; dequant: exact, nearest or the built-in default)
    and, for matmul, the one first-use autotuning picks on a fresh random weight (written nowhere)."""

    def alternatives(problem: Problem) -> list:
        import torch
        import bitsandbytes.functional as F

        from ..families import get as get_family
        from ..serve.matmul import explain_matmul, gpu_name
        from ..serve.table import choose_config
        from .autotune import BUDGET_S, autotune_weight

        if problem.family != "matmul":
            c = choose_config(gpu_name(device_index), problem)
            return [(c.source, c.config, c.describe())]
        N, K = problem.shape
        dtype = getattr(torch, TORCH_DTYPE[problem.dtype])
        dev = torch.device("cuda", device_index)
        W = torch.randn(N, K, dtype=dtype, device=dev)
        B, qs = F.quantize_4bit(W, blocksize=problem.blocksize, quant_type=problem.quant, compress_statistics=True)
        A = torch.randn(problem.m, K, dtype=dtype, device=dev)
        d = explain_matmul(A, qs)                # the runtime's own decision for this weight and batch
        out = [(d.rule if d.served else "transfer", d.choice.config if d.served else None, d.reason)]
        r = autotune_weight(A, B, qs, budget_s=budget_s or BUDGET_S, write=False)
        winner = get_family("matmul").from_dict(r.winner) if r.winner else None
        out.append(("autotune", winner, f"chosen in {r.seconds:.1f} s of {len(r.tried)} candidates"
                    + ("" if winner else ": none beat bnb")))
        return out

    return alternatives
