"""Benchmarking variants against their peer on one problem: gate first, then the shared harness.

For each problem: every candidate passes its family's gate (fresh random data at the problem's
shape and an odd shape) or is reported invalid with the reason, never timed. The valid ones
are checked again on the timed data, then timed interleaved with the family's peers (bnb's
calls) and its ceiling (a copy for dequant, a read-only reduction for matmul), on fresh random
data, with the L2 flushed before every repetition.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

from ..families import get as get_family
from ..kernel.launch import bind, load_kernel
from ..vocabulary import InvalidConfig, Problem, speedup
from .gate import check_config
from .timing import Graphed, gpu_state, l2_flush_buffer, measure_interleaved

__all__ = ["BenchResult", "ProblemReport", "bench_problem", "sweep_configs", "format_report", "parse_knob_value",
           "peer_candidates"]


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
    pct_copy: Optional[float] = None     # % of the family's ceiling (a copy for dequant)
    speedup_vs_bnb: Optional[float] = None
    registers: Optional[int] = None
    spill_stores: Optional[int] = None
    timing: str = "direct"              # "graph" (CUDA-graph replays), "direct", or "direct (why not graph)"


@dataclass
class ProblemReport:
    problem: dict
    bytes_moved: int
    copy_gbps: float                      # the ceiling's rate measured in this run
    results: list
    gpu_before: dict
    gpu_after: dict
    seed: int
    flush_mode: str = "read"
    peer_label: str = ""
    ceiling_label: str = ""
    bnb_timing: str = ""                  # how the peer was timed: graph, direct, or direct (why not graph)

    def to_dict(self) -> dict:
        return asdict(self)

    def best(self) -> Optional[BenchResult]:
        ok = [r for r in self.results if r.status == "ok"]
        return min(ok, key=lambda r: r.median_us) if ok else None

    def result(self, label: str) -> Optional[BenchResult]:
        return next((r for r in self.results if r.label == label), None)


def parse_knob_value(family, knob: str, text: str):
    """A knob value from its text (``None``, an integer, or a name), checked against the knob."""
    if knob not in family.knob_names:
        raise InvalidConfig(f"unknown knob {knob!r}; known: {list(family.knob_names)}")
    text = text.strip()
    value = None if text == "None" else int(text) if text.lstrip("-").isdigit() else text
    allowed = family.knob(knob).values
    if value not in allowed:
        raise InvalidConfig(f"{knob}={text} is not one of {[('None' if v is None else v) for v in allowed]}")
    return value


def sweep_configs(base, sweeps: Sequence[str]) -> list:
    """The valid configs of the cartesian product of ``KNOB=v1,v2`` sweeps around ``base``
    (values checked against the knob; combinations a constraint rules out are skipped)."""
    family = base.family
    axes = []
    for s in sweeps:
        if "=" not in s:
            raise InvalidConfig(f"--sweep {s!r} is not KNOB=V1,V2,...")
        knob, values = s.split("=", 1)
        knob = knob.strip()
        axes.append((knob, [parse_knob_value(family, knob, v) for v in values.split(",")]))
    out = []
    for combo in itertools.product(*[vals for _, vals in axes]):
        changes = dict(zip([k for k, _ in axes], combo))
        if changes.get("grid") == "oneshot" and "ctas_per_sm" in family.knob_names:
            changes["ctas_per_sm"] = None
        try:
            out.append(base.replace(**changes))
        except InvalidConfig:
            continue
    return list(dict.fromkeys(out))


def _gbps(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def peer_candidates(family, peers: dict) -> dict:
    """The family's peers as :func:`measure_interleaved` takes them: each wrapped in
    :class:`Graphed` (timed from a CUDA-graph replay, its ``output`` checked) where the family
    times its peers so (:attr:`nf4tune.family.Family.time_peers_in_graph`) and the peer does not
    opt out (``graph = False``)."""
    return {label: Graphed(fn, getattr(fn, "output", None))
            if family.time_peers_in_graph and getattr(fn, "graph", True) else fn for label, fn in peers.items()}


def bench_problem(problem: Problem, candidates: Sequence[tuple], seed: Optional[int] = None,
                  flush_mode: str = "read", **timing) -> ProblemReport:
    """Gate and time ``candidates`` (label, config) on ``problem`` against the family's peers and
    ceiling."""
    import torch

    family = get_family(problem.family)
    seed = secrets.randbits(31) if seed is None else seed
    results: list[BenchResult] = []
    valid = []
    for i, (label, config) in enumerate(candidates):
        gate = check_config(config, problem, seed=seed + 10 * (i + 1))
        if not gate.ok:
            results.append(BenchResult(label, config.to_dict(), "invalid", gate.reason))
            continue
        valid.append((label, config, load_kernel(config)))

    inputs = family.make_inputs(problem, problem.shape, seed)
    want = family.expected(inputs)
    out = family.new_output(inputs, poison=False)
    bound = {}
    for label, config, kernel in valid:
        launch = bind(kernel, inputs, out)
        out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        bad = family.compare(out, want, inputs, config)
        if bad:  # the timed data itself must also pass
            results.append(BenchResult(label, config.to_dict(), "invalid", f"timed data: {bad}"))
            continue
        bound[label] = (config, kernel, launch)

    peers = family.peers(inputs, problem)
    ceiling_label, ceiling_fn, ceiling_bytes = family.ceiling(inputs, problem)
    fns = peer_candidates(family, peers)
    fns[ceiling_label] = ceiling_fn
    for label, (_, _, launch) in bound.items():
        fns[label] = launch
    before = gpu_state()
    samples = measure_interleaved(fns, flush=l2_flush_buffer(mode=flush_mode), **timing)
    after = gpu_state()
    # the peer's output of the timed runs must still be what it was (nothing raced)
    bad = family.verify_peers(peers, inputs, want)
    if bad:
        raise RuntimeError(f"{problem.label()}: {bad}: the measurement is not trustworthy")

    nbytes = family.traffic(problem)
    ceiling_gbps = _gbps(ceiling_bytes, samples[ceiling_label].median)
    peer_median = samples[family.peer_label].median

    def row(label, status, config=None, kernel=None):
        s = samples[label]
        moved = ceiling_bytes if label == ceiling_label else nbytes
        g = _gbps(moved, s.median)
        # a reference's reason says how it was timed (stored with it)
        reason = f"timing: {s.timing}" if status == "reference" else ""
        return BenchResult(label, config.to_dict() if config else None, status, reason, s.median, s.iqr,
                           [round(x, 3) for x in s.us], g, 100.0 * g / ceiling_gbps, speedup(peer_median, s.median),
                           kernel.compiled.registers if kernel else None,
                           kernel.compiled.spill_stores if kernel else None, s.timing)

    timed = [row(label, "ok", cfg, k) for label, (cfg, k, _) in bound.items()]
    refs = [row(label, "reference") for label in list(peers) + [ceiling_label]]
    return ProblemReport(problem=problem.to_dict(), bytes_moved=nbytes, copy_gbps=ceiling_gbps,
                         results=refs + sorted(timed, key=lambda r: r.median_us) + results,
                         gpu_before=before, gpu_after=after, seed=seed, flush_mode=flush_mode,
                         peer_label=family.peer_label, ceiling_label=ceiling_label,
                         bnb_timing=samples[family.peer_label].timing)


def format_report(rep: ProblemReport, top: Optional[int] = None) -> str:
    p = Problem.from_dict(rep.problem)
    lines = [f"== {p.label()}: {rep.bytes_moved / 1e6:.1f} MB moved, {rep.ceiling_label or 'ceiling'} "
             f"{rep.copy_gbps:.0f} GB/s ({rep.gpu_before.get('gpu_name', '?')}, SM "
             f"{rep.gpu_before.get('sm_clock_mhz', '?')}->{rep.gpu_after.get('sm_clock_mhz', '?')} MHz, "
             f"{rep.gpu_after.get('temperature_c', '?')} C)"]
    if rep.bnb_timing:
        lines.append(f"{rep.peer_label or 'peer'} timed: " + ("from CUDA-graph replays" if rep.bnb_timing == "graph"
                                                              else rep.bnb_timing))
    lines.append(f"{'config':<58} {'us':>9} {'IQR':>7} {'GB/s':>7} {'%ceil':>6} {'x bnb':>6} {'regs':>5}")
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


def run_bench(problems: Sequence[Problem], candidates, *, recorded=None, seed: Optional[int] = None,
              time_cap_s: float = 3.0, flush_mode: str = "read", progress=None) -> list[ProblemReport]:
    """Bench the candidates ((label, config) pairs, or a mapping problem -> pairs) on every problem
    (storing each report in ``recorded``, a :class:`nf4tune.measure.record.RecordedRun`, when
    given): the library call of ``nf4-tune bench``."""
    reports = []
    for i, prob in enumerate(problems):
        if progress:
            progress(i, len(problems), prob)
        cands = candidates[prob] if isinstance(candidates, dict) else candidates
        rep = bench_problem(prob, cands, seed=None if seed is None else seed + 1000 * i, time_cap_s=time_cap_s,
                            flush_mode=flush_mode)
        if recorded is not None:
            recorded.store(rep)
        reports.append(rep)
    return reports
