"""``nf4-tune bench``: gate and time configs against the family's peer (and the --runtime and
--exhaustive modes)."""

from __future__ import annotations

import json
import sys

from ..families import get as get_family
from ..vocabulary import InvalidConfig
from ._common import (UserError, add_db_arg, add_problem_args, command_line, config_from_option, open_repo,
                      output_file, positive_float, positive_int, problems_from_args, progress_printer, require_gpu,
                      write_json)
from ._common import add_model_args


def add_parser(sub):
    p = sub.add_parser("bench", help="gate and time configs against bnb on the visible GPU",
                       description="For each problem (--shape x --m for matmul): check every config against the "
                                   "family's reference (dequant: bit for bit against bnb's CUDA dequantize_4bit; "
                                   "matmul: an fp64 reference under a derived error bound, and no worse than bnb), "
                                   "on fresh random data and an odd shape, then time the valid ones interleaved with "
                                   "bnb and the family's ceiling (dequant: a device copy of the output size; "
                                   "matmul: a read-only reduction), L2 flushed before every repetition. Prints a "
                                   "table per problem (us median and IQR, GB/s, % of the ceiling, x bnb).")
    add_problem_args(p)
    add_model_args(p)
    p.add_argument("--config", action="append", default=[], metavar="JSON|@FILE",
                   help="a config as JSON or @file.json (knobs not given take the family's defaults); repeatable")
    p.add_argument("--preset", action="append", default=[], help="a preset of the family (dequant: blog, bnb-like); "
                                                                 "repeatable")
    p.add_argument("--sweep", action="append", default=[], metavar="KNOB=V1,V2",
                   help="sweep knobs around the first config (or the family's first preset); repeatable, cartesian. "
                        "With --exhaustive: screen only the space's configs with these knob values")
    p.add_argument("--top", type=positive_int, default=None, help="show only the N fastest configs per problem")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh each run)")
    p.add_argument("--time-cap", type=positive_float, default=3.0, help="seconds of timing per problem at most")
    p.add_argument("--flush", default="read", choices=("read", "write"),
                   help="L2 flush between repetitions: read a 4xL2 buffer (cold, clean L2; default) or zero-fill it "
                        "(cold, dirty L2, as triton's do_bench)")
    p.add_argument("--json", action="store_true", help="print the full reports as JSON")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="also write the JSON reports to this file")
    add_db_arg(p, "store the run here (default: $NF4TUNE_DB or ./nf4tune.db; a path means a SQLite file)")
    p.add_argument("--no-db", action="store_true", help="do not store the run")
    p.add_argument("--runtime", action="store_true",
                   help="benchmark the serving runtime against bnb (dequant: default shapes the six targets plus "
                        "5120x13824 and 11008x4096), its host time per call, and a Linear4bit(4096, 14336) forward at "
                        "batch 4096 patched against unpatched; not stored")
    p.add_argument("--no-linear", action="store_true", help="with --runtime: skip the Linear4bit forward")
    p.add_argument("--table", default=None, metavar="FILE|URL",
                   help="with --runtime / --decode / --generate / --host / --fallback-vs: serve from this table file "
                        "or from a database's best configs (exported in memory) (default: the runtime's own order: "
                        "$NF4TUNE_CONFIGS, else the packaged table, with the per-user autotune table over it)")
    p.add_argument("--decode", action="store_true",
                   help="matmul family: tokens/s of a Llama-3-8B-shaped model (random weights) decoding with a static "
                        "KV cache under CUDA graphs, in bf16, with bnb's 4-bit kernels, patched, and with every 4-bit "
                        "linear free (no kernel: the most any 4-bit matmul can speed the decode up); not stored")
    p.add_argument("--generate", action="store_true",
                   help="Hugging Face generate as bnb users run it: the model of --model (a config.json; default "
                        "Llama-3-8B's shape, random weights) in bf16, with bnb's kernels and patched, each eager "
                        "(greedy, dynamic cache) and as a CUDA-graph step (with the every-Linear4bit-free bound); "
                        "tokens/s, interleaved rounds, the first discarded, the spread shown; not stored")
    p.add_argument("--rounds", type=positive_int, default=3,
                   help="with --generate: rounds kept after the discarded first one (default 3)")
    p.add_argument("--pdl", action="store_true",
                   help="with --generate: the CUDA-graph step also patched with programmatic dependent launch "
                        "(variant patched+pdl, as NF4TUNE_PDL=1 serves; experimental, sm_90+)")
    p.add_argument("--search-quality", action="store_true",
                   help="for each problem (--shape/--model x --m): a --trials and a --reference-trials search, each "
                        "from a fresh database (as a user starts: warm-started from the tables), and how far the "
                        "short one's best is from the long one's (target: within 5%%); beside them, measured alike, the "
                        "config the runtime serves without a search (exact, transfer: within 15%%) and the one "
                        "first-use autotuning picks (matmul: within 5%%); a row per problem as it finishes; not "
                        "stored")
    p.add_argument("--trials", type=positive_int, default=30, help="with --search-quality: the short search (default 30)")
    p.add_argument("--reference-trials", type=positive_int, default=300,
                   help="with --search-quality: the long search (default 300)")
    p.add_argument("--host", action="store_true",
                   help="host microseconds per call of bnb's matmul_4bit and Linear4bit, nf4tune.matmul_4bit and both "
                        "bnb calls under patch_bitsandbytes(), at M = 1 and 8 (or --m), on three tuned shapes and one "
                        "that nobody tuned (or --shape), and of the dequantize_4bit runtime; not stored")
    p.add_argument("--batch", action="append", type=positive_int, default=None,
                   help="with --decode / --generate: batch sizes (default 1 and 8)")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="with --decode / --generate: decoder layers (default 32, or the --model config's)")
    p.add_argument("--exhaustive", action="store_true",
                   help="screen every config of the space for each --shape, then measure the fastest --finalists "
                        "(and the --compare-db best) with the full harness; the finalists' measurements are stored "
                        "(--db; not with --no-db), so that `nf4-tune export` makes the serving table of them")
    p.add_argument("--experimental", action="store_true",
                   help="with --exhaustive: screen the whole space, the family's experimental knob values too "
                        "(default: the default space; a value named in --sweep is taken either way)")
    p.add_argument("--finalists", type=positive_int, default=12, help="with --exhaustive: configs re-measured in full (beside any --config, measured too)")
    p.add_argument("--compare-db", default=None, metavar="URL",
                   help="with --exhaustive: also measure the best config stored here (a search's) and report its time "
                        "relative to the exhaustive best")
    p.add_argument("--fallback-vs", default=None, metavar="URL",
                   help="for each problem, time the config the serving table (--table) gives it (exact, nearest tuned "
                        "problem, or built-in default) against the best config tuned on that very problem stored at "
                        "URL, side by side in one run, and print served/tuned; not stored")
    p.set_defaults(func=run)


