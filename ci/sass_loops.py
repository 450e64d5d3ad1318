#!/usr/bin/env python3
"""The SASS loops of one variant, counted on the CPU (tuner.kernel.sass): compiles the config with NVRTC
for an arch (sm_90 by default), disassembles it with nvdisasm and prints every loop of at least --min
instructions: its static length, the length of the path through the first arm of each if/else in it
(in the matmul loops the other arm is the bounds-checked loads of a partial step) and that path's
instruction mix. Nothing runs on a GPU; nothing is written but the compile cache.

    python3 ci/sass_loops.py '{"mma": "mma-rows", "load_bytes": 8, ...}' [--family matmul] [--arch sm_90]
"""

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="the variant's knobs as JSON (the family's defaults fill the rest)")
    ap.add_argument("--family", default="matmul", choices=("matmul", "dequant"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--min", type=int, default=100, help="shortest loop reported (instructions, default 100)")
    ap.add_argument("--cache", default=None, help="compile cache folder (default: the tuner's)")
    args = ap.parse_args(argv)

    from tuner.families import get as get_family
    from tuner.kernel.compiler import compile_config
    from tuner.kernel.sass import disassemble, loops

    try:
        config = get_family(args.family).config(**json.loads(args.config))
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        kernel = compile_config(config, args.arch, cache_dir=args.cache)
        sass = disassemble(kernel.cubin)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{config.short()} ({args.arch}): {kernel.registers} registers, {kernel.spill_stores} spill stores, "
          f"{sass.count(chr(10))} lines of SASS")
    for lp in loops(sass, args.min):
        top = ", ".join(f"{op} {n}" for op, n in lp.mix[:12])
        print(f"  loop {lp.start}-{lp.end}: {lp.static} static, {lp.path} on the first arms: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
