"""From `bench --exhaustive -o FILE.json` results, the fastest screened config for each value of
one knob.

Usage:
  python3 ci/explore_best.py FILE.json KNOB
      the configs as JSON objects separated by '|' (for MM_PROFILE_CONFIGS of ci/gpu-session.sh)
  python3 ci/explore_best.py --table KNOB FILE.json [FILE.json ...]
      a line per file and problem: the best screened time (us) at each value of KNOB
"""

import json
import sys


def _results(path: str) -> list:
    with open(path) as f:
        data = json.load(f)
    return data if isinstance(data, list) else [data]


def best_by(path: str, knob: str) -> list:
    """The fastest screened config of the file's first problem for each value of ``knob``."""
    return [c for _, c in _best(_results(path)[0], knob).values()]


def _best(result: dict, knob: str) -> dict:
    best: dict = {}
    for text, us in result["screen_us"].items():
        if us is None:      # screened and failed (a failing config is data)
            continue
        c = json.loads(text)
        v = c.get(knob)
        if v not in best or us < best[v][0]:
            best[v] = (us, c)
    return {v: best[v] for v in sorted(best, key=_order)}


def _order(v):
    """Numbers in numeric order, then the rest by name."""
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))


def table(paths: list, knob: str) -> list:
    """A line per (file, problem): the best screened us at each value of ``knob``."""
    lines = []
    for path in paths:
        for result in _results(path):
            p = result["problem"]
            label = f"{p['shape'][0]}x{p['shape'][1]} M={p.get('m', '-')}"
            cells = "  ".join(f"{knob}={v}: {us:.1f}" for v, (us, _) in _best(result, knob).items())
            lines.append(f"{path.rsplit('/', 1)[-1]}  {label}  {cells}")
    return lines


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "--table":
        print("\n".join(table(args[2:], args[1])))
    elif len(args) == 2 and not args[0].startswith("--"):
        print("|".join(json.dumps(c) for c in best_by(args[0], args[1])))
    else:
        sys.exit(__doc__)
