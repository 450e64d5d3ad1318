"""``nf4-tune regress``: the nightly job (re-measure every stored best config and judge it)."""

from __future__ import annotations

import sys

from ._common import CannotRun, EXIT_FAILED, add_db_arg, command_line, fmt, open_repo, require_gpu


def add_parser(sub):
    p = sub.add_parser("regress", help="nightly: re-measure every stored best config against bnb and judge it",
                       description="On the visible GPU, re-measure the stored best config of every problem (every "
                                   "family) tuned for this GPU model, interleaved with bnb in the shared harness; "
                                   "store the run; judge each problem: broken (fails the gate), invalid-environment "
                                   "(clocks or temperature off), noisy-reference (bnb's spread far above its "
                                   "history, or bnb slow throughout: measured again at once, else not judged), regression-vs-bnb (slower than bnb), suspicious / "
                                   "regression (the speedup over bnb fell by more than max(5 percent, 3x the noise) "
                                   "against the recent good nights, significant by Mann-Whitney U; a first drop is "
                                   "re-measured at once and confirmed there or the next night). Lists what changed "
                                   "since the baseline. Exit 0 clean, 1 a confirmed regression or a broken kernel, "
                                   "2 cannot run (no GPU, a missing or unreadable database, nothing tuned).")
    add_db_arg(p)
    p.add_argument("--report", default=None, metavar="DIR",
                   help="also write the HTML report to DIR (as `nf4-tune report -o DIR` writes it)")
    p.add_argument("--no-remeasure", action="store_true",
                   help="do not re-measure a first drop at once (it is then confirmed only by the next night), nor a "
                        "night whose bnb measurement was disturbed")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def format_regress(result) -> str:
    lines = [f"{'problem':<34} {'tuned us':>9} {'bnb us':>9} {'x bnb':>6} {'base x':>6} {'drop':>6} {'limit':>6} "
             f"{'p':>8}  {'flag':<19} config"]
    for v in result.verdicts:
        lines.append(f"{v.problem:<34} {fmt(v.tuned_us, '%.2f'):>9} {fmt(v.bnb_us, '%.2f'):>9} "
                     f"{fmt(v.speedup, '%.3f'):>6} {fmt(v.baseline_speedup, '%.3f'):>6} "
                     f"{fmt(None if v.drop is None else 100 * v.drop, '%.1f%%'):>6} "
                     f"{fmt(None if v.threshold is None else 100 * v.threshold, '%.1f%%'):>6} "
                     f"{fmt(v.p_value, '%.1e'):>8}  {v.flag:<19} {v.config}")
        if v.flag != "ok" or v.changes:
            if v.reason:
                lines.append(f"    {v.reason}")
            for k, (a, b) in v.changes.items():
                lines.append(f"    changed since the baseline: {k}: {a} -> {b}")
    failed = result.failed
    skipped = result.not_judged
    lines.append(f"regress run {result.run_id}: {len(result.verdicts)} problem(s), "
                 + (f"{len(failed)} failing ({', '.join(sorted({v.flag for v in failed}))})" if failed else "clean")
                 + (f", {len(skipped)} not judged ({', '.join(sorted({v.flag for v in skipped}))})" if skipped else ""))
    return "\n".join(lines)


def run(args) -> int:
    from ..track.nightly import run_regress

    if args.report:
        from .report import check_report_dir

        check_report_dir(args.report)
    gpu = require_gpu()
    read = open_repo(args.db, read_only=True)      # a missing database is an error, never created
    if not read.problems(gpu.name):
        raise CannotRun(f"no stored best config for {gpu.name} in {read.url} (run `nf4-tune search` first)")
    repo = open_repo(read.url, read_only=False)

    def progress(i, n, label):
        if label and not args.quiet:
            print(f"[{i + 1}/{n}] {label}: re-measuring the stored best and bnb", file=sys.stderr, flush=True)

    result = run_regress(repo, gpu, remeasure=not args.no_remeasure, command=command_line(), progress=progress)
    print(format_regress(result), flush=True)
    if args.report:
        from nf4tune.reports import build_report, collect

        index = build_report(collect(repo), args.report)
        print(f"wrote {index}", file=sys.stderr)
    return EXIT_FAILED if result.failed else 0
