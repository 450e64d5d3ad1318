"""``nf4-tune space``: a family's knobs, constraints, presets and size."""

from __future__ import annotations

import json

from ..families import get as get_family
from ._common import add_family_arg


def add_parser(sub):
    p = sub.add_parser("space", help="print a family's knobs, constraints and the size of its space",
                       description="Print every knob of a family's template (source knobs render macros, launch "
                                   "knobs change only the launch, problem knobs come from the problem), the "
                                   "constraints that rule points out, the presets, the search parameters, and how "
                                   "many configurations and distinct CUDA sources the space holds.")
    add_family_arg(p)
    p.add_argument("--dtype", action="append", help="restrict to these output/activation dtype(s)")
    p.add_argument("--quant", action="append", help="restrict to these quant type(s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def describe(family, restrict: dict) -> dict:
    """The space of ``family`` (restricted problem knobs) as plain values: the library call."""
    configs = list(family.iter_space(**restrict))
    return dict(family=family.name, knobs={k.name: dict(values=list(k.values), role=k.role, help=k.help)
                                           for k in family.knobs},
                constraints=list(getattr(family, "constraint_text", ())),
                search_parameters=[family.param_name(g) for g in family.groups],
                size=family.space_size(**restrict), distinct_sources=len(family.distinct_sources(configs)),
                presets=family.presets)


def run(args) -> int:
    family = get_family(args.family)
    restrict = {}
    if args.dtype:
        restrict["dtype"] = args.dtype
    if args.quant:
        restrict["quant"] = args.quant
    try:
        d = describe(family, restrict)
    except ValueError as e:
        from ._common import UserError

        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(d, indent=2, default=str))
        return 0
    print(f"family {family.name}: {family.title} (template kernel_templates/{family.template})")
    print("knobs:")
    for k in family.knobs:
        shown = ", ".join("None" if v is None else str(v) for v in k.values)
        print(f"  {k.name:<17} {k.role:<7} {shown:<44} {k.help}")
    print("constraints:")
    for c in d["constraints"]:
        print(f"  {c}")
    print("search parameters (knobs tied by a constraint are one): " + ", ".join(d["search_parameters"]))
    print("presets: " + (", ".join(sorted(family.presets)) or "none"))
    print(f"configurations: {d['size']}")
    print(f"distinct CUDA sources: {d['distinct_sources']}")
    return 0
