"""``nf4-tune space``: a family's knobs, constraints, presets and size.

The counts are computed from the declaration (knobs tied by constraints counted together, distinct
sources as the distinct values of the knobs that render the source): nothing is enumerated, so the
command answers in about a second for every family. Where a family's constraints make an exact
count too slow, it prints an estimate, marked as such, with its error.
"""

from __future__ import annotations

import json

from ..families import get as get_family
from ._common import add_family_arg


def add_parser(sub):
    p = sub.add_parser("space", help="print a family's knobs, constraints and the size of its space",
                       description="Print every knob of a family's templates (source knobs render macros, launch "
                                   "knobs change only the launch, problem knobs come from the problem), the "
                                   "constraints that rule points out, the presets, the search parameters, the "
                                   "template files of each structure, and how many configurations and distinct "
                                   "CUDA sources the space holds (computed from the declaration, not enumerated; "
                                   "an estimate says so). Values marked * are experimental: they never won a "
                                   "served table entry and are left out of the default space; --experimental "
                                   "counts them in.")
    add_family_arg(p)
    p.add_argument("--dtype", action="append", help="restrict to these output/activation dtype(s)")
    p.add_argument("--quant", action="append", help="restrict to these quant type(s)")
    p.add_argument("--experimental", action="store_true",
                   help="the whole space: the experimental knob values too (default: the default space)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _number(x):
    return int(x) if float(x).is_integer() else x


def describe(family, restrict: dict, experimental: bool = False) -> dict:
    """The space of ``family`` (restricted problem knobs) as plain values: the library call."""
    count = family.count(experimental=experimental, **restrict)
    out = dict(family=family.name,
               experimental=experimental,
               knobs={k.name: dict(values=list(k.values), role=k.role, default=k.default,
                                   experimental=list(k.experimental), macro=k.macro, help=k.help)
                      for k in family.knobs},
               constraints=[dict(knobs=list(c.knobs), help=c.text) for c in family.constraints],
               search_parameters=[family.param_name(g) for g in family.groups],
               structures={name: list(family.headers) + list(files) for name, files in family.structures.items()},
               size=_number(count.configs), distinct_sources=_number(count.sources), count=count.to_dict(),
               presets=family.presets)
    if not experimental:
        whole = family.count(experimental=True, **restrict)
        out["whole_space"] = dict(size=_number(whole.configs), distinct_sources=_number(whole.sources),
                                  count=whole.to_dict())
    return out


def _count_text(count: dict, what: str) -> str:
    if count["exact"]:
        return str(int(count[what]))
    return (f"about {count[what]:.0f} +- {count[what + '_error']:.0f} (an estimate: Knuth's random probes, "
            "95% interval; the exact count would take too long)")


def run(args) -> int:
    family = get_family(args.family)
    restrict = {}
    if args.dtype:
        restrict["dtype"] = args.dtype
    if args.quant:
        restrict["quant"] = args.quant
    try:
        d = describe(family, restrict, args.experimental)
    except ValueError as e:
        from ._common import UserError

        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(d, indent=2, default=str))
        return 0
    print(f"family {family.name}: {family.title}")
    print("knobs (* experimental: never won a served table entry, left out of the default space):")
    for k in family.knobs:
        shown = ", ".join(("None" if v is None else str(v)) + ("*" if v in k.experimental else "") for v in k.values)
        print(f"  {k.name:<17} {k.role:<7} {shown:<44} {k.help}")
    print("constraints:")
    for c in d["constraints"]:
        print(f"  ({', '.join(c['knobs'])}): {c['help']}")
    print("search parameters (knobs tied by a constraint are one): " + ", ".join(d["search_parameters"]))
    print("presets: " + (", ".join(sorted(family.presets)) or "none"))
    print("template files per structure (kernel_templates/):")
    for name, files in d["structures"].items():
        print(f"  {name}: {' + '.join(files)}")
    space = "the whole space (experimental values included)" if args.experimental else "the default space"
    print(f"{space}, counted from the declaration in {d['count']['seconds']:.2f} s:")
    print(f"configurations: {_count_text(d['count'], 'configs')}")
    print(f"distinct CUDA sources: {_count_text(d['count'], 'sources')}")
    if "whole_space" in d:
        w = d["whole_space"]
        print(f"with --experimental: {w['size']} configurations, {w['distinct_sources']} distinct CUDA sources"
              + ("" if w["count"]["exact"] else " (estimated)"))
    return 0
