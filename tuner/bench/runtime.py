"""Benchmarks of the serving path: the runtime against bnb on whole problems, its host time
per call, and a ``Linear4bit`` forward patched against unpatched (``nf4-tune bench --runtime``)."""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from ..families.dequant import DEQUANT, REF_BNB, mismatch_report
from ..measure.bench import peer_candidates
from ..measure.timing import Graphed, gpu_state, l2_flush_buffer, measure_interleaved
from ..vocabulary import REF_COPY, TORCH_DTYPE, Problem, speedup

__all__ = ["RUNTIME_SHAPES", "RuntimeReport", "bench_runtime_problem", "host_overhead", "linear4bit_forward",
           "format_runtime", "bench_matmul_runtime", "format_matmul_runtime"]


def _gbps(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


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
    """``nf4tune.serve.dequantize_4bit`` against bnb's on one problem: checked bit for bit on the
    timed data (NaN-poisoned ``out``), then timed interleaved with bnb and a copy, L2 flushed."""
    import torch
    import bitsandbytes.functional as F
    from ..serve import runtime

    seed = secrets.randbits(31) if seed is None else seed
    inputs = DEQUANT.make_inputs(problem, problem.shape, seed)
    A, qs = inputs.A, inputs.qs
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
    nbytes = DEQUANT.traffic(problem, nested=True, groupsize=int(qs.state2.blocksize))
    copy_gbps = _gbps(2 * out_bytes, samples[REF_COPY].median)
    r, b = samples[REF_RUNTIME], samples[REF_BNB]
    g = _gbps(nbytes, r.median)
    return RuntimeReport(problem.to_dict(), runtime.explain(A, qs).describe(), nbytes, copy_gbps, r.median, r.iqr,
                         b.median, b.iqr, g, 100.0 * g / copy_gbps, speedup(b.median, r.median), seed, after)


def _host_us(fn, calls: int, rounds: int, warmup: int = 20) -> tuple:
    """Host microseconds per call of ``fn``: (median, spread) over ``rounds`` of ``calls`` back to back, the GPU
    synchronised between rounds; and the GPU's own microseconds per call, from one more round queued behind a
    GPU spin longer than the host takes to issue it (so its kernels run back to back, no host gap between
    them). Where the GPU's time is near the host's, the launch queue may have filled and the host figure is the
    GPU's: :func:`format_host` marks it."""
    import statistics
    import time

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    host = statistics.median(per)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2 * host * calls * 1e-6 * 2.0e9))     # twice the issue time, in cycles at 2 GHz
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return host, max(per) - min(per), start.elapsed_time(end) * 1e3 / calls


def host_overhead(shape=(256, 256), dtype: str = "bf16", calls: int = 3000, rounds: int = 5) -> dict:
    """Host microseconds per call (median of ``rounds``), on a problem small enough that the GPU
    keeps up with the launches: a bare launch of the served variant (its packed cuLaunchKernel),
    the same variant through cuda.core's ``launch``, the runtime call with and without ``out``,
    and bnb's ``dequantize_4bit``."""
    import torch
    import bitsandbytes.functional as F
    from ..serve import runtime
    from ..kernel.launch import bind, load_kernel

    prob = Problem(tuple(shape), dtype, "nf4", 64)
    inputs = DEQUANT.make_inputs(prob, prob.shape, 1234)
    A, qs = inputs.A, inputs.qs
    out = torch.empty(qs.shape, dtype=qs.dtype, device="cuda")
    runtime.dequantize_4bit(A, qs, out=out)
    served = runtime.plan_for(A, qs)
    packed = served.launch
    stream = torch.cuda.current_stream().cuda_stream
    values = (A.data_ptr(), qs.absmax.data_ptr(), qs.state2.code.data_ptr(), qs.state2.absmax.data_ptr(), 0,
              float(qs.offset), out.data_ptr())
    core = bind(load_kernel(served.choice.config), inputs, out)
    from ..kernel.launch import PackedLaunch

    other = PackedLaunch(packed.kernel, packed.plan, via="ctypes" if packed.via == "cuda.bindings" else "bindings")
    cases = {
        f"bare launch (packed cuLaunchKernel through {packed.via})": lambda: packed(values, stream),
        f"bare launch (packed cuLaunchKernel through {other.via})": lambda: other(values, stream),
        "cuda.core launch of the same variant": core,
        "runtime dequantize_4bit(A, qs, out=out)": lambda: runtime.dequantize_4bit(A, qs, out=out),
        "runtime dequantize_4bit(A, qs)": lambda: runtime.dequantize_4bit(A, qs),
        "bnb dequantize_4bit(A, qs, out=out)": lambda: F.dequantize_4bit(A, qs, out=out),
        "torch.empty of the output alone (reference)": lambda: torch.empty(qs.shape, dtype=qs.dtype, device="cuda"),
        "out.new_empty of the output alone (reference)": lambda: out.new_empty(qs.shape),
    }
    return {name: _host_us(fn, calls, rounds, warmup=200)[0] for name, fn in cases.items()}


