"""How the H200's read bandwidth depends on the bytes each SM keeps in flight (Little's law, measured):
a persistent Triton read (programs per SM x a tile of BLOCK fp32 x ITERS loads, all issued before any
is added, no software pipelining across iterations: num_stages=1) over a 512 MiB buffer of random
data and over exactly 8192x8192's matmul bytes (34.7 MB), timed with the shared harness (L2 flushed,
CUDA events, medians). In flight per SM = programs per SM x BLOCK x ITERS x 4 bytes at most.

Usage: python3 ci/read_inflight.py
"""

import torch
import triton
import triton.language as tl

from tuner.families import MATMUL
from tuner.families.matmul import READ_BYTES
from tuner.measure.timing import measure_interleaved
from tuner.vocabulary import Problem


@triton.jit
def _persistent_read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK * ITERS, n, nprog * BLOCK * ITERS):
        for i in tl.static_range(ITERS):
            offs = start + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    small = MATMUL.traffic(Problem((8192, 8192), "bf16", "nf4", 64, "matmul", 1))
    bufs = {"512 MiB": torch.empty(READ_BYTES // 4, device="cuda").uniform_(-1, 1),
            f"8192x8192 ({small / 1e6:.1f} MB)": torch.empty(small // 4, device="cuda").uniform_(-1, 1)}
    parts = torch.empty(sms * 64, device="cuda")
    print(f"{'buffer':22s} {'per SM':>7s} {'KiB/prog':>8s} {'prog/SM':>7s} {'warps':>5s} {'us':>8s} {'IQR':>6s} "
          f"{'GB/s':>6s}")
    for name, buf in bufs.items():
        n = buf.numel()
        fns, geo = {}, {}
        for kib in (2, 4, 8, 16, 32):                         # bytes in flight per program
            for per_sm in (1, 2, 4, 8, 16):
                block = 1024
                iters = kib * 1024 // (4 * block)
                if iters < 1:
                    continue
                warps = 4
                if per_sm * kib > 128:                         # at most 128 KiB: half the register file
                    continue
                grid = (sms * per_sm,)
                label = f"{kib}K x{per_sm}"
                fns[label] = (lambda grid=grid, iters=iters, warps=warps:
                              _persistent_read[grid](buf, parts, n, BLOCK=1024, ITERS=iters, num_warps=warps,
                                                     num_stages=1))
                geo[label] = (kib * per_sm, kib, per_sm, warps)
        smp = measure_interleaved(fns, min_reps=15, time_cap_s=6.0)
        for label in sorted(fns, key=lambda k: geo[k]):
            s = smp[label]
            print(f"{name:22s} {geo[label][0]:5d} K {geo[label][1]:8d} {geo[label][2]:7d} {geo[label][3]:5d} "
                  f"{s.median:8.2f} {s.iqr:6.2f} {n * 4 / s.median / 1e3:6.0f}")


if __name__ == "__main__":
    main()
