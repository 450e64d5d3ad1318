"""Is this GPU machine sane? Run first, before any GPU test or benchmark (ci/gpu-suite.sh and ci/nightly.sh do).

An H100 once failed 188 of 192 GPU tests, the dequant runtime included (code unchanged since it last passed),
with mismatches whose first differing element read back equal a moment later: the output changed after the
comparison. This check tells a bad machine from a bad change in a few seconds:
- the versions and the CUDA environment variables;
- the driver's current context before and after a launch of ours (one context: torch's primary);
- 20 runs each of bnb's dequantize beside the runtime's, compared bit for bit straight after the launch
  (stream order alone) and after a device synchronize;
- a torch matmul run twice (the same bits on a healthy GPU).
Exit 1 when anything differs, 2 without a CUDA GPU. Usage: python3 ci/machine_check.py
"""
import os
import sys

import bitsandbytes.functional as F
import cuda.bindings
import cuda.core
import torch
from cuda.bindings import driver

from nf4tune import serve as runtime
from nf4tune.families.dequant import mismatch_report


def main() -> int:
    print("torch", torch.__version__, "cuda.core", cuda.core.__version__, "cuda.bindings", cuda.bindings.__version__)
    if not torch.cuda.is_available():
        print("machine check: no CUDA GPU is visible")
        return 2
    print("env", {k: v for k, v in os.environ.items() if "CUDA" in k or "NVIDIA" in k})
    torch.zeros(1, device="cuda")
    print("context after torch", driver.cuCtxGetCurrent()[1])
    w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    A, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    runtime.dequantize_4bit(A, qs)
    print("context after ours", driver.cuCtxGetCurrent()[1], "torch stream", torch.cuda.current_stream().cuda_stream)
    bad = 0
    for mode in ("stream order", "synchronized"):
        runs = 0
        for _ in range(20):
            want = F.dequantize_4bit(A, qs)
            got = runtime.dequantize_4bit(A, qs)
            if mode == "synchronized":
                torch.cuda.synchronize()
            runs += mismatch_report(got, want) is not None
        print(f"{mode}: {runs} of 20 runs differ from bnb")
        bad += runs
    wf = w.float()
    same = torch.equal(wf @ wf.T, wf @ wf.T)
    print("torch matmul twice, same bits:", same)
    return 1 if bad or not same else 0


if __name__ == "__main__":
    sys.exit(main())
