"""What a pure read of a problem's bytes costs: a read-only reduction (torch.sum) of exactly as
many bytes as the matmul's traffic model counts, timed with the shared harness (L2 flushed,
CUDA events, medians), beside the large reduction the ceiling is measured on. A decode-sized
matmul cannot beat a plain read of its bytes; this says how far below the ceiling that read is.

Usage: python3 ci/read_floor.py [NxK ...]     (default: the matmul targets, bf16 nf4 bs64, M = 1)
"""

import sys

import torch

from tuner.families import MATMUL
from tuner.families.matmul import READ_BYTES
from tuner.measure.timing import measure_interleaved
from tuner.vocabulary import Problem

SHAPES = ("1024x4096", "4096x4096", "14336x4096", "4096x14336", "8192x8192", "28672x8192")


def main(argv):
    shapes = argv or SHAPES
    big = torch.ones(READ_BYTES // 4, dtype=torch.float32, device="cuda")
    sink = torch.empty((), dtype=torch.float32, device="cuda")
    fns, nbytes = {"ceiling (512 MiB)": lambda: torch.sum(big, dim=0, out=sink)}, {"ceiling (512 MiB)": READ_BYTES}
    bufs = []
    for s in shapes:
        n, k = (int(x) for x in s.split("x"))
        b = MATMUL.traffic(Problem((n, k), "bf16", "nf4", 64, "matmul", 1))
        buf = torch.ones(b // 4, dtype=torch.float32, device="cuda")
        bufs.append(buf)
        fns[f"read {s} ({b / 1e6:.1f} MB)"] = (lambda buf=buf: torch.sum(buf, dim=0, out=sink))
        nbytes[f"read {s} ({b / 1e6:.1f} MB)"] = b
    samples = measure_interleaved(fns, min_reps=30, time_cap_s=5.0)
    ceil = READ_BYTES / samples["ceiling (512 MiB)"].median / 1e3
    print(f"{'what':40s} {'us':>8s} {'IQR':>6s} {'GB/s':>7s} {'%ceil':>6s}  80% of ceiling would be")
    for name, smp in samples.items():
        gbs = nbytes[name] / smp.median / 1e3
        print(f"{name:40s} {smp.median:8.2f} {smp.iqr:6.2f} {gbs:7.0f} {100 * gbs / ceil:6.1f}  "
              f"{nbytes[name] / (0.8 * ceil * 1e3):.2f} us")


if __name__ == "__main__":
    main(sys.argv[1:])
