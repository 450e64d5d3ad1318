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


# ----------------------------------------------------------------------------- the runtime
#: the six shapes of the speed targets, plus two the searches never saw (served by the nearest tuned problem)
RUNTIME_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192), (8192, 28672), (16384, 16384),
                  (5120, 13824), (11008, 4096))
REF_RUNTIME = "nf4-tune runtime dequantize_4bit"


@dataclass
class RuntimeReport:
    problem: dict
    choice: str
    bytes_moved: int
    copy_gbps: float
    runtime_us: float
    runtime_iqr_us: float
    bnb_us: float
    bnb_iqr_us: float
    gbps: float
    pct_copy: float
    speedup_vs_bnb: float
    seed: int
    gpu_after: dict

    def to_dict(self) -> dict:
        return asdict(self)


def bench_runtime_problem(problem: Problem, seed: Optional[int] = None, **timing) -> RuntimeReport:
    """``tuner.runtime.dequantize_4bit`` against bnb's on one problem: checked bit for bit on the
    timed data (NaN-poisoned ``out``), then timed interleaved with bnb and a copy, L2 flushed."""
    import torch
    import bitsandbytes.functional as F
    from . import runtime

    seed = secrets.randbits(31) if seed is None else seed
    A, qs = quantized_random(problem, problem.shape, seed)
    want = F.dequantize_4bit(A, qs)
    out = torch.full_like(want, float("nan"))
    runtime.dequantize_4bit(A, qs, out=out)
    torch.cuda.synchronize()
    bad = mismatch_report(out, want)
    if bad:
        raise RuntimeError(f"{problem.label()}: the runtime differs from bnb: {bad}")
    out_bnb = torch.empty_like(want)
    out_bytes = want.numel() * want.element_size()
    src = torch.randint(0, 255, (out_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    fns = {REF_BNB: lambda: F.dequantize_4bit(A, qs, out=out_bnb),
           REF_RUNTIME: lambda: runtime.dequantize_4bit(A, qs, out=out),
           REF_COPY: lambda: dst.copy_(src)}
    samples = measure_interleaved(fns, flush=l2_flush_buffer(), **timing)
    after = gpu_state()
    torch.cuda.synchronize()
    if mismatch_report(out, want) or mismatch_report(out_bnb, want):
        raise RuntimeError(f"{problem.label()}: outputs changed during timing: the measurement is not trustworthy")
    nbytes = problem_bytes(problem.numel, problem.blocksize, problem.dtype, nested=True,
                           groupsize=int(qs.state2.blocksize))
    copy_gbps = _gbps(2 * out_bytes, samples[REF_COPY].median)
    r, b = samples[REF_RUNTIME], samples[REF_BNB]
    g = _gbps(nbytes, r.median)
    return RuntimeReport(asdict(problem), runtime.explain(A, qs).describe(), nbytes, copy_gbps, r.median, r.iqr,
                         b.median, b.iqr, g, 100.0 * g / copy_gbps, b.median / r.median, seed, after)


def host_overhead(shape=(256, 256), dtype: str = "bf16", calls: int = 3000, rounds: int = 5) -> dict:
    """Host microseconds per call (median of ``rounds``), on a problem small enough that the GPU
    keeps up with the launches: a bare launch of the served variant (its packed cuLaunchKernel),
    the same variant through cuda.core's ``launch``, the runtime call with and without ``out``,
    and bnb's ``dequantize_4bit``."""
    import statistics
    import time

    import torch
    import bitsandbytes.functional as F
    from . import runtime
    from .launch import load_kernel

    prob = Problem(tuple(shape), dtype, "nf4", 64)
    A, qs = quantized_random(prob, prob.shape, 1234)
    out = torch.empty(qs.shape, dtype=qs.dtype, device="cuda")
    runtime.dequantize_4bit(A, qs, out=out)
    plan = next(p for k, p in runtime._plans.items() if k[1] == qs.shape and k[2] == dtype)
    packed = plan.launch
    stream = torch.cuda.current_stream().cuda_stream
    offset = float(qs.offset)
    a, am, code, am2, o = A.data_ptr(), qs.absmax.data_ptr(), qs.state2.code.data_ptr(), qs.state2.absmax.data_ptr(), out.data_ptr()
    core = load_kernel(plan.choice.config).bind(A, qs, out, offset=offset)
    cases = {
        "bare launch (packed cuLaunchKernel)": lambda: packed(a, am, code, am2, 0, offset, o, stream),
        "cuda.core launch of the same variant": core,
        "runtime dequantize_4bit(A, qs, out=out)": lambda: runtime.dequantize_4bit(A, qs, out=out),
        "runtime dequantize_4bit(A, qs)": lambda: runtime.dequantize_4bit(A, qs),
        "bnb dequantize_4bit(A, qs, out=out)": lambda: F.dequantize_4bit(A, qs, out=out),
        "torch.empty of the output alone (reference)": lambda: torch.empty(qs.shape, dtype=qs.dtype, device="cuda"),
    }
    result = {}
    for name, fn in cases.items():
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        per_round = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_round.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
        result[name] = statistics.median(per_round)
    return result


def linear4bit_forward(in_features: int = 4096, out_features: int = 14336, batch: int = 4096,
                       dtype: str = "bf16", **timing) -> dict:
    """A ``bnb.nn.Linear4bit`` forward (no grad), patched against unpatched, interleaved; the
    outputs must be identical."""
    import torch
    import bitsandbytes as bnb
    from . import runtime

    t = getattr(torch, TORCH_DTYPE[dtype])
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=t, quant_type="nf4").cuda()
    x = torch.randn(batch, in_features, dtype=t, device="cuda")
    with torch.no_grad():
        want = layer(x)
        with runtime.patch_bitsandbytes():
            got = layer(x)
        if not torch.equal(got, want):
            raise RuntimeError("patched Linear4bit output differs from bnb's")

        def patched():
            with runtime.patch_bitsandbytes():
                layer(x)

        samples = measure_interleaved({"bnb Linear4bit": lambda: layer(x), "patched Linear4bit": patched},
                                      flush=l2_flush_buffer(), **timing)
    u, p = samples["bnb Linear4bit"], samples["patched Linear4bit"]
    return dict(layer=f"Linear4bit({in_features}, {out_features}) {dtype} nf4, batch {batch}",
                unpatched_us=u.median, unpatched_iqr_us=u.iqr, patched_us=p.median, patched_iqr_us=p.iqr,
                speedup=u.median / p.median)


def format_runtime(reports: Sequence[RuntimeReport], overhead: Optional[dict] = None,
                   linear: Optional[dict] = None) -> str:
    lines = [f"{'problem':<26} {'runtime us':>10} {'IQR':>6} {'bnb us':>9} {'IQR':>6} {'GB/s':>6} {'%copy':>6} "
             f"{'x bnb':>6}  config served"]
    for r in reports:
        p = r.problem
        label = f"{'x'.join(map(str, p['shape']))} {p['dtype']} {p['quant']} bs{p['blocksize']}"
        lines.append(f"{label:<26} {r.runtime_us:>10.2f} {r.runtime_iqr_us:>6.2f} {r.bnb_us:>9.2f} "
                     f"{r.bnb_iqr_us:>6.2f} {r.gbps:>6.0f} {r.pct_copy:>6.1f} {r.speedup_vs_bnb:>6.2f}  {r.choice}")
    if overhead:
        bare = overhead.get("bare launch (packed cuLaunchKernel)")
        lines.append("host time per call (us):")
        for name, us in overhead.items():
            extra = f"  (+{us - bare:.2f} over the bare launch)" if bare is not None and name.startswith("runtime") else ""
            lines.append(f"  {name:<42} {us:>7.2f}{extra}")
    if linear:
        lines.append(f"{linear['layer']}: unpatched {linear['unpatched_us']:.1f} us (IQR {linear['unpatched_iqr_us']:.1f}), "
                     f"patched {linear['patched_us']:.1f} us (IQR {linear['patched_iqr_us']:.1f}), "
                     f"{linear['speedup']:.3f}x")
    return "\n".join(lines)
