"""``nf4-tune search``: one optuna study per GPU x problem, every trial stored."""

from __future__ import annotations

import sys
import time

from ..tune.search import SAMPLERS
from ._common import (add_db_arg, add_problem_args, command_line, fmt, open_repo, positive_float, positive_int,
                      problems_from_args, require_gpu)


def add_parser(sub):
    p = sub.add_parser("search", help="optuna search per GPU x problem, every trial stored",
                       description="Search the space for each problem (--shape x --dtype, x --m for matmul) on the "
                                   "visible GPU: one optuna study per (GPU model, problem) in the database, resumed "
                                   "when the same command runs again. Every candidate passes the family's gate "
                                   "first; compile errors, mismatches, crashes and hangs become invalid trials; a "
                                   "trial left running by a killed search is failed on resume.")
    add_problem_args(p, shape_required=True, many_dtypes=True)
    p.add_argument("--trials", type=positive_int, default=30, help="finished trials each study should hold (default 30)")
    p.add_argument("--sampler", default="tpe", choices=SAMPLERS)
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds per problem at most")
    p.add_argument("--seed", type=int, default=None, help="sampler seed")
    p.add_argument("--remeasure", action="store_true", help="measure configs already stored for this GPU/problem")
    p.add_argument("--time-cap", type=positive_float, default=1.0, help="seconds of timing per trial at most")
    add_db_arg(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def _progress(label: str):
    t0 = [None]

    def show(done, total, best_us, bnb_us):
        if t0[0] is None:
            t0[0] = time.perf_counter()
        bar = "#" * int(20 * done / max(total, 1))
        best = f"best {best_us:.2f} us" if best_us else "best -"
        x = f" ({bnb_us / best_us:.2f}x bnb)" if best_us and bnb_us else ""
        end = "\n" if done >= total else "\r"
        print(f"{label} [{bar:<20}] {done}/{total} {best}{x} {time.perf_counter() - t0[0]:.0f}s", end=end,
              file=sys.stderr, flush=True)

    return show


def format_summaries(summaries) -> str:
    lines = [f"{'problem':<36} {'trials':>6} {'us':>9} {'GB/s':>7} {'%ceil':>6} {'x bnb':>6} {'x blog':>6}  best config"]
    for s in summaries:
        r = s.best_result or {}
        xb = f"{s.blog_us / s.best_us:.2f}" if s.blog_us and s.best_us else "-"
        lines.append(f"{s.problem.label():<36} {s.trials:>6} {fmt(s.best_us, '%.2f'):>9} {fmt(r.get('gbps'), '%.0f'):>7} "
                     f"{fmt(r.get('pct_copy'), '%.1f'):>6} {fmt(r.get('speedup'), '%.2f'):>6} {xb:>6}  "
                     f"{s.best_config.short() if s.best_config else '-'}")
    return "\n".join(lines)


def run(args) -> int:
    from ..tune.search import run_searches

    problems = problems_from_args(args)
    gpu = require_gpu()
    repo = open_repo(args.db, read_only=False)     # creates or upgrades the database before the first trial
    result = run_searches(problems, url=repo.url, gpu=gpu, n_trials=args.trials, sampler=args.sampler,
                          seed=args.seed, timeout=args.timeout, remeasure=args.remeasure, time_cap_s=args.time_cap,
                          command=command_line(),
                          progress_for=None if args.quiet else (lambda p: _progress(p.label())))
    print(format_summaries(result.summaries))
    print(f"stored in {result.url} (run {result.run_id}); studies: " + ", ".join(s.study for s in result.summaries),
          file=sys.stderr)
    return 0
