"""Serving-table entries from exhaustive screens (`nf4-tune bench --exhaustive -o FILE`, as the
ci/explore-*.sh runners write them): for each problem, the fastest config that passed the gate in the
full-harness finals (screened or given), with bnb's median from the same run. A problem whose best is
not faster than bnb gets no entry (bnb keeps serving it). Where the screen timed the served config beside
(``given: ...``), a screened config replaces it only if faster by more than --min-gain (default 2%, about
the finals' spread): a change within the noise is no change. The output is a table in the format
`nf4-tune export` writes, for ci/merge_table.py.

Usage: python3 ci/table_from_screens.py SCREEN.json [...] [--min-gain 0.02] -o NEW.json
"""

import argparse
import json
import sys

sys.path.insert(0, __file__.rsplit("/ci/", 1)[0])

from tuner._files import atomic_write  # noqa: E402
from tuner.serve.table import TABLE_FORMAT, ConfigTable  # noqa: E402


def entries_from_screen(report: dict, origin: str, min_gain: float = 0.0) -> list:
    """The table entry of one exhaustive report (a list of none or one): its fastest valid config, or the
    served one it was timed beside (``given: ...``) where that is within ``min_gain`` of the fastest."""
    final = report.get("final") or {}
    prob, results = final.get("problem"), final.get("results")
    gpu = (final.get("gpu_before") or {}).get("gpu_name")
    if not prob or not results or not gpu:
        raise ValueError(f"{origin}: not an exhaustive report (no final problem, results or GPU)")
    peer = next((r for r in results if r["label"] == final.get("peer_label")), None)
    ok = [r for r in results if r["status"] == "ok" and r.get("median_us")]
    if peer is None or not ok:
        return []
    best = min(ok, key=lambda r: r["median_us"])
    served = min((r for r in ok if r["label"].startswith("given: ")), key=lambda r: r["median_us"], default=None)
    if served is not None and best["median_us"] >= served["median_us"] * (1.0 - min_gain):
        best = served
    if best["median_us"] >= peer["median_us"]:
        return []
    return [dict(gpu=gpu, family=prob["family"], shape=list(prob["shape"]), dtype=prob["dtype"], quant=prob["quant"],
                 blocksize=prob["blocksize"], m=prob.get("m"), config=best["config"], median_us=best["median_us"],
                 peer_median_us=peer["median_us"], speedup_vs_bnb=peer["median_us"] / best["median_us"],
                 pct_copy=best["pct_copy"])]


def table_from_screens(paths, min_gain: float = 0.0) -> dict:
    """A table of the best entry per (GPU, problem) over the screens (the fastest where several
    screens measured one problem; in each, the served config kept unless beaten by more than ``min_gain``)."""
    best = {}
    for path in paths:
        with open(path) as f:
            reports = json.load(f)
        if not isinstance(reports, list):
            raise ValueError(f"{path}: not a list of exhaustive reports")
        for i, rep in enumerate(reports):
            for e in entries_from_screen(rep, f"{path}[{i}]", min_gain):
                (parsed,) = ConfigTable([e], f"{path}[{i}]").entries       # parsed as the runtime parses it
                key = (parsed.gpu, parsed.problem)
                if key not in best or e["median_us"] < best[key]["median_us"]:
                    best[key] = e
    return {"format": TABLE_FORMAT, "entries": list(best.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("screens", nargs="+", metavar="SCREEN.json")
    ap.add_argument("-o", "--output", required=True, metavar="NEW.json")
    ap.add_argument("--min-gain", type=float, default=0.02, metavar="FRACTION",
                    help="how much faster than the served config (timed beside it as 'given: ...') a screened "
                         "config must be to replace it (default 0.02: 2%%)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.min_gain < 1.0:
        ap.error(f"--min-gain must be in [0, 1), not {args.min_gain}")
    try:
        table = table_from_screens(args.screens, args.min_gain)
        atomic_write(args.output, json.dumps(table, indent=2) + "\n")
    except (OSError, ValueError, KeyError) as e:
        print(f"table_from_screens: {e}", file=sys.stderr)
        return 1
    for e in table["entries"]:
        print(f"{e['gpu']} {e['shape'][0]}x{e['shape'][1]} m{e['m']}: {e['median_us']:.2f} us, "
              f"{e['speedup_vs_bnb']:.2f}x bnb ({e['config'].get('mma')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
