"""``nf4-tune compile``: every distinct source of a family's space, compiled with NVRTC; or (``--served``)
the serving table's configs, with each one's registers, spills and, for matmul, the bytes of W its main
loop retires per warp-instruction (:func:`nf4tune.kernel.sass.w_bytes_per_instruction`)."""

from __future__ import annotations

import json
import os

from ..families import get as get_family
from ._common import EXIT_FAILED, UserError, add_family_arg, fmt, positive_int, progress_printer


def add_parser(sub):
    p = sub.add_parser("compile", help="compile every distinct source of a family's space with NVRTC",
                       description="Compile the whole space (or the dtypes/quants given) to CUBIN with NVRTC in "
                                   "parallel processes, through the on-disk cache. Any real arch the installed NVRTC "
                                   "supports is a target (without --arch: the visible GPU's). Prints the count, "
                                   "failures and time; exits 1 if any source fails. --cover N compiles a covering "
                                   "sample instead, for a quick check of every N-knob interaction. The space is "
                                   "counted from the family's declaration; only its distinct sources are listed "
                                   "(one config each), with a progress line. --served compiles the serving table's "
                                   "configs instead and prints each one's registers, spills and (matmul) bytes of W "
                                   "per warp-instruction of its steady-state main loop, counted from the SASS on the "
                                   "CPU.")
    add_family_arg(p)
    p.set_defaults(family=None)       # compile: dequant; --served: every family of the table
    p.add_argument("--arch", default=None, help="target arch, e.g. sm_90, sm_100, sm_120 (default: the visible GPU's)")
    p.add_argument("--dtype", action="append")
    p.add_argument("--quant", action="append")
    p.add_argument("--sweep", action="append", default=[], metavar="KNOB=V1,V2",
                   help="compile only the space's configs with these knob values (e.g. matmul: m=1,16 or "
                        "mma=mma-ks); repeatable")
    p.add_argument("--cover", type=positive_int, default=None, metavar="N",
                   help="compile only a covering sample: sources such that every combination of N source-knob "
                        "values that any source of the space has is in one of them; default: every distinct "
                        "source")
    p.add_argument("--experimental", action="store_true",
                   help="the whole space: the experimental knob values too (default: the default space; a "
                        "value named in --sweep is taken either way)")
    p.add_argument("--workers", type=positive_int, default=None, help="parallel compile processes, at least 1 "
                                                                         "(default: the CPU count)")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="cache folder, made if missing (default: $NF4TUNE_CACHE or ~/.cache/nf4-tune/cubin)")
    p.add_argument("--served", action="store_true",
                   help="compile the configs of the serving table ($NF4TUNE_CONFIGS or the packaged table, the "
                        "per-user table over it; --table names another) of --family (default: every family) and "
                        "print each one's registers, spills and, for matmul, B/instr: bytes of W per "
                        "warp-instruction of its steady-state main loop (the full-warp, nested-statistics path: "
                        "32 x the bytes of W a lane loads per trip / the warp-instructions per trip)")
    p.add_argument("--table", default=None, metavar="PATH", help="with --served: this table file instead")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _arch(args) -> str:
    from ..kernel.arch import check_arch, supported_archs
    from ..kernel.gpu import NoGPUError, require_gpu

    if args.arch:
        try:
            return check_arch(args.arch)
        except ValueError as e:
            raise UserError(str(e)) from None
    try:
        return require_gpu().arch
    except NoGPUError:
        raise UserError("no GPU is visible to take the arch from: pass --arch (one of "
                        f"{', '.join(supported_archs())})") from None


def _cache(path):
    if path is None:
        return None
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--cache {path} is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"--cache {path}: cannot make the folder: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"--cache {path} is not writable")
    return path


def _list_sources(family, args, restrict, count) -> list:
    """One config per distinct source of the space (the enumeration the compile needs), with a
    progress line unless --quiet."""
    import sys

    total = int(round(count.sources))
    if not args.quiet:
        print(f"listing the {'about ' if not count.exact else ''}{total} distinct sources of the "
              f"{'whole' if args.experimental else 'default'} space ({'' if count.exact else 'estimated; '}"
              f"{int(round(count.configs))} configurations)", file=sys.stderr, flush=True)
    show = None if args.quiet else progress_printer(f"list {family.name} sources")
    out = []
    for c in family.iter_sources(experimental=args.experimental, **restrict):
        out.append(c)
        if show and len(out) % 1000 == 0:
            show(min(len(out), total), max(total, len(out)))
    if show:
        show(len(out), len(out))
    return out


def _served_configs(args) -> tuple:
    """(the table's origin, {config: [its entries]}) of --family (every family without it)."""
    from ..serve import table as tables

    try:
        table = tables.ConfigTable.from_file(args.table) if args.table else tables.current_table()
    except ValueError as e:
        raise UserError(str(e)) from None
    out: dict = {}
    for e in table.entries:
        if args.family is None or e.problem.family == args.family:
            out.setdefault(e.config, []).append(e)
    if not out:
        raise UserError(f"the serving table {table.origin} holds no {args.family or ''} config".replace("  ", " "))
    return table.origin, out


def _served_for(entries) -> str:
    """Where a config serves: each GPU model (without "NVIDIA ") and its shapes (N x K, bs if not 64)."""
    gpus: dict = {}
    for e in entries:
        p = e.problem
        gpus.setdefault(e.gpu.replace("NVIDIA ", ""), []).append(
            "x".join(map(str, p.shape)) + ("" if p.blocksize == 64 else f" bs{p.blocksize}"))
    return "; ".join(f"{gpu}: {', '.join(sorted(set(shapes)))}" for gpu, shapes in sorted(gpus.items()))