def linear4bit_forward(in_features: int = 4096, out_features: int = 14336, batch: int = 4096,
                       dtype: str = "bf16", **timing) -> dict:
    """A ``bnb.nn.Linear4bit`` forward (no grad), patched against unpatched, interleaved; the
    outputs must be identical. One patch is made and toggled around its candidate's call (``reapply`` /
    ``undo``), so that its setup is not timed."""
    import torch
    import bitsandbytes as bnb
    from ..serve.patch import patch_bitsandbytes

    t = getattr(torch, TORCH_DTYPE[dtype])
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=t, quant_type="nf4").cuda()
    x = torch.randn(batch, in_features, dtype=t, device="cuda")
    with torch.no_grad():
        want = layer(x)
        patch = patch_bitsandbytes()
        try:
            got = layer(x)
        finally:
            patch.undo()
        if not torch.equal(got, want):
            raise RuntimeError("patched Linear4bit output differs from bnb's")

        def patched():
            patch.reapply()
            try:
                layer(x)
            finally:
                patch.undo()

        samples = measure_interleaved({"bnb Linear4bit": lambda: layer(x), "patched Linear4bit": patched},
                                      flush=l2_flush_buffer(), **timing)
    u, p = samples["bnb Linear4bit"], samples["patched Linear4bit"]
    return dict(layer=f"Linear4bit({in_features}, {out_features}) {dtype} nf4, batch {batch}",
                unpatched_us=u.median, unpatched_iqr_us=u.iqr, patched_us=p.median, patched_iqr_us=p.iqr,
                speedup=speedup(u.median, p.median))


def format_runtime(reports: Sequence[RuntimeReport], overhead: Optional[dict] = None,
                   linear: Optional[dict] = None) -> str:
    lines = [f"{'problem':<26} {'runtime us':>10} {'IQR':>6} {'bnb us':>9} {'IQR':>6} {'GB/s':>6} {'%copy':>6} "
             f"{'x bnb':>6}  config served"]
    for r in reports:
        label = Problem.from_dict(r.problem).label()
        lines.append(f"{label:<26} {r.runtime_us:>10.2f} {r.runtime_iqr_us:>6.2f} {r.bnb_us:>9.2f} "
                     f"{r.bnb_iqr_us:>6.2f} {r.gbps:>6.0f} {r.pct_copy:>6.1f} {r.speedup_vs_bnb:>6.2f}  {r.choice}")
    if overhead:
        bare = next((us for name, us in overhead.items() if name.startswith("bare launch")), None)
        lines.append("host time per call (us):")
        for name, us in overhead.items():
            extra = f"  (+{us - bare:.2f} over the bare launch)" if bare is not None and name.startswith("runtime") else ""
            lines.append(f"  {name:<42} {us:>7.2f}{extra}")
    if linear:
        lines.append(f"{linear['layer']}: unpatched {linear['unpatched_us']:.1f} us (IQR {linear['unpatched_iqr_us']:.1f}), "
                     f"patched {linear['patched_us']:.1f} us (IQR {linear['patched_iqr_us']:.1f}), "
                     f"{linear['speedup']:.3f}x")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the matmul runtime
REF_MATMUL_RUNTIME = "nf4-tune matmul_4bit (as served)"


