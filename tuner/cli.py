"""``nf4-tune``: a thin command line over the tuner library.

Each subcommand turns its arguments into one library call and prints the result. User errors
exit 1 with a message; "cannot run here" (no GPU) exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from . import space as _space
from db._engine import DatabaseError as _DatabaseError

EXIT_USER_ERROR = 1
EXIT_CANNOT_RUN = 2


class UserError(Exception):
    """Bad input from the command line: printed as 'nf4-tune: error: ...', exit 1."""


def _progress_printer(label: str):
    state = {"last": -1}

    def show(done: int, total: int):
        pct = int(100 * done / max(total, 1))
        if pct != state["last"] or done == total:
            state["last"] = pct
            end = "\n" if done == total else "\r"
            print(f"{label}: {done}/{total} ({pct}%)", end=end, file=sys.stderr, flush=True)

    return show


# ------------------------------------------------------------------------------- space
def cmd_space(args) -> int:
    dtypes = args.dtype or list(_space.DTYPES)
    quants = args.quant or list(_space.QUANTS)
    total = _space.space_size(dtypes, quants)
    sources = len(_space.distinct_sources(_space.iter_space(dtypes, quants)))
    if args.json:
        print(json.dumps(dict(knobs={k: list(v) for k, v in _space.KNOBS.items()}, size=total,
                              distinct_sources=sources, presets=_space.PRESETS), indent=2))
        return 0
    print("knobs:")
    for k, values in _space.KNOBS.items():
        shown = ", ".join("None" if v is None else str(v) for v in values)
        print(f"  {k:<17} {shown:<44} {_space.KNOB_HELP[k]}")
    print("constraints:")
    print(f"  bytes_per_thread * unroll <= {_space.MAX_INFLIGHT_BYTES} packed bytes in flight per thread")
    print("  oneshot grid: ctas_per_sm is None; persistent grid: ctas_per_sm in 1, 2, 4, 8 and")
    print(f"  threads * ctas_per_sm <= {_space.MAX_RESIDENT_THREADS} resident threads per SM")
    print("presets: " + ", ".join(sorted(_space.PRESETS)))
    print(f"dtypes {', '.join(dtypes)}; quants {', '.join(quants)}")
    print(f"configurations: {total}")
    print(f"distinct CUDA sources: {sources}")
    return 0


# ------------------------------------------------------------------------------- compile
def cmd_compile(args) -> int:
    from . import compiler

    arch = args.arch or compiler.visible_arch()
    configs = list(_space.iter_space(args.dtype or _space.DTYPES, args.quant or _space.QUANTS))
    summary = compiler.compile_many(configs, arch, workers=args.workers, cache_dir=args.cache,
                                    progress=None if args.quiet else _progress_printer(f"compile {arch}"))
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(f"arch {arch}, NVRTC {compiler.nvrtc_version()}: {summary.configs} configurations, "
              f"{summary.sources} distinct sources")
        print(f"compiled {summary.compiled} ({summary.cache_hits} from cache), failures {len(summary.failures)}, "
              f"{summary.seconds:.1f} s")
        print(f"max registers {summary.max_registers}, sources with spills {summary.spilling}")
        for config, err in summary.failures[:20]:
            print(f"  FAILED {config.to_json()}: {err.splitlines()[0]}")
    return 1 if summary.failures else 0


# ------------------------------------------------------------------------------- bench
def _bench_candidates(args) -> list:
    dtype, quant = args.dtype, args.quant
    cands = []
    for text in args.config:
        d = json.loads(text) if text.strip().startswith("{") else None
        if d is None:
            raise UserError(f"--config {text!r} is not a JSON object")
        d.setdefault("dtype", dtype)
        d.setdefault("quant", quant)
        if d["dtype"] != dtype or d["quant"] != quant:
            raise UserError(f"--config {text} does not match --dtype {dtype} --quant {quant}")
        cands.append(_space.KernelConfig.from_dict(d))
    for name in args.preset:
        cands.append(_space.preset(name, dtype, quant))
    if args.sweep:
        from .bench import sweep_configs

        base = cands[0] if cands else _space.preset("blog", dtype, quant)
        cands = cands + sweep_configs(base, args.sweep)
    if not cands:
        cands = [_space.preset("blog", dtype, quant), _space.preset("bnb-like", dtype, quant)]
    preset_names = {_space.preset(n, dtype, quant): n for n in args.preset}
    seen = {}
    for c in cands:
        seen.setdefault(c, f"{preset_names[c]}: {c.short()}" if c in preset_names else c.short())
    return [(label, c) for c, label in seen.items()]


def cmd_bench(args) -> int:
    from .gpu import require_gpu
    from .gate import Problem

    if args.runtime and args.exhaustive:
        raise UserError("--runtime and --exhaustive are separate modes: give one")
    if args.runtime:
        return _bench_runtime(args)
    if not args.shape:
        raise UserError("give at least one --shape (or --runtime, whose default shapes are the eight of the benchmark)")
    if args.exhaustive:
        return _bench_exhaustive(args)
    problems = [Problem(Problem.parse_shape(s), args.dtype, args.quant, args.blocksize) for s in args.shape]
    candidates = _bench_candidates(args)
    gpu = require_gpu()
    from .bench import bench_problem, format_report

    repo = run = None
    if not args.no_db:
        from . import record

        repo = record.open_repository(args.db)
        run = repo.start_run("bench", record.gpu_row(repo, gpu),
                             repo.environment(**record.environment_versions(gpu.driver_version)),
                             command=" ".join(sys.argv))
    reports = []
    for i, prob in enumerate(problems):
        print(f"[{i + 1}/{len(problems)}] {prob.label()}: gating and timing {len(candidates)} config(s)",
              file=sys.stderr, flush=True)
        seed = None if args.seed is None else args.seed + 1000 * i
        rep = bench_problem(prob, candidates, seed=seed, time_cap_s=args.time_cap, flush_mode=args.flush)
        reports.append(rep)
        if repo is not None:
            record.record_report(repo, run, rep)
            record.gpu_row(repo, gpu, copy_gbps=rep.copy_gbps)
        if not args.json:
            print(format_report(rep, top=args.top), flush=True)
    if repo is not None:
        repo.finish_run(run)
        print(f"stored as run {run.id} in {repo.db.url}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_dict() for r in reports]))
    if args.output:
        with open(args.output, "w") as f:
            json.dump([r.to_dict() for r in reports], f)
    return 0


def _write_json(path, payload) -> None:
    from ._files import atomic_write

    atomic_write(path, json.dumps(payload))


def _bench_runtime(args) -> int:
    from .bench import RUNTIME_SHAPES, bench_runtime_problem, format_runtime, host_overhead, linear4bit_forward
    from .gate import Problem
    from .gpu import require_gpu

    shapes = [Problem.parse_shape(s) for s in args.shape] if args.shape else list(RUNTIME_SHAPES)
    require_gpu()
    reports = []
    for i, shape in enumerate(shapes):
        prob = Problem(tuple(shape), args.dtype, args.quant, args.blocksize)
        print(f"[{i + 1}/{len(shapes)}] {prob.label()}: runtime against bnb", file=sys.stderr, flush=True)
        seed = None if args.seed is None else args.seed + i
        reports.append(bench_runtime_problem(prob, seed=seed, time_cap_s=args.time_cap))
    print("host time per call...", file=sys.stderr, flush=True)
    overhead = host_overhead(dtype=args.dtype)
    linear = None
    if not args.no_linear:
        print("Linear4bit(4096, 14336) forward at batch 4096, patched and unpatched...", file=sys.stderr, flush=True)
        linear = linear4bit_forward(dtype=args.dtype, time_cap_s=args.time_cap)
    print(format_runtime(reports, overhead, linear), flush=True)
    if args.output:
        _write_json(args.output, dict(runtime=[r.to_dict() for r in reports], host_us=overhead, linear4bit=linear))
    return 0


def _bench_exhaustive(args) -> int:
    from .exhaustive import exhaustive_best
    from .gate import Problem
    from .gpu import require_gpu
    from . import record

    gpu = require_gpu()
    repo = record.open_repository(args.compare_db) if args.compare_db else None
    out = []
    for i, text in enumerate(args.shape):
        prob = Problem(Problem.parse_shape(text), args.dtype, args.quant, args.blocksize)
        compare = []
        if repo is not None:
            best = repo.best(gpu.name, dict(shape=prob.shape, dtype=prob.dtype, quant=prob.quant,
                                            blocksize=prob.blocksize))
            if best is None:
                raise UserError(f"--compare-db holds no best config of {prob.label()} on {gpu.name}")
            compare.append(("search best: " + _space.KernelConfig.from_dict(best[0]).short(),
                            _space.KernelConfig.from_dict(best[0])))
        seed = None if args.seed is None else args.seed + 1000 * i
        rep = exhaustive_best(prob, compare=compare, seed=seed, finalists=args.finalists, time_cap_s=args.time_cap,
                              progress=_progress_printer(f"[{i + 1}/{len(args.shape)}] screen {prob.label()}"))
        from .bench import format_report

        print(f"{prob.label()}: screened {rep.screened} configs ({rep.failed} failed to load or launch) "
              f"in {rep.screen_seconds:.0f} s; finalists measured with the full harness:")
        print(format_report(rep.final), flush=True)
        best = rep.best()
        print(f"exhaustive best: {best.label} {best.median_us:.2f} us" if best else "exhaustive best: none valid")
        for label in rep.compared:
            r = rep.ratio(label)
            print(f"{label}: " + (f"{r:.4f}x the exhaustive best's time ({100 * (r - 1):+.2f}%)" if r else "invalid"))
        out.append(rep.to_dict())
    if args.output:
        _write_json(args.output, out)
    return 0


# ------------------------------------------------------------------------------- search
def _search_progress(label: str):
    t0 = [None]

    def show(done, total, best_us, bnb_us):
        import time as _t

        if t0[0] is None:
            t0[0] = _t.perf_counter()
        bar = "#" * int(20 * done / max(total, 1))
        best = f"best {best_us:.2f} us" if best_us else "best -"
        x = f" ({bnb_us / best_us:.2f}x bnb)" if best_us and bnb_us else ""
        end = "\n" if done >= total else "\r"
        print(f"{label} [{bar:<20}] {done}/{total} {best}{x} {_t.perf_counter() - t0[0]:.0f}s", end=end,
              file=sys.stderr, flush=True)

    return show


def cmd_search(args) -> int:
    from .gate import Problem
    from .gpu import require_gpu
    from . import record
    from .search import run_search
    from .worker import WorkerMeasurer
    from db import resolve_url

    dtypes = args.dtype or ["bf16"]
    problems = [Problem(Problem.parse_shape(s), d, args.quant, args.blocksize) for s in args.shape for d in dtypes]
    if args.trials < 1:
        raise UserError("--trials must be at least 1")
    gpu = require_gpu()
    url = resolve_url(args.db)
    repo = record.open_repository(url)
    run = repo.start_run("search", record.gpu_row(repo, gpu),
                         repo.environment(**record.environment_versions(gpu.driver_version)), command=" ".join(sys.argv))
    summaries = []
    with WorkerMeasurer(options=dict(time_cap_s=args.time_cap)) as measurer:
        for prob in problems:
            summaries.append(run_search(prob, repo=repo, storage_url=url, gpu_name=gpu.name, run=run,
                                        measurer=measurer, n_trials=args.trials, sampler=args.sampler,
                                        seed=args.seed, timeout=args.timeout, remeasure=args.remeasure,
                                        progress=None if args.quiet else _search_progress(prob.label())))
    repo.finish_run(run)
    print(f"{'problem':<30} {'trials':>6} {'us':>9} {'GB/s':>7} {'%copy':>6} {'x bnb':>6} {'x blog':>6}  best config")
    for s_ in summaries:
        r = s_.best_result or {}
        xb = f"{s_.blog_us / s_.best_us:.2f}" if s_.blog_us and s_.best_us else "-"
        fmt = lambda v, f: (f % v) if v is not None else "-"
        print(f"{s_.problem.label():<30} {s_.trials:>6} {fmt(s_.best_us, '%.2f'):>9} {fmt(r.get('gbps'), '%.0f'):>7} "
              f"{fmt(r.get('pct_copy'), '%.1f'):>6} {fmt(r.get('speedup'), '%.2f'):>6} {xb:>6}  "
              f"{s_.best_config.short() if s_.best_config else '-'}")
    print(f"stored in {url} (run {run.id}); studies: " + ", ".join(s_.study for s_ in summaries), file=sys.stderr)
    return 0


def cmd_best(args) -> int:
    from .gate import Problem
    from . import record

    repo = record.open_repository(args.db)
    prob = Problem(Problem.parse_shape(args.shape), args.dtype, args.quant, args.blocksize)
    best = repo.best(args.gpu, dict(shape=prob.shape, dtype=prob.dtype, quant=prob.quant, blocksize=prob.blocksize))
    if best is None:
        raise UserError(f"no valid measurement stored for {prob.label()}" + (f" on {args.gpu}" if args.gpu else ""))
    knobs, m, gname = best
    print(json.dumps(dict(gpu=gname, problem=prob.label(), config=knobs, median_us=m.median_us, gbps=m.gbps,
                          pct_copy=m.pct_copy, speedup_vs_bnb=m.speedup), indent=2))
    return 0


def cmd_export(args) -> int:
    from . import record
    from ._files import atomic_write

    repo = record.open_repository(args.db)
    entries = record.best_configs(repo)
    if not entries:
        raise UserError(f"no valid measurement stored in {repo.db.url}: nothing to export")
    atomic_write(args.output, json.dumps(dict(format=1, entries=entries), indent=2))
    print(f"wrote {len(entries)} tuned problem(s) to {args.output}")
    return 0


# ------------------------------------------------------------------------------- regress
def _fmt(v, f, none="-"):
    return (f % v) if v is not None else none


def format_regress(result) -> str:
    lines = [f"{'problem':<26} {'tuned us':>9} {'bnb us':>9} {'x bnb':>6} {'base x':>6} {'drop':>6} {'limit':>6} "
             f"{'p':>8}  {'flag':<19} config"]
    for v in result.verdicts:
        lines.append(f"{v.problem:<26} {_fmt(v.tuned_us, '%.2f'):>9} {_fmt(v.bnb_us, '%.2f'):>9} "
                     f"{_fmt(v.speedup, '%.3f'):>6} {_fmt(v.baseline_speedup, '%.3f'):>6} "
                     f"{_fmt(None if v.drop is None else 100 * v.drop, '%.1f%%'):>6} "
                     f"{_fmt(None if v.threshold is None else 100 * v.threshold, '%.1f%%'):>6} "
                     f"{_fmt(v.p_value, '%.1e'):>8}  {v.flag:<19} {v.config}")
        if v.flag != "ok" or v.changes:
            if v.reason:
                lines.append(f"    {v.reason}")
            for k, (a, b) in v.changes.items():
                lines.append(f"    changed since the baseline: {k}: {a} -> {b}")
    failed = result.failed
    lines.append(f"regress run {result.run_id}: {len(result.verdicts)} problem(s), "
                 + (f"{len(failed)} failing ({', '.join(sorted({v.flag for v in failed}))})" if failed else "clean"))
    return "\n".join(lines)


def cmd_regress(args) -> int:
    from db import resolve_url
    from .gpu import require_gpu
    from . import record
    from .regress import run_regress

    gpu = require_gpu()
    url = resolve_url(args.db)
    try:
        repo = record.open_repository(url)
        problems = repo.problems(gpu.name)
    except _DatabaseError as e:
        print(f"nf4-tune: cannot run: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if not problems:
        print(f"nf4-tune: cannot run: no stored best config for {gpu.name} in {url} (run `nf4-tune search` first)",
              file=sys.stderr)
        return EXIT_CANNOT_RUN

    def progress(i, n, label):
        if label and not args.quiet:
            print(f"[{i + 1}/{n}] {label}: re-measuring the stored best and bnb", file=sys.stderr, flush=True)

    result = run_regress(repo, gpu, remeasure=not args.no_remeasure, command=" ".join(sys.argv), progress=progress)
    print(format_regress(result), flush=True)
    if args.report:
        from reports import build_report, collect

        index = build_report(collect(repo, url), args.report)
        print(f"wrote {index}", file=sys.stderr)
    return result.exit_code


# ------------------------------------------------------------------------------- report
def cmd_report(args) -> int:
    from db import resolve_url
    from reports import build_report, collect
    from . import record

    url = resolve_url(args.db)
    repo = record.open_repository(url)
    index = build_report(collect(repo, url), args.output)
    print(f"wrote {index} (open it in a browser; plotly.min.js lies beside it, no network needed)")
    return 0


# ------------------------------------------------------------------------------- parser
_DB_HELP = "database URL (default: $NF4TUNE_DB or ./nf4tune.db; a path means a SQLite file)"


def _add_db_arg(parser, help: str = _DB_HELP) -> None:
    parser.add_argument("--db", default=None, metavar="URL", help=help)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nf4-tune",
        description="Tune, check and serve fused NF4/FP4 dequantization kernels that are bit-identical "
                    "to bitsandbytes.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    sp = sub.add_parser("space", help="print the knobs, constraints and size of the tuning space",
                        description="Print every knob of the kernel template, the constraints that rule "
                                    "points out, the presets, and how many configurations and distinct "
                                    "CUDA sources the space holds.")
    sp.add_argument("--dtype", action="append", choices=_space.DTYPES, help="restrict to output dtype(s)")
    sp.add_argument("--quant", action="append", choices=_space.QUANTS, help="restrict to quant type(s)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_space)

    cp = sub.add_parser("compile", help="compile every distinct source of the space with NVRTC",
                        description="Compile the whole space (or the dtypes/quants given) to CUBIN with "
                                    "NVRTC in parallel processes, through the on-disk cache. Prints the "
                                    "count, failures and time; exits 1 if any source fails.")
    cp.add_argument("--arch", choices=("sm_80", "sm_86", "sm_89", "sm_90"),
                    help="target arch (default: the visible GPU's)")
    cp.add_argument("--dtype", action="append", choices=_space.DTYPES)
    cp.add_argument("--quant", action="append", choices=_space.QUANTS)
    cp.add_argument("--workers", type=int, default=None, help="parallel compile processes (default: CPU count)")
    cp.add_argument("--cache", default=None, help="cache directory (default: $NF4TUNE_CACHE or ~/.cache/nf4-tune/cubin)")
    cp.add_argument("--quiet", action="store_true", help="no progress line")
    cp.add_argument("--json", action="store_true")
    cp.set_defaults(func=cmd_compile)

    bp = sub.add_parser("bench", help="gate and time configs against bnb on the visible GPU",
                        description="For each --shape: check every config bit for bit against bnb's CUDA "
                                    "dequantize_4bit (fresh random data, an odd shape too), then time the valid "
                                    "ones interleaved with bnb's dequantize_4bit, bnb's 4-bit kernel alone and "
                                    "a device copy of the output size, L2 flushed before every repetition. "
                                    "Prints a table per problem (us median and IQR, GB/s, %% of copy, x bnb).")
    bp.add_argument("--shape", action="append", default=[], metavar="RxC", help="weight shape, repeatable")
    bp.add_argument("--dtype", default="bf16", choices=_space.DTYPES)
    bp.add_argument("--quant", default="nf4", choices=_space.QUANTS)
    bp.add_argument("--blocksize", type=int, default=64, choices=(32, 64, 128, 256, 512, 1024, 2048, 4096))
    bp.add_argument("--config", action="append", default=[], metavar="JSON",
                    help="a config as JSON (knobs not given take the default); repeatable")
    bp.add_argument("--preset", action="append", default=[], choices=sorted(_space.PRESETS), help="repeatable")
    bp.add_argument("--sweep", action="append", default=[], metavar="KNOB=V1,V2",
                    help="sweep knobs around the first config (or the blog preset); repeatable, cartesian")
    bp.add_argument("--top", type=int, default=None, help="show only the N fastest configs per problem")
    bp.add_argument("--seed", type=int, default=None, help="random seed (default: fresh each run)")
    bp.add_argument("--time-cap", type=float, default=3.0, help="seconds of timing per problem at most")
    bp.add_argument("--flush", default="read", choices=("read", "write"),
                    help="L2 flush between repetitions: read a 4xL2 buffer (cold, clean L2; default) or "
                         "zero-fill it (cold, dirty L2, as triton's do_bench)")
    bp.add_argument("--json", action="store_true", help="print the full reports as JSON")
    bp.add_argument("-o", "--output", default=None, help="also write the JSON reports to this file")
    _add_db_arg(bp, "store the run here (default: $NF4TUNE_DB or ./nf4tune.db; a path means a SQLite file)")
    bp.add_argument("--no-db", action="store_true", help="do not store the run")
    bp.add_argument("--runtime", action="store_true",
                    help="benchmark tuner.runtime.dequantize_4bit against bnb's (default shapes: the six targets plus "
                         "5120x13824 and 11008x4096), its host time per call, and a Linear4bit(4096, 14336) forward "
                         "at batch 4096 patched against unpatched; not stored")
    bp.add_argument("--no-linear", action="store_true", help="with --runtime: skip the Linear4bit forward")
    bp.add_argument("--exhaustive", action="store_true",
                    help="screen every config of the space for each --shape, then measure the fastest --finalists "
                         "(and the --compare-db best) with the full harness; not stored")
    bp.add_argument("--finalists", type=int, default=12, help="with --exhaustive: configs re-measured in full")
    bp.add_argument("--compare-db", default=None, metavar="URL",
                    help="with --exhaustive: also measure the best config stored here (a search's) and report "
                         "its time relative to the exhaustive best")
    bp.set_defaults(func=cmd_bench)

    se = sub.add_parser("search", help="optuna search per GPU x problem, every trial stored",
                        description="Search the space for each --shape x --dtype on the visible GPU: one optuna "
                                    "study per (GPU model, problem) in the database, resumed when the same "
                                    "command runs again. Every candidate passes the bit-exact gate first; "
                                    "compile errors, mismatches, crashes and hangs become invalid trials.")
    se.add_argument("--shape", action="append", required=True, metavar="RxC")
    se.add_argument("--dtype", action="append", choices=_space.DTYPES, help="repeatable (default bf16)")
    se.add_argument("--quant", default="nf4", choices=_space.QUANTS)
    se.add_argument("--blocksize", type=int, default=64, choices=(32, 64, 128, 256, 512, 1024, 2048, 4096))
    se.add_argument("--trials", type=int, default=30, help="finished trials each study should hold (default 30)")
    se.add_argument("--sampler", default="tpe", choices=("tpe", "gp", "random", "grid"))
    se.add_argument("--timeout", type=float, default=None, help="seconds per problem at most")
    se.add_argument("--seed", type=int, default=None, help="sampler seed")
    se.add_argument("--remeasure", action="store_true", help="measure configs already stored for this GPU/problem")
    se.add_argument("--time-cap", type=float, default=1.0, help="seconds of timing per trial at most")
    _add_db_arg(se)
    se.add_argument("--quiet", action="store_true")
    se.set_defaults(func=cmd_search)

    be = sub.add_parser("best", help="print the best stored config of a problem as JSON")
    be.add_argument("--shape", required=True, metavar="RxC")
    be.add_argument("--gpu", default=None, help="GPU model name (default: any)")
    be.add_argument("--dtype", default="bf16", choices=_space.DTYPES)
    be.add_argument("--quant", default="nf4", choices=_space.QUANTS)
    be.add_argument("--blocksize", type=int, default=64)
    _add_db_arg(be)
    be.set_defaults(func=cmd_best)

    ex = sub.add_parser("export", help="write the best config per (GPU model, problem) for the runtime")
    ex.add_argument("-o", "--output", required=True)
    _add_db_arg(ex)
    ex.set_defaults(func=cmd_export)

    rg = sub.add_parser("regress", help="nightly: re-measure every stored best config against bnb and judge it",
                        description="On the visible GPU, re-measure the stored best config of every problem tuned "
                                    "for this GPU model, interleaved with bnb in the shared harness; store the run; "
                                    "judge each problem: broken (fails the bit-exact gate), invalid-environment "
                                    "(clocks or temperature off), regression-vs-bnb (slower than bnb), suspicious / "
                                    "regression (the speedup over bnb fell by more than max(5%%, 3x the noise) "
                                    "against the recent good nights, significant by Mann-Whitney U; a first drop "
                                    "is re-measured at once and confirmed there or the next night). Lists what "
                                    "changed since the baseline. Exit 0 clean, 1 a confirmed regression or a broken "
                                    "kernel, 2 cannot run (no GPU, unreadable database, nothing tuned).")
    _add_db_arg(rg)
    rg.add_argument("--report", default=None, metavar="DIR", help="also write the HTML report to DIR")
    rg.add_argument("--no-remeasure", action="store_true",
                    help="do not re-measure a first drop at once (it is then confirmed only by the next night)")
    rg.add_argument("--quiet", action="store_true")
    rg.set_defaults(func=cmd_regress)

    rp = sub.add_parser("report", help="write a static, offline HTML report of the database",
                        description="Overview per GPU x problem (best, bnb, x bnb, % of copy, status), history "
                                    "per problem, each search study (trials, best so far, parallel coordinates), "
                                    "a knob heatmap and the environment of each run, as index.html with "
                                    "plotly.min.js beside it.")
    rp.add_argument("-o", "--output", required=True, metavar="DIR")
    _add_db_arg(rp)
    rp.set_defaults(func=cmd_report)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .gpu import NoGPUError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return int(args.func(args) or 0)
    except NoGPUError as e:
        print(f"nf4-tune: cannot run: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except (UserError, _space.InvalidConfig, ValueError, _DatabaseError) as e:
        print(f"nf4-tune: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("nf4-tune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