def run_served(args, arch, cache) -> int:
    from ..kernel import compiler
    from ..kernel.sass import w_bytes_per_instruction

    origin, served = _served_configs(args)
    configs = list(served)
    def source(c):
        return c.family.name, tuple(sorted(c.source_knobs().items()))

    failed = {}                    # (family, source knobs) -> the compile error
    for name in sorted({c.family.name for c in configs}):
        mine = [c for c in configs if c.family.name == name]
        summary = compiler.compile_many(mine, arch, workers=args.workers, cache_dir=cache,
                                        progress=None if args.quiet else progress_printer(f"compile {name} {arch}"))
        failed.update({source(c): err for c, err in summary.failures})

    rows = []
    for c in configs:
        row = dict(family=c.family.name, config=c.to_dict(), label=c.short(), served_for=_served_for(served[c]),
                   m=min((e.problem.m for e in served[c] if e.problem.m is not None), default=None))
        err = failed.get(source(c))
        if err:
            row.update(error=err.splitlines()[0])
        else:
            k = compiler.compile_config(c, arch, cache_dir=cache)
            row.update(registers=k.registers, spill_stores=k.spill_stores, spill_loads=k.spill_loads)
            if c.family.name == "matmul":
                try:
                    d = w_bytes_per_instruction(c, arch, cache_dir=cache)
                    row.update(bytes_per_instruction=round(d.bytes_per_instruction, 2), loop=d.to_dict())
                except (ValueError, FileNotFoundError) as e:
                    row.update(bytes_per_instruction=None, loop_note=str(e))
        rows.append(row)
    rows.sort(key=lambda r: (r["family"], r["m"] or 0, -(r.get("bytes_per_instruction") or 0), r["label"]))
    if args.json:
        print(json.dumps(dict(arch=arch, nvrtc=compiler.nvrtc_version(), table=origin, configs=rows,
                              failures=len(failed)), indent=2))
    else:
        print(f"the serving table {origin}: {len(rows)} distinct configs of {sum(len(v) for v in served.values())} "
              f"entries, arch {arch}, NVRTC {compiler.nvrtc_version()}")
        print("B/instr: bytes of W per warp-instruction in the steady-state main loop (full warps, nested "
              "statistics; 32 x W bytes a lane loads per trip / warp-instructions per trip), from the SASS")
        print(f"{'family':<8} {'m':>3} {'B/instr':>7} {'regs':>4} {'spills':>6}  config  [served for]")
        for r in rows:
            if "error" in r:
                print(f"{r['family']:<8} {fmt(r['m'], '%d'):>3} {'-':>7} {'-':>4} {'-':>6}  {r['label']}  FAILED: "
                      f"{r['error']}")
                continue
            bpi = fmt(r.get("bytes_per_instruction"), "%.2f")
            spills = f"{r['spill_stores'] or 0}/{r['spill_loads'] or 0}"
            print(f"{r['family']:<8} {fmt(r['m'], '%d'):>3} {bpi:>7} {fmt(r['registers'], '%d'):>4} {spills:>6}  "
                  f"{r['label']}  [{r['served_for']}]")
    return EXIT_FAILED if failed else 0


def run(args) -> int:
    from ..kernel import compiler

    if args.served:
        given = [flag for flag, v in (("--dtype", args.dtype), ("--quant", args.quant), ("--sweep", args.sweep),
                                      ("--cover", args.cover), ("--experimental", args.experimental)) if v]
        if given:
            raise UserError(f"--served compiles the serving table's configs: {', '.join(given)} do not apply")
        return run_served(args, _arch(args), _cache(args.cache))
    if args.table:
        raise UserError("--table goes with --served")
    args.family = args.family or "dequant"
    family = get_family(args.family)
    arch = _arch(args)
    cache = _cache(args.cache)
    from .bench import _space_restriction

    restrict = {k: v for k, v in (("dtype", args.dtype), ("quant", args.quant)) if v}
    restrict.update(_space_restriction(family, args.sweep))
    try:
        count = family.count(experimental=args.experimental, **restrict)
    except ValueError as e:
        raise UserError(str(e)) from None
    if not count.sources:
        raise UserError("no valid config is left in the space with " + " ".join(f"--sweep {s}" for s in args.sweep))
    configs = _list_sources(family, args, restrict, count)
    space = (count.configs, count.sources)
    if args.cover:
        configs = family.covering_sources(configs, args.cover)
    summary = compiler.compile_many(configs, arch, workers=args.workers, cache_dir=cache,
                                    progress=None if args.quiet else progress_printer(f"compile {family.name} {arch}"))
    if args.json:
        out = summary.to_dict()
        if args.cover:
            out["cover"] = dict(strength=args.cover, space_configs=space[0], space_sources=space[1])
        out["space"] = dict(count.to_dict(), experimental=args.experimental)
        print(json.dumps(out, indent=2))
    else:
        est = "" if count.exact else " (estimated)"
        print(f"{family.name}, arch {arch}, NVRTC {compiler.nvrtc_version()}: {space[0]:.0f} configurations, "
              f"{space[1]:.0f} distinct sources{est}" + ("" if args.experimental else " (the default space)"))
        if args.cover:
            print(f"covering sample of strength {args.cover}: {summary.sources} sources")
        print(f"compiled {summary.compiled} ({summary.cache_hits} from cache), failures {len(summary.failures)}, "
              f"{summary.seconds:.1f} s")
        print(f"max registers {summary.max_registers}, sources with spills {summary.spilling}")
        for config, err in summary.failures[:20]:
            print(f"  FAILED {config.to_json()}: {err.splitlines()[0]}")
    return EXIT_FAILED if summary.failures else 0