def bench_matmul_runtime(problem: Problem, seed: Optional[int] = None, **timing) -> dict:
    """``nf4tune.serve.matmul_4bit`` as served (the tuned kernel where it beat bnb, bnb elsewhere)
    against bnb's ``matmul_4bit``, a dense F.linear and the read-only ceiling, on M = the
    bucket's rows: checked against the fp64 reference first, then timed interleaved, L2 flushed."""
    import torch

    from ..families.matmul import MATMUL, REF_BNB_MATMUL
    from ..serve.matmul import explain_matmul, matmul_4bit

    seed = secrets.randbits(31) if seed is None else seed
    N, K = problem.shape
    inputs = MATMUL.make_inputs(problem, (N, K, problem.m, False), seed)
    A, Bt, qs = inputs.A, inputs.B.t(), inputs.qs
    decision = explain_matmul(A, qs)
    got = matmul_4bit(A, Bt, qs)
    torch.cuda.synchronize()
    ref = MATMUL.expected(inputs)
    if decision.served:
        bad = MATMUL.compare(got, ref, inputs, decision.choice.config)
        if bad:
            raise RuntimeError(f"{problem.label()}: the served kernel fails the gate: {bad}")
    peers = peer_candidates(MATMUL, MATMUL.peers(inputs, problem))
    label, ceiling, ceiling_bytes = MATMUL.ceiling(inputs, problem)
    nbytes = MATMUL.traffic(problem)
    floors = same_bytes_floors(nbytes, K, problem.m, A.dtype, A.device)
    # the runtime is timed as bnb is, from CUDA-graph replays (how decode runs it): host time
    # enters neither side
    fns = {REF_MATMUL_RUNTIME: Graphed(lambda: matmul_4bit(A, Bt, qs)), **peers, label: ceiling, **floors}
    samples = measure_interleaved(fns, flush=l2_flush_buffer(), **timing)
    read_gbps = _gbps(ceiling_bytes, samples[label].median)
    floor_label = min(floors, key=lambda f: samples[f].median)
    floor_us = samples[floor_label].median
    rows = {}
    for name, s in samples.items():
        g = _gbps(ceiling_bytes if name == label else nbytes, s.median)
        rows[name] = dict(us=s.median, iqr_us=s.iqr, gbps=g, pct_read=100.0 * g / read_gbps,
                          pct_floor=100.0 * floor_us / s.median, x_bnb=speedup(samples[REF_BNB_MATMUL].median, s.median))
    return dict(problem=problem.to_dict(), label=problem.label(), served=decision.served, reason=decision.reason,
                rule=decision.rule, config=decision.choice.config.short() if decision.choice else None, bytes=nbytes,
                read_gbps=read_gbps, floor=floor_label, floor_us=floor_us, rows=rows, seed=seed, gpu=gpu_state())


REF_SAME_READ = "read of the same bytes"
REF_SAME_GEMV = "dense bf16 GEMV of the same bytes"