def candidates_from_args(args, family, problem_values: dict, problem=None) -> list:
    """(label, config) pairs the arguments name, validated before any GPU work."""
    cands = [config_from_option(family, "--config", text, problem_values) for text in args.config]
    names = {}
    for name in args.preset:
        try:
            c = family.preset(name, **problem_values)
        except InvalidConfig as e:
            raise UserError(f"--preset: {e}") from None
        names[c] = name
        cands.append(c)
    if args.sweep:
        from ..measure.bench import sweep_configs

        base = cands[0] if cands else family.preset(next(iter(family.presets)), **problem_values)
        try:
            swept = sweep_configs(base, args.sweep)
        except InvalidConfig as e:
            raise UserError(f"--sweep: {e}") from None
        if not swept:
            raise UserError(f"--sweep {' '.join(args.sweep)}: every combination breaks a constraint of the space")
        cands += swept
    if not cands:
        cands = [family.preset(n, **problem_values) for n in family.presets]
        names = {c: n for c, n in zip(cands, family.presets)}
        if family.name != "dequant":
            default = family.builtin_default(problem)
            names.setdefault(default, "built-in default")
            cands.append(default)
    seen = {}
    for c in cands:
        seen.setdefault(c, f"{names[c]}: {c.short()}" if c in names else c.short())
    return [(label, c) for c, label in seen.items()]


