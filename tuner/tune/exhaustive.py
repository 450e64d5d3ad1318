"""The exhaustive best of a problem: every config of the space, measured, to judge a search by.

Measuring every config of one problem's space (9,240 for a dequant dtype x quant) with the full
harness (the gate, the peer interleaved, repetitions until the IQR settles) would take hours per
problem; an optuna ``--sampler grid`` study of the same points adds a storage round trip per
trial on top. This module measures every point in two stages instead:

1. **screen**: each config once loaded and launched ``screen_reps`` times on the same data, L2
   flushed before each launch, timed with CUDA events; configs that fail to compile, load or
   launch are counted, not raised;
2. **final**: the ``finalists`` fastest of the screen (plus any configs the caller adds, such as a
   search's best) through :func:`nf4tune.measure.bench.bench_problem`: gated against the family's
   reference, then timed interleaved with the peer and the ceiling in the same process.

The exhaustive best is the fastest finalist that passes the gate; a search's best is judged by
its ratio to it, both measured in the same final stage.
"""

from __future__ import annotations

import re
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ..families import get as get_family
from ..vocabulary import Problem

__all__ = ["ExhaustiveReport", "exhaustive_best"]


@dataclass
class ExhaustiveReport:
    problem: dict
    screened: int
    failed: int
    screen_seconds: float
    screen_us: dict = field(default_factory=dict)       # config JSON -> median us of the screen
    final: Optional[object] = None                      # nf4tune.measure.bench.ProblemReport
    compared: dict = field(default_factory=dict)        # label -> config JSON of configs added by the caller
    failures: dict = field(default_factory=dict)        # config JSON -> why it failed to load or launch

    def failure_reasons(self) -> list:
        """(count, an example reason) per kind of failure, most frequent first: reasons that differ only in
        their numbers (bytes, K per split) are one kind."""
        kinds: dict = {}
        for reason in self.failures.values():
            kind = kinds.setdefault(re.sub(r"\d+", "#", reason), [0, reason])
            kind[0] += 1
        return sorted((tuple(v) for v in kinds.values()), key=lambda t: (-t[0], t[1]))

    def best(self):
        return self.final.best() if self.final else None

    def ratio(self, label: str) -> Optional[float]:
        """How much slower the added config ``label`` is than the exhaustive best (1.0 = as fast)."""
        best = self.best()
        r = next((r for r in self.final.results if r.label == label and r.status == "ok"), None) if self.final else None
        return r.median_us / best.median_us if r and best else None

    def to_dict(self) -> dict:
        return dict(problem=self.problem, screened=self.screened, failed=self.failed,
                    screen_seconds=self.screen_seconds, screen_us=self.screen_us,
                    final=self.final.to_dict() if self.final else None, compared=self.compared,
                    failures=self.failures)


def exhaustive_best(problem: Problem, configs: Optional[Sequence] = None, screen_reps: int = 5,
                    finalists: int = 12, compare: Sequence[tuple] = (), seed: Optional[int] = None,
                    progress: Optional[Callable[[int, int], None]] = None, **timing) -> ExhaustiveReport:
    """Screen every config (default: the whole space for the problem's dtype and quant), then
    measure the fastest ``finalists`` and the ``compare`` configs with the full harness."""
    import torch

    from ..kernel.launch import bind, load_kernel
    from ..measure.bench import bench_problem
    from ..measure.timing import l2_flush_buffer

    family = get_family(problem.family)
    seed = secrets.randbits(31) if seed is None else seed
    configs = list(configs) if configs is not None else list(
        family.iter_space(**{k: [v] for k, v in family.problem_values(problem).items()}))
    inputs = family.make_inputs(problem, problem.shape, seed)
    out = family.new_output(inputs, poison=False)
    flush = l2_flush_buffer()
    screen: dict = {}
    failures: dict = {}
    t0 = time.perf_counter()
    for i, c in enumerate(configs):
        try:
            launch = bind(load_kernel(c), inputs, out)
            launch()   # first launch apart: module load and instruction cache
            events = []
            for _ in range(screen_reps):
                flush()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                launch()
                e1.record()
                events.append((e0, e1))
            torch.cuda.synchronize()
            screen[c] = statistics.median(e0.elapsed_time(e1) * 1000.0 for e0, e1 in events)
        except Exception as e:  # a failing config is data: kept with its reason, and out of the ranking
            # the config's own name (most messages begin with it) is the key already: out, so alike reasons group
            reason = f"{type(e).__name__}: {e}".replace(f"{c.short()}: ", "", 1).replace(c.short(), "the config")
            failures[c.to_json()] = (reason.splitlines() or [""])[0][:300]
            torch.cuda.synchronize()
        if progress:
            progress(i + 1, len(configs))
    seconds = time.perf_counter() - t0
    ranked = sorted(screen, key=screen.get)
    chosen = [(f"screen #{k + 1}: {c.short()}", c) for k, c in enumerate(ranked[:finalists])]
    labels = {c for _, c in chosen}
    for label, c in compare:
        if c in labels:   # already a finalist: measure it once, under the caller's label
            chosen = [(label if cc == c else ll, cc) for ll, cc in chosen]
        else:
            chosen.append((label, c))
    final = bench_problem(problem, chosen, seed=seed + 1, **timing)
    return ExhaustiveReport(problem=problem.to_dict(),
                            screened=len(configs), failed=len(failures), screen_seconds=seconds,
                            screen_us={c.to_json(): round(us, 3) for c, us in screen.items()},
                            final=final, compared={label: c.to_json() for label, c in compare}, failures=failures)
