"""``nf4-tune best``: the best stored config of a problem, as JSON (reads only)."""

from __future__ import annotations

import json

from ._common import CannotRun, add_db_arg, add_problem_args, open_repo, problems_from_args, UserError


def add_parser(sub):
    p = sub.add_parser("best", help="print the best stored config of a problem as JSON (reads only)")
    add_problem_args(p)
    p.add_argument("--gpu", default=None, help="GPU model name (default: any)")
    add_db_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if len(args.shape) != 1:
        raise UserError("give exactly one --shape")
    prob, = problems_from_args(args)[:1]
    repo = open_repo(args.db, read_only=True)
    best = repo.best(args.gpu, prob)
    if best is None:
        raise CannotRun(f"no valid measurement stored for {prob.label()}" + (f" on {args.gpu}" if args.gpu else "")
                        + f" in {repo.url}")
    knobs, m, gname = best
    print(json.dumps(dict(gpu=gname, problem=prob.label(), family=prob.family, config=knobs, median_us=m.median_us,
                          gbps=m.gbps, pct_copy=m.pct_copy, speedup_vs_bnb=m.speedup), indent=2))
    return 0
