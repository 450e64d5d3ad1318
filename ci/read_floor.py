"""What a pure read of a problem's bytes costs: a read-only reduction (torch.sum) of exactly as
many bytes as the matmul's traffic model counts, timed with the shared harness (L2 flushed,
CUDA events, medians), beside the large reduction the ceiling is measured on. A decode-sized
matmul cannot beat a plain read of its bytes; this says how far below the ceiling that read is.

With --tuned, each size is also read by a sweep of Triton kernels (programs of BLOCK fp32
values x ITERS loads, 4 or 8 warps, one partial sum per program; random data): the best of the
sweep is a tuned read of exactly those bytes, a tighter floor than torch.sum's one kernel.

Usage: python3 ci/read_floor.py [--tuned] [NxK ...]  (default: the matmul targets, bf16 nf4 bs64, M = 1)
"""

import sys

import torch

from tuner.families import MATMUL
from tuner.families.matmul import READ_BYTES
from tuner.measure.timing import measure_interleaved
from tuner.vocabulary import Problem

SHAPES = ("1024x4096", "4096x4096", "14336x4096", "4096x14336", "8192x8192", "28672x8192")


def _triton_reads(buf, sink_parts):
    """{label: fn} reading all of buf (fp32) with each Triton variant of the sweep."""
    import triton
    import triton.language as tl

    @triton.jit
    def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        base = pid * BLOCK * ITERS
        for i in tl.static_range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    n = buf.numel()
    fns = {}
    for block in (512, 1024, 2048, 4096):
        for iters in (1, 2, 4, 8):
            for warps in (4, 8):
                grid = (triton.cdiv(n, block * iters),)
                if grid[0] > sink_parts.numel():
                    continue
                fns[f"triton B{block} x{iters} w{warps}"] = (
                    lambda grid=grid, block=block, iters=iters, warps=warps:
                    _read[grid](buf, sink_parts, n, BLOCK=block, ITERS=iters, num_warps=warps))
    return fns


def main(argv):
    tuned = "--tuned" in argv
    argv = [a for a in argv if a != "--tuned"]
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
    if not tuned:
        return
    parts = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    print(f"\ntuned reads (the best of {len(_triton_reads(bufs[0], parts))} Triton variants per size, interleaved with "
          f"torch.sum of the same buffer; ceiling as above)")
    print(f"{'what':40s} {'us':>8s} {'IQR':>6s} {'GB/s':>7s} {'%ceil':>6s}  best variant; torch.sum us")
    for s, buf in zip(shapes, bufs):
        buf.uniform_(-1, 1)                                     # never time zeros
        fns = _triton_reads(buf, parts)
        fns["torch.sum"] = lambda buf=buf: torch.sum(buf, dim=0, out=sink)
        smp = measure_interleaved(fns, min_reps=20, time_cap_s=4.0)
        best = min((k for k in smp if k != "torch.sum"), key=lambda k: smp[k].median)
        b = buf.numel() * 4
        gbs = b / smp[best].median / 1e3
        print(f"{'tuned read ' + s:40s} {smp[best].median:8.2f} {smp[best].iqr:6.2f} {gbs:7.0f} {100 * gbs / ceil:6.1f}  "
              f"{best}; {smp['torch.sum'].median:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
