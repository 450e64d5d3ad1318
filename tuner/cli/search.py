"""``nf4-tune search``: one optuna study per GPU x problem, every trial stored."""

from __future__ import annotations

import sys
import time

import argparse

from ..tune.search import SAMPLERS
from ._common import (CannotRun, EXIT_FAILED, UserError, add_db_arg, add_model_args, add_problem_args, command_line,
                      fmt, models_from_args, open_repo, positive_float, positive_int, problems_from_args, require_gpu)


def gpus_arg(text: str):
    from ..tune.multigpu import parse_gpus

    try:
        return parse_gpus(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--gpus ", "", 1)) from None


def add_parser(sub):
    p = sub.add_parser("search", help="optuna search per GPU x problem, every trial stored",
                       description="Search the space for each problem ((--shape and --model shapes) x --dtype, x "
                                   "--m for matmul) on the visible GPU, or on several with --gpus: one optuna study "
                                   "per (GPU model, problem) in the database, resumed when the same command runs "
                                   "again. Every candidate passes the family's gate first; compile errors, "
                                   "mismatches, crashes and hangs become invalid trials. Each measuring process "
                                   "records a heartbeat every NF4TUNE_HEARTBEAT_S seconds (default 5); a trial left "
                                   "running by a killed search is failed once its heartbeat is NF4TUNE_GRACE_S "
                                   "seconds old (default 20), by the resumed search or another worker, and no "
                                   "finished trial is lost.")
    add_problem_args(p, many_dtypes=True)
    add_model_args(p)
    p.add_argument("--gpus", type=gpus_arg, default=None, metavar="all|I,J,...",
                   help="one measuring worker per GPU (all visible ones, or these indices among them), each with "
                        "CUDA_VISIBLE_DEVICES set to its GPU, all searching the same studies in the database "
                        "(distinct trials; SQLite for one host, PostgreSQL across hosts); prints the wall time of "
                        "the problem set and exits 1 if a worker fails")
    p.add_argument("--trials", type=positive_int, default=30, help="finished trials each study should hold (default 30)")
    p.add_argument("--sampler", default="tpe", choices=SAMPLERS)
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds per problem at most")
    p.add_argument("--seed", type=int, default=None, help="sampler seed")
    p.add_argument("--remeasure", action="store_true", help="measure configs already stored for this GPU/problem")
    p.add_argument("--time-cap", type=positive_float, default=1.0, help="seconds of timing per trial at most")
    p.add_argument("--experimental", action="store_true",
                   help="search the whole space, the family's experimental knob values too (a study of its own)")
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


def _stale_lines(summaries) -> list:
    return [f"{s.study}: failed trial(s) {', '.join(map(str, s.stale_failed))} left running by a killed search"
            for s in summaries if s.stale_failed]


def run(args) -> int:
    from ..tune.search import heartbeat_settings, run_searches

    try:
        heartbeat_settings()
    except ValueError as e:
        raise UserError(str(e)) from None
    if not args.shape and not args.model:
        raise UserError("give at least one --shape or --model CONFIG.json")
    problems = problems_from_args(args)
    if not args.quiet:
        for model in models_from_args(args):
            print(model.describe(), file=sys.stderr)
    if args.gpus is not None:
        return _run_on_gpus(args, problems)
    gpu = require_gpu()
    repo = open_repo(args.db, read_only=False)     # creates or upgrades the database before the first trial
    result = run_searches(problems, url=repo.url, gpu=gpu, n_trials=args.trials, sampler=args.sampler,
                          seed=args.seed, timeout=args.timeout, remeasure=args.remeasure, time_cap_s=args.time_cap,
                          command=command_line(), experimental=args.experimental,
                          progress_for=None if args.quiet else (lambda p: _progress(p.label())))
    for line in _stale_lines(result.summaries):
        print(line, file=sys.stderr)
    print(format_summaries(result.summaries))
    print(f"stored in {result.url} (run {result.run_id}); studies: " + ", ".join(s.study for s in result.summaries),
          file=sys.stderr)
    print(f"searched {len(problems)} problem(s) on 1 GPU in {result.seconds:.1f} s wall", file=sys.stderr)
    return 0


def _run_on_gpus(args, problems) -> int:
    import os

    from ..kernel.gpu import visible_gpu_count
    from ..tune import multigpu
    from ..tune.search import load_study, summarize_study

    try:
        devices = multigpu.devices_for(args.gpus, visible_gpu_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    except LookupError as e:
        raise CannotRun(str(e)) from None
    repo = open_repo(args.db, read_only=False)     # created or upgraded once, before the workers start

    def progress(line):
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    result = multigpu.search_on_gpus(problems, devices, url=repo.url, n_trials=args.trials, sampler=args.sampler,
                                     seed=args.seed, timeout=args.timeout, remeasure=args.remeasure,
                                     time_cap_s=args.time_cap, command=command_line(), progress=progress,
                                     experimental=args.experimental)
    gpu_name = result.gpu_name
    if gpu_name is not None:
        summaries = []
        for prob in problems:
            parts = [p for c in result.children for p in c.result.get("problems", []) if p["problem"] == prob.label()]
            try:
                study = load_study(prob, storage_url=repo.url, gpu_name=gpu_name, experimental=args.experimental)
            except KeyError:        # every worker failed before this problem
                continue
            summaries.append(summarize_study(
                prob, repo=repo, study=study,
                gpu_name=gpu_name, new_trials=sum(p["new_trials"] for p in parts),
                measured=sum(p["measured"] for p in parts), seconds=result.seconds,
                stale_failed=[n for p in parts for n in p["stale_failed"]]))
        for line in _stale_lines(summaries):
            print(line, file=sys.stderr)
        print(format_summaries(summaries))
    print(f"stored in {repo.url}; searched " + result.timing_line(), file=sys.stderr)
    for c in result.failed:
        print(f"nf4-tune: failed: the worker on GPU {c.gpu} (CUDA_VISIBLE_DEVICES={c.device}) exited with "
              f"{c.returncode}; its last lines:", file=sys.stderr)
        for line in c.tail[-8:]:
            print(f"    {line}", file=sys.stderr)
    return EXIT_FAILED if result.failed else 0
