"""The matmul family: ``y = A @ dequant(W).T (+ bias)`` straight from bnb's packed weight, for
decode (M = 1..64 rows of A).

A problem is the weight's shape N x K (bnb's ``[out_features, in_features]``), the activation
dtype, the quant type, the blocksize and the batch bucket ``m`` (1, 2, 4, ..., 64: a call with
M rows is served by the bucket >= M).

The declaration is split by what it is about:

- :mod:`.space`: the knobs and the constraints (and which template files each structure takes:
  kernel_templates/matmul/, each file's header says what its knobs change);
- :mod:`.resources`: registers and shared memory a variant holds (the constraints bound them;
  mma-cols' window, stage and table too);
- :mod:`.plan`: bnb's input checks and the launch plan;
- :mod:`.gate`: inputs, the fp64 reference and the derived error bound;
- :mod:`.peers`: bnb's ``matmul_4bit``, a dense F.linear and the read ceiling.
"""

from __future__ import annotations

from ...family import Family
from ...vocabulary import BLOCKSIZES, DTYPES, M_BUCKETS, OUT_BYTES, QUANTS, REF_READ, Problem
from .gate import MatmulGate, MatmulInputs, error_bound, gamma
from .peers import READ_BYTES, REF_BNB_MATMUL, REF_DENSE, MatmulPeers, read_reduction
from .plan import MAX_WEIGHT, MatmulLaunch, MatmulPlan, check_matmul_inputs, stat_args
from .resources import (bulk_chunk, bulk_ring_bytes, bulk_row_bytes, bulk_stage_bytes, cols_pitch, cols_registers,
                        cols_smem, cols_stage_bytes, cols_window, ks_registers, ring_bytes, rows_registers, rows_span,
                        rows_stage_bytes, scale_table_bytes, stream_k_cta, stream_k_parts, stream_k_runs)
from .space import CONSTRAINTS, HEADERS, KNOBS, PRESETS, STRUCTURES, rounded_codes, structure

__all__ = ["MATMUL", "MatmulFamily", "MatmulPlan", "MatmulInputs", "REF_BNB_MATMUL", "REF_DENSE", "error_bound",
           "check_matmul_inputs", "gamma", "rounded_codes", "stat_args", "read_reduction", "READ_BYTES",
           "ks_registers", "rows_registers", "rows_span", "rows_stage_bytes", "scale_table_bytes", "ring_bytes",
           "bulk_chunk", "bulk_row_bytes", "bulk_stage_bytes", "bulk_ring_bytes", "stream_k_runs", "stream_k_cta",
           "stream_k_parts", "cols_registers", "cols_window", "cols_pitch", "cols_stage_bytes", "cols_smem"]


class MatmulFamily(MatmulGate, MatmulPeers, MatmulLaunch, Family):
    name = "matmul"
    headers = HEADERS
    structures = STRUCTURES
    kernel_name = "nf4t_matmul"
    title = "bnb's grad-free matmul_4bit (decode, M = 1..64) fused from the packed weight"
    knobs = KNOBS
    constraints = CONSTRAINTS
    presets = PRESETS
    peer_label = REF_BNB_MATMUL
    ceiling_label = REF_READ
    problem_knobs = {"dtype": "dtype", "quant": "quant", "m": "m"}

    def structure(self, config) -> str:
        return structure(config)

    # -- problems ------------------------------------------------------------------------
    def check_problem(self, problem: Problem) -> None:
        if problem.family != self.name:
            raise ValueError(f"problem of family {problem.family!r} given to {self.name!r}")
        if len(problem.shape) != 2:
            raise ValueError(f"{problem.label()}: the matmul family's shape is N x K (out x in features)")
        if problem.dtype not in DTYPES or problem.quant not in QUANTS:
            raise ValueError(f"{problem.label()}: dtype {problem.dtype!r} / quant {problem.quant!r} unknown")
        if problem.blocksize not in BLOCKSIZES:
            raise ValueError(f"blocksize {problem.blocksize} is not one of {list(BLOCKSIZES)}")
        if problem.m not in M_BUCKETS:
            raise ValueError(f"{problem.label()}: m must be one of {list(M_BUCKETS)}")
        N, K = problem.shape
        if K % problem.blocksize:
            raise ValueError(f"{problem.label()}: K={K} is not a multiple of the blocksize; bnb does not fuse "
                             "such a matmul and neither does nf4-tune (bnb's own path serves it)")
        if N * K > MAX_WEIGHT:
            raise ValueError(f"{problem.label()}: the weight exceeds 2**31-1 values")

    def builtin_default(self, problem: Problem):
        m = problem.m or 1
        pv = self.problem_values(problem)
        # bf16 / fp16: tensor cores with K over the warps, the winners of an exploration of mma-ks on the
        # H200 at 8192x8192: batch tile 8 up to m = 8, 16 above
        if problem.dtype != "fp32":
            ks = dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, lut="pair", scale="block", wload="stream",
                      unroll=2, ksplit=1, **pv)
            if m <= 8:
                return self.config(mtile=8, warps=8, **ks)
            return self.config(mtile=16, warps=4, prefetch=1, persist=1, **ks)
        if m >= 8:
            return self.config(load_bytes=4, rows_per_warp=4, mtile=8, warps=4, ksplit=2, **pv)
        if m == 4:
            return self.config(load_bytes=8, rows_per_warp=4, mtile=4, warps=4, ksplit=2, **pv)
        return self.config(load_bytes=16, rows_per_warp=4, mtile=min(m, 2), warps=4, ksplit=2, **pv)

    def traffic(self, problem: Problem, nested: bool = True, groupsize: int = 256) -> int:
        """The fewest bytes the matmul moves: packed W, its statistics, A and y."""
        N, K = problem.shape
        M = problem.m or 1
        nblocks = N * K // problem.blocksize
        stats = nblocks + (-(-nblocks // groupsize)) * 4 + 256 * 4 + 4 if nested else nblocks * 4
        eb = OUT_BYTES[problem.dtype]
        return N * K // 2 + stats + M * K * eb + M * N * eb


MATMUL = MatmulFamily()
