"""Plant a deliberately slow config as the stored best of one problem, to show that the nightly
job flags it (the evidence run of the regression issue; never part of a real night).

It picks, among the configs already measured for the problem on that GPU, one whose median time
lies between --min and --max times the best's, and stores for it a fake measurement in a new run
whose command line and label say PLANTED: a median of half the best's time, so that
`nf4-tune regress` takes it as the best and re-measures it for real.

Usage: python3 ci/plant_slow_config.py --db DB --shape 8192x8192 [--dtype bf16] [--min 1.08 --max 1.6]
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--shape", required=True)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--quant", default="nf4")
    p.add_argument("--blocksize", type=int, default=64)
    p.add_argument("--gpu", default="NVIDIA H200")
    p.add_argument("--min", type=float, default=1.08, help="slowest/fastest ratio at least")
    p.add_argument("--max", type=float, default=1.6, help="slowest/fastest ratio at most")
    a = p.parse_args(argv)

    from tuner.measure.record import open_repository
    from tuner.vocabulary import Problem

    repo = open_repository(a.db)
    prob = Problem(Problem.parse_shape(a.shape), a.dtype, a.quant, a.blocksize)
    best = repo.best(a.gpu, prob)
    if best is None:
        print(f"no stored best for {prob.label()} on {a.gpu}", file=sys.stderr)
        return 1
    best_knobs, best_m, _ = best
    rows = repo.config_measurements(a.gpu, prob)
    picks = sorted(((m.median_us / best_m.median_us, m, c, r) for m, c, r in rows
                    if a.min <= m.median_us / best_m.median_us <= a.max and (m.speedup or 0) > 1.0),
                   key=lambda t: t[0])
    if not picks:
        print(f"no measured config between {a.min}x and {a.max}x the best", file=sys.stderr)
        return 1
    ratio, m, c, r = picks[len(picks) // 2]
    knobs = json.loads(c.knobs)
    gpu_row, env_row = repo.run_context(r.id)   # the planted run claims the GPU and environment of the measured one
    planted = repo.start_run("bench", gpu_row, env_row,
                             command="ci/plant_slow_config.py " + " ".join(sys.argv[1:] if argv is None else argv))
    fake = best_m.median_us / 2
    repo.add_measurement(planted, prob, dict(label=f"PLANTED (deliberately slow, fake time): {m.label}"[:128],
                                             status="ok", reason="planted by ci/plant_slow_config.py",
                                             median_us=fake, samples_us=[fake], speedup_vs_bnb=None),
                         repo.config(knobs, c.template_hash, c.family))
    repo.finish_run(planted)
    print(f"planted {m.label} (measured {m.median_us:.2f} us = {ratio:.2f}x the best {best_m.median_us:.2f} us) "
          f"as the best of {prob.label()} (run {planted.id})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