def run(args) -> int:
    modes = (args.runtime, args.exhaustive, args.decode, args.fallback_vs, args.generate, args.host,
             args.search_quality)
    if sum(map(bool, modes)) > 1:
        raise UserError("--runtime, --exhaustive, --decode, --generate, --host, --search-quality and --fallback-vs are "
                        "separate modes: give one")
    if args.pdl and not args.generate:
        raise UserError("--pdl is an option of --generate")
    output_file(args.output)
    if args.decode:
        return _decode(args)
    if args.generate:
        return _generate(args)
    if args.host:
        return _host(args)
    if args.runtime:
        return _runtime(args)
    if not args.shape and not args.model:
        raise UserError("give at least one --shape or --model (or --runtime, whose default shapes are the eight of the "
                        "benchmark)")
    if args.exhaustive:
        return _exhaustive(args)
    if args.search_quality:
        return _search_quality(args)
    if args.fallback_vs:
        return _fallback(args)
    problems = problems_from_args(args)
    family = get_family(args.family)
    candidates = {p: candidates_from_args(args, family, family.problem_values(p), p) for p in problems}
    gpu = require_gpu()
    from ..measure.bench import format_report, run_bench
    from ..measure.record import recorded_run

    def progress(i, n, prob):
        print(f"[{i + 1}/{n}] {prob.label()}: gating and timing {len(candidates[prob])} config(s)", file=sys.stderr,
              flush=True)

    def go(recorded):
        return run_bench(problems, candidates, recorded=recorded, seed=args.seed, time_cap_s=args.time_cap,
                         flush_mode=args.flush, progress=progress)

    if args.no_db:
        reports = go(None)
    else:
        repo = open_repo(args.db, read_only=False)
        with recorded_run("bench", None, gpu, command=command_line(), repo=repo) as rec:
            reports = go(rec)
        print(f"stored as run {rec.run.id} in {repo.url}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_dict() for r in reports]))
    else:
        for rep in reports:
            print(format_report(rep, top=args.top), flush=True)
    if args.output:
        write_json(args.output, [r.to_dict() for r in reports])
    return 0


def _use_table(args) -> None:
    """--table FILE|URL: serve from a table file, or from a database's best configs (exported in memory,
    as ``nf4-tune export`` would write them)."""
    if args.table:
        from ..serve.table import ConfigTable, use_configs

        try:
            if "://" in args.table or not args.table.endswith(".json"):
                from ..measure.record import table_entries

                repo = open_repo(args.table, read_only=True)
                use_configs(ConfigTable(table_entries(repo), repo.url))
            else:
                use_configs(args.table)
        except ValueError as e:
            raise UserError(f"--table: {e}") from None


def _decode(args) -> int:
    from ..bench.decode import decode_benchmark, format_decode

    if args.family != "matmul":
        raise UserError("--decode measures the matmul family: add --family matmul")
    _use_table(args)
    require_gpu()
    result = decode_benchmark(batches=tuple(args.batch or (1, 8)), layers=args.layers or 32,
                              progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_decode(result), flush=True)
    if args.output:
        write_json(args.output, result)
    return 0


def _generate(args) -> int:
    from ..bench.generate import format_generate, generate_benchmark, load_model_config

    if len(args.model) > 1:
        raise UserError("--generate takes one --model")
    try:
        load_model_config(args.model[0] if args.model else None)
    except ValueError as e:
        raise UserError(f"--model: {e}") from None
    _use_table(args)
    require_gpu()
    result = generate_benchmark(args.model[0] if args.model else None, layers=args.layers,
                                batches=tuple(args.batch or (1, 8)), rounds=args.rounds, pdl=args.pdl,
                                progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_generate(result), flush=True)
    if args.output:
        write_json(args.output, result)
    return 0


def _search_quality(args) -> int:
    from ..tune.quality import format_row, quality_header, runtime_alternatives, search_quality

    if args.trials >= args.reference_trials:
        raise UserError(f"--trials {args.trials} must be fewer than --reference-trials {args.reference_trials}")
    problems = problems_from_args(args)
    gpu = require_gpu()
    print(quality_header(), flush=True)
    rows = search_quality(problems, gpu=gpu, short=args.trials, long=args.reference_trials,
                          seed=args.seed if args.seed is not None else 0, alternatives=runtime_alternatives(),
                          on_row=lambda r: print(format_row(r), flush=True))
    if args.output:
        write_json(args.output, [r.to_dict() for r in rows])
    return 0


def _host(args) -> int:
    from ..bench.runtime import HOST_SHAPES, format_host, host_matmul, host_overhead

    shapes = [tuple(s) for s in args.shape] if args.shape else list(HOST_SHAPES)
    if any(len(s) != 2 for s in shapes):
        raise UserError("--host: each --shape is N x K")
    batches = tuple(args.m) if getattr(args, "m", None) else (1, 8)
    _use_table(args)
    require_gpu()
    print("host time per call: matmul ...", file=sys.stderr, flush=True)
    rows = host_matmul(shapes, batches, dtype=args.dtype)
    print("host time per call: dequantize_4bit ...", file=sys.stderr, flush=True)
    deq = host_overhead(dtype=args.dtype)
    print(format_host(rows, deq), flush=True)
    if args.output:
        write_json(args.output, dict(matmul=rows, dequant=deq))
    return 0


def _matmul_runtime(args) -> int:
    from ..bench.runtime import bench_matmul_runtime, format_matmul_runtime

    if not args.shape:
        raise UserError("give at least one --shape (N x K) and --m for the matmul runtime")
    problems = problems_from_args(args)
    _use_table(args)
    require_gpu()
    reports = []
    for i, prob in enumerate(problems):
        print(f"[{i + 1}/{len(problems)}] {prob.label()}: the runtime as served against bnb", file=sys.stderr,
              flush=True)
        reports.append(bench_matmul_runtime(prob, seed=None if args.seed is None else args.seed + i,
                                            time_cap_s=args.time_cap))
    print(format_matmul_runtime(reports), flush=True)
    if args.output:
        write_json(args.output, reports)
    return 0


def _runtime(args) -> int:
    from ..bench.runtime import RUNTIME_SHAPES, bench_runtime_problem, format_runtime, host_overhead, linear4bit_forward

    if args.family == "matmul":
        return _matmul_runtime(args)
    _use_table(args)
    shapes = list(args.shape) if args.shape or args.model else list(RUNTIME_SHAPES)
    problems = problems_from_args(args, shapes=shapes)
    require_gpu()
    reports = []
    for i, prob in enumerate(problems):
        print(f"[{i + 1}/{len(problems)}] {prob.label()}: runtime against bnb", file=sys.stderr, flush=True)
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
        write_json(args.output, dict(runtime=[r.to_dict() for r in reports], host_us=overhead, linear4bit=linear))
    return 0


def _space_restriction(family, sweeps) -> dict:
    """--sweep KNOB=V1,V2 with --exhaustive: the space is restricted to those values (checked
    against the knob before any GPU work)."""
    from ..measure.bench import parse_knob_value

    restrict = {}
    for text in sweeps:
        if "=" not in text:
            raise UserError(f"--sweep {text!r} is not KNOB=V1,V2,...")
        knob, values = (x.strip() for x in text.split("=", 1))
        if knob not in family.knob_names:
            raise UserError(f"--sweep: {family.name} has no knob {knob!r}; knobs: {', '.join(family.knob_names)}")
        try:
            restrict[knob] = [parse_knob_value(family, knob, v) for v in values.split(",")]
        except InvalidConfig as e:
            raise UserError(f"--sweep: {e}") from None
    return restrict


def _fallback(args) -> int:
    from ..bench.fallback import fallback_distance, format_fallback
    from ..serve.table import current_table

    problems = problems_from_args(args)
    _use_table(args)
    table = current_table()
    repo = open_repo(args.fallback_vs, read_only=True)
    gpu = require_gpu()

    def progress(i, n, prob):
        print(f"[{i + 1}/{n}] {prob.label()}: served against tuned", file=sys.stderr, flush=True)

    try:
        reports = fallback_distance(problems, table, repo, gpu.name, seed=args.seed, progress=progress,
                                    time_cap_s=args.time_cap, flush_mode=args.flush)
    except ValueError as e:
        raise UserError(f"--fallback-vs: {e}") from None
    print(f"serving table: {table.origin}")
    print(format_fallback(reports), flush=True)
    if args.output:
        write_json(args.output, [r.to_dict() for r in reports])
    return 0


def _precompile(configs, arch) -> None:
    """Compile the screened configs in parallel processes through the on-disk cache first: the
    screen then only loads modules (a failing source stays a failing config in the screen)."""
    from ..kernel import compiler

    s = compiler.compile_many(list(dict.fromkeys(configs)), arch, progress=progress_printer(f"compile {arch}"))
    print(f"compiled {s.sources} distinct sources ({s.cache_hits} from cache, {len(s.failures)} failed) "
          f"in {s.seconds:.0f} s", flush=True)


def _exhaustive(args) -> int:
    problems = problems_from_args(args)
    family = get_family(args.family)
    restrict = _space_restriction(family, args.sweep)
    given = {p: [config_from_option(family, "--config", text, family.problem_values(p)) for text in args.config]
             for p in problems}
    spaces = {}
    for prob in problems:
        space = list(family.iter_space(experimental=args.experimental,
                                       **{**restrict, **{k: [v] for k, v in family.problem_values(prob).items()}}))
        if not space:
            raise UserError(f"--sweep {' '.join(args.sweep)}: no valid config of {prob.label()} is left")
        spaces[prob] = space
    repo = open_repo(args.compare_db, read_only=True) if args.compare_db else None
    gpu = require_gpu()
    store = None if args.no_db else open_repo(args.db, read_only=False)
    _precompile([c for prob in problems for c in spaces[prob] + given[prob]], gpu.arch)
    if store is None:
        return _exhaustive_screens(args, problems, family, spaces, given, repo, gpu, None)
    from ..measure.record import recorded_run

    with recorded_run("bench", None, gpu, command=command_line(), repo=store) as rec:
        code = _exhaustive_screens(args, problems, family, spaces, given, repo, gpu, rec)
    print(f"the finalists' measurements are stored as run {rec.run.id} in {store.url} (nf4-tune export makes the "
          "serving table of them)", file=sys.stderr)
    return code


def _exhaustive_screens(args, problems, family, spaces, given, repo, gpu, recorded) -> int:
    """Each problem's screen and final stage; the final stage's full-harness measurements are stored under
    ``recorded`` (None: not stored)."""
    from ..measure.bench import format_report
    from ..tune.exhaustive import exhaustive_best

    out = []
    for i, prob in enumerate(problems):
        compare = [("given: " + c.short(), c) for c in given[prob]]
        if repo is not None:
            best = repo.best(gpu.name, prob)
            if best is None:
                raise UserError(f"--compare-db holds no best config of {prob.label()} on {gpu.name}")
            c = family.from_dict(best[0])
            compare.append(("search best: " + c.short(), c))
        seed = None if args.seed is None else args.seed + 1000 * i
        rep = exhaustive_best(prob, spaces[prob], compare=compare, seed=seed, finalists=args.finalists, time_cap_s=args.time_cap,
                              progress=progress_printer(f"[{i + 1}/{len(problems)}] screen {prob.label()}"))
        print(f"{prob.label()}: screened {rep.screened} configs ({rep.failed} failed to load or launch) "
              f"in {rep.screen_seconds:.0f} s; finalists measured with the full harness:")
        for n, reason in rep.failure_reasons()[:5]:
            print(f"  failed x{n}: {reason}")
        print(format_report(rep.final), flush=True)
        best = rep.best()
        print(f"exhaustive best: {best.label} {best.median_us:.2f} us" if best else "exhaustive best: none valid")
        for label in rep.compared:
            r = rep.ratio(label)
            print(f"{label}: " + (f"{r:.4f}x the exhaustive best's time ({100 * (r - 1):+.2f}%)" if r else "invalid"))
        if recorded is not None and rep.final is not None:
            recorded.store(rep.final)
        out.append(rep.to_dict())
    if args.output:
        write_json(args.output, out)
    return 0