def same_bytes_floors(nbytes: int, K: int, M: int, dtype, device) -> dict:
    """The two reads of a matmul's ``nbytes`` that its time is judged against (the faster is the floor): a
    plain read of exactly those bytes (``torch.sum``), and a dense GEMV whose 16-bit weight is that many bytes
    (K columns, as many rows as the bytes make, ``M`` rows of activations), on random data."""
    import torch

    from ..families.matmul import read_reduction

    read = read_reduction(device, max(4, nbytes // 4 * 4))
    rows = max(1, nbytes // (2 * K))
    w = torch.randn(rows, K, dtype=torch.bfloat16 if dtype == torch.float32 else dtype, device=device)
    a = torch.randn(M, K, dtype=w.dtype, device=device)
    return {REF_SAME_READ: read, REF_SAME_GEMV: lambda: torch.nn.functional.linear(a, w)}


def format_matmul_runtime(reports: Sequence[dict]) -> str:
    from ..families.matmul import REF_BNB_MATMUL, REF_DENSE

    lines = [f"{'problem':<34} {'served':<8} {'us':>8} {'GB/s':>6} {'floor us':>8} {'%floor':>6} {'x bnb':>6} "
             f"{'bnb us':>8} {'%floor':>6} {'dense us':>9}  config / why bnb"]
    for r in reports:
        o, b, d = r["rows"][REF_MATMUL_RUNTIME], r["rows"][REF_BNB_MATMUL], r["rows"][REF_DENSE]
        lines.append(f"{r['label']:<34} {r.get('rule', 'tuned' if r['served'] else 'bnb'):<8} {o['us']:>8.2f} "
                     f"{o['gbps']:>6.0f} {r['floor_us']:>8.2f} {o['pct_floor']:>6.1f} {o['x_bnb']:>6.2f} {b['us']:>8.2f} "
                     f"{b['pct_floor']:>6.1f} {d['us']:>9.2f}  {r['config'] if r['served'] else r['reason']}")
    if reports:
        lines.append(f"floor: the faster of a {REF_SAME_READ} and a {REF_SAME_GEMV}, timed in the same runs; read-only "
                     f"ceiling: {reports[0]['read_gbps']:.0f} GB/s (a 512 MiB reduction)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- host time per call
#: the matmul shapes of `bench --host`: three that the H100 and H200 tables hold, one that neither does
HOST_SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (18944, 3584))


def host_matmul(shapes=HOST_SHAPES, batches=(1, 8), dtype: str = "bf16", calls: int = 200, rounds: int = 15) -> list:
    """Host us per call at each shape and batch: bnb's ``matmul_4bit``, nf4-tune's ``matmul_4bit`` (the direct
    API), bnb's ``matmul_4bit`` and a ``Linear4bit`` forward under ``patch_bitsandbytes()``, and the unpatched
    ``Linear4bit`` forward; what serves each (the rule: exact, transfer or bnb)."""
    import torch
    import bitsandbytes as bnb

    from ..serve import matmul as served
    from ..serve.patch import patch_bitsandbytes

    rows = []
    # the last rows: calls the fused kernel declines (fp32 activations: no table holds them), so that the
    # patched columns against bnb's are the cost of the hand-off; 1024x4096 keeps bnb's GPU time short of its host's
    for (N, K), t, ms in [(shape, getattr(torch, TORCH_DTYPE[dtype]), batches) for shape in shapes] + \
            [((4096, 4096), torch.float32, (1,)), ((1024, 4096), torch.float32, batches)]:
        layer = bnb.nn.Linear4bit(K, N, bias=False, compute_dtype=t, quant_type="nf4").cuda()
        qs = layer.weight.quant_state
        for M in ms:
            x = torch.randn(M, K, dtype=t, device="cuda")
            W = layer.weight.t()
            with torch.no_grad():
                d = served.explain_matmul(x, qs)
                cases = {"bnb matmul_4bit": lambda: bnb.matmul_4bit(x, W, qs),
                         "bnb Linear4bit": lambda: layer(x),
                         "nf4tune.matmul_4bit": lambda: served.matmul_4bit(x, W, qs)}
                row = dict(shape=f"{N}x{K}", M=M, dtype=str(t).replace("torch.", ""), rule=d.rule, why=d.reason)
                for name, fn in cases.items():
                    row[name] = _host_us(fn, calls, rounds)
                with patch_bitsandbytes():
                    row["patched bnb matmul_4bit"] = _host_us(lambda: bnb.matmul_4bit(x, W, qs), calls, rounds)
                    row["patched Linear4bit"] = _host_us(lambda: layer(x), calls, rounds)
            rows.append(row)
    return rows


def format_host(rows: Sequence[dict], dequant: Optional[dict] = None) -> str:
    names = ("bnb matmul_4bit", "nf4tune.matmul_4bit", "patched bnb matmul_4bit", "bnb Linear4bit",
             "patched Linear4bit")
    lines = ["host us per call (median over rounds of back-to-back calls), matmul, nf4 nested bs64; * the GPU took "
             "at least 80% of that time per call (the host figure may be the GPU's)",
             f"{'shape':<11} {'dtype':<8} {'M':>2} {'served':<8} " + " ".join(f"{n:>25}" for n in names)]
    for r in rows:
        lines.append(f"{r['shape']:<11} {r.get('dtype', ''):<8} {r['M']:>2} {r['rule']:<8} "
                     + " ".join(f"{r[n][0]:>17.2f}{'*' if r[n][2] >= 0.8 * r[n][0] else ' '}"
                                f"±{r[n][1]:>5.2f}" for n in names))
    off = [r for r in rows if r["rule"] == "bnb"]
    for r in off:
        lines.append(f"hand-off ({r['shape']} {r.get('dtype', '')} M={r['M']}, bnb serves: {r['why']}): patched "
                     f"matmul_4bit +{r['patched bnb matmul_4bit'][0] - r['bnb matmul_4bit'][0]:.2f} us, patched "
                     f"Linear4bit +{r['patched Linear4bit'][0] - r['bnb Linear4bit'][0]:.2f} us over bnb")
    if dequant:
        lines.append("dequantize_4bit host us per call (256x256 bf16 nf4):")
        lines += [f"  {name:<42} {us:>7.2f}" for name, us in dequant.items()]
    return "\n".join(lines)
