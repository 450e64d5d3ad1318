"""bnb's median over the nightly runs of one problem, read from a nightly database: each night's
bnb median and IQR, and whether the nights' medians stay within their IQR of each other (issue
13: references immune to host stalls). Reads only. Usage:
    python ci/bnb_nights.py DB --shape 4096x4096 [--dtype bf16] [--last 10]"""

import argparse
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/ci/", 1)[0])

from tuner.families import get as get_family  # noqa: E402
from tuner.measure.record import open_repository  # noqa: E402
from tuner.vocabulary import Problem  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--last", type=int, default=10)
    a = ap.parse_args(argv)
    repo = open_repository(a.db, must_exist=True)
    prob = Problem(tuple(int(x) for x in a.shape.split("x")), a.dtype, "nf4", 64)
    fam = get_family(prob.family)
    gpus = {g for g, p in repo.problems() if p == prob}
    if not gpus:
        print(f"{a.db}: no nights of {prob.label()}", file=sys.stderr)
        return 2
    gpu = sorted(gpus)[0]
    nights = [n for n in repo.regress_history(gpu, prob, fam.peer_label) if n["bnb_median_us"]][-a.last:]
    print(f"{prob.label()} on {gpu}: bnb over {len(nights)} nights")
    rows = []
    for n in nights:
        s = sorted(n["bnb_us"])
        q1, q3 = (statistics.quantiles(s, n=4)[0], statistics.quantiles(s, n=4)[2]) if len(s) >= 2 else (s[0], s[0])
        rows.append((n["bnb_median_us"], q1, q3))
        print(f"  run {n['run_id']:>4}  {n['flag']:<18} median {n['bnb_median_us']:7.2f} us  IQR {n['bnb_iqr_us']:.2f} "
              f"[{q1:.2f}, {q3:.2f}]  ({len(s)} samples)")
    meds = [r[0] for r in rows]
    spread = max(meds) - min(meds)
    iqr_med = statistics.median(r[2] - r[1] for r in rows)
    inside = all(r[1] <= m <= r[2] for r in rows for m in meds)
    print(f"medians {min(meds):.2f}..{max(meds):.2f} us (spread {spread:.2f} us; median IQR {iqr_med:.2f} us); "
          f"every night's median inside every night's IQR: {'yes' if inside else 'no'}")
    return 0 if len(rows) >= a.last and spread <= iqr_med else 1


if __name__ == "__main__":
    sys.exit(main())
