"""Benchmarking variants against bnb on one problem: gate first, then the shared harness.

For each problem: every candidate passes the bit-exact gate (fresh random data at the
problem's shape and an odd shape) or is reported invalid with the reason, never timed. The
valid ones are timed interleaved with bnb's full ``dequantize_4bit`` (what users call), bnb's
4-bit kernel alone (absmax decoded beforehand) and a device-to-device copy of the output size
(the ceiling), on fresh random weights, with the L2 flushed before every repetition.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional, Sequence

from .gate import Problem, TORCH_DTYPE, check_config, mismatch_report, quantized_random
from .launch import load_kernel, problem_bytes
from .space import KernelConfig, preset
from .timing import gpu_state, l2_flush_buffer, measure_interleaved

__all__ = ["BenchResult", "ProblemReport", "bench_problem", "sweep_configs", "format_report"]

REF_BNB = "bnb dequantize_4bit"
REF_BNB_KERNEL = "bnb 4-bit kernel alone"
REF_COPY = "device copy (ceiling)"


@dataclass
class BenchResult:
    label: str
    config: Optional[dict]
    status: str                 # "ok", "invalid" or "reference"
    reason: str = ""
    median_us: Optional[float] = None
    iqr_us: Optional[float] = None
    samples_us: list = field(default_factory=list)
    gbps: Optional[float] = None
    pct_copy: Optional[float] = None
    speedup_vs_bnb: Optional[float] = None
    registers: Optional[int] = None
    spill_stores: Optional[int] = None


@dataclass
class ProblemReport:
    problem: dict
    bytes_moved: int
    copy_gbps: float
    results: list
    gpu_before: dict
    gpu_after: dict
    seed: int
    flush_mode: str = "read"

    def to_dict(self) -> dict:
        return asdict(self)

    def best(self) -> Optional[BenchResult]:
        ok = [r for r in self.results if r.status == "ok"]
        return min(ok, key=lambda r: r.median_us) if ok else None


def sweep_configs(base: KernelConfig, sweeps: Sequence[str]) -> list[KernelConfig]:
    """The valid configs of the cartesian product of ``KNOB=v1,v2`` sweeps around ``base``."""
    from .space import InvalidConfig, KNOBS

    axes = []
    for s in sweeps:
        if "=" not in s:
            raise ValueError(f"sweep {s!r} is not KNOB=v1,v2,...")
        knob, values = s.split("=", 1)
        if knob not in KNOBS:
            raise ValueError(f"unknown knob {knob!r}; known: {list(KNOBS)}")
        parsed = []
        for v in values.split(","):
            v = v.strip()
            parsed.append(None if v == "None" else int(v) if v.isdigit() else v)
        axes.append((knob, parsed))
    out = []
    for combo in itertools.product(*[vals for _, vals in axes]):
        changes = dict(zip([k for k, _ in axes], combo))
        if changes.get("grid") == "oneshot":
            changes["ctas_per_sm"] = None
        try:
            out.append(base.replace(**changes))
        except InvalidConfig:
            continue
    return list(dict.fromkeys(out))


def _gbps(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def bench_problem(problem: Problem, candidates: Sequence[tuple[str, KernelConfig]], seed: Optional[int] = None,
                  flush_mode: str = "read", **timing) -> ProblemReport:
    """Gate and time ``candidates`` (label, config) on ``problem`` against bnb and a copy."""
    import torch
    import bitsandbytes.functional as F

    seed = secrets.randbits(31) if seed is None else seed
    results: list[BenchResult] = []
    valid = []
    for i, (label, config) in enumerate(candidates):
        gate = check_config(config, problem, seed=seed + 10 * (i + 1))
        if not gate.ok:
            results.append(BenchResult(label, config.to_dict(), "invalid", gate.reason))
            continue
        valid.append((label, config, load_kernel(config)))

    A, qs = quantized_random(problem, problem.shape, seed)
    n = problem.numel
    want = F.dequantize_4bit(A, qs)
    offset = float(qs.offset)
    out = torch.empty_like(want)
    bound = {}
    for label, config, kernel in valid:
        launch = kernel.bind(A, qs, out, offset=offset)
        out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        bad = mismatch_report(out, want)
        if bad:  # the timed data itself must also match
            results.append(BenchResult(label, config.to_dict(), "invalid", f"timed data: {bad}"))
            continue
        bound[label] = (config, kernel, launch)

    out_bnb = torch.empty_like(want)
    absmax_f = F.dequantize_blockwise(qs.absmax, qs.state2)
    absmax_f += qs.offset
    dtype = getattr(torch, TORCH_DTYPE[problem.dtype])

    def bnb_full():
        F.dequantize_4bit(A, qs, out=out_bnb)

    def bnb_kernel():
        torch.ops.bitsandbytes.dequantize_4bit.out(A, absmax_f, problem.blocksize, problem.quant,
                                                    list(problem.shape), dtype, out=out_bnb)

    out_bytes = want.numel() * want.element_size()
    src = torch.randint(0, 255, (out_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    fns = {REF_BNB: bnb_full, REF_BNB_KERNEL: bnb_kernel, REF_COPY: lambda: dst.copy_(src)}
    for label, (_, _, launch) in bound.items():
        fns[label] = launch
    before = gpu_state()
    samples = measure_interleaved(fns, flush=l2_flush_buffer(mode=flush_mode), **timing)
    after = gpu_state()
    # bnb's output of the timed runs must still be the reference (nothing raced)
    bnb_full()
    torch.cuda.synchronize()
    if mismatch_report(out_bnb, want):
        raise RuntimeError("bnb's own output changed between runs: the measurement is not trustworthy")

    nbytes = problem_bytes(n, problem.blocksize, problem.dtype, nested=True, groupsize=int(qs.state2.blocksize))
    copy_gbps = _gbps(2 * out_bytes, samples[REF_COPY].median)
    bnb_median = samples[REF_BNB].median

    def row(label, status, config=None, kernel=None):
        s = samples[label]
        moved = 2 * out_bytes if label == REF_COPY else nbytes
        g = _gbps(moved, s.median)
        return BenchResult(label, config.to_dict() if config else None, status, "", s.median, s.iqr,
                           [round(x, 3) for x in s.us], g, 100.0 * g / copy_gbps, bnb_median / s.median,
                           kernel.compiled.registers if kernel else None,
                           kernel.compiled.spill_stores if kernel else None)

    timed = [row(label, "ok", cfg, k) for label, (cfg, k, _) in bound.items()]
    refs = [row(REF_BNB, "reference"), row(REF_BNB_KERNEL, "reference"), row(REF_COPY, "reference")]
    return ProblemReport(problem=asdict(problem), bytes_moved=nbytes, copy_gbps=copy_gbps,
                         results=refs + sorted(timed, key=lambda r: r.median_us) + results,
                         gpu_before=before, gpu_after=after, seed=seed, flush_mode=flush_mode)


def format_report(rep: ProblemReport, top: Optional[int] = None) -> str:
    p = rep.problem
    lines = [f"== {'x'.join(map(str, p['shape']))} {p['dtype']} {p['quant']} blocksize {p['blocksize']}: "
             f"{rep.bytes_moved / 1e6:.1f} MB moved, copy ceiling {rep.copy_gbps:.0f} GB/s "
             f"({rep.gpu_before.get('gpu_name', '?')}, SM {rep.gpu_before.get('sm_clock_mhz', '?')}->"
             f"{rep.gpu_after.get('sm_clock_mhz', '?')} MHz, {rep.gpu_after.get('temperature_c', '?')} C)"]
    lines.append(f"{'config':<58} {'us':>9} {'IQR':>7} {'GB/s':>7} {'%copy':>6} {'x bnb':>6} {'regs':>5}")
    shown = 0
    for r in rep.results:
        if r.status == "invalid":
            continue
        if r.status == "ok":
            shown += 1
            if top is not None and shown > top:
                continue
        label = r.label if len(r.label) <= 58 else r.label[:55] + "..."
        lines.append(f"{label:<58} {r.median_us:>9.2f} {r.iqr_us:>7.2f} {r.gbps:>7.0f} {r.pct_copy:>6.1f} "
                     f"{r.speedup_vs_bnb:>6.2f} {r.registers if r.registers is not None else '':>5}")
    for r in rep.results:
        if r.status == "invalid":
            lines.append(f"INVALID {r.label}: {r.reason}")
    return "\n".join(lines)
