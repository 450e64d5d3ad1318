"""The one timing harness: CUDA events, warm-up, L2 flushed before every repetition, candidates
interleaved in rotating order, repetitions until the relative IQR is under a target or a time
cap, medians with spread, raw samples kept.

Host time must not enter a measurement. Each repetition queues the L2 flush, the start event,
the candidate and the end event back to back (the events are made before the round), so the
flush's GPU time covers the host's work of queueing the candidate. A candidate wrapped in
:class:`Graphed` (bnb's calls: several launches with Python between them) is captured once
in a CUDA graph after the warm-up and every repetition replays the graph between the events:
its launches are queued at once and a host stall cannot stretch the gaps between them. If the
capture fails (or the replay's output differs from a direct call's), the candidate is timed by
direct calls and its :class:`Samples` say so (``mode`` and ``note``): never silently.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

__all__ = ["Samples", "L2Flush", "Graphed", "CudaTiming", "measure_interleaved", "l2_flush_buffer", "gpu_state",
           "GRAPH", "DIRECT"]

#: how a candidate was timed
GRAPH = "graph"
DIRECT = "direct"


@dataclass
class Samples:
    """Times of one candidate, in microseconds, and how they were taken: ``mode`` is
    :data:`GRAPH` (replays of a captured CUDA graph) or :data:`DIRECT` (calls of the callable);
    ``note`` says why a candidate marked for a graph was timed directly."""

    us: list = field(default_factory=list)
    mode: str = DIRECT
    note: str = ""

    @property
    def timing(self) -> str:
        """``graph``, ``direct``, or ``direct (why not graph)``."""
        return f"{self.mode} ({self.note})" if self.note else self.mode

    @property
    def median(self) -> float:
        return statistics.median(self.us)

    @property
    def iqr(self) -> float:
        if len(self.us) < 4:
            return 0.0
        q = statistics.quantiles(self.us, n=4, method="inclusive")
        return q[2] - q[0]

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.us and self.median > 0 else float("inf")


class L2Flush:
    """Evicts the L2 before a repetition by streaming through a buffer of ``factor`` times its size.

    ``mode="read"`` (default) reads the buffer: it leaves the L2 cold *and clean*, and the dirty
    lines of the previous repetition are written back during the flush, not during the next
    timed kernel. ``mode="write"`` zero-fills it (triton's do_bench does this), which leaves the
    whole L2 dirty: the next timed kernel then pays for writing back up to an L2 of someone
    else's data, which penalises small problems.
    """

    def __init__(self, factor: int = 4, mode: str = "read"):
        import torch

        if mode not in ("read", "write"):
            raise ValueError(f"flush mode {mode!r} is not 'read' or 'write'")
        self.l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        nbytes = max(factor * self.l2_bytes, 32 << 20)
        self.mode = mode
        self.buffer = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        self.sink = torch.empty((), dtype=torch.float32, device="cuda")

    def __call__(self):
        import torch

        if self.mode == "read":
            torch.sum(self.buffer, dim=0, out=self.sink)
        else:
            self.buffer.zero_()


def l2_flush_buffer(factor: int = 4, mode: str = "read") -> L2Flush:
    """The L2 flush used between repetitions (see :class:`L2Flush`)."""
    return L2Flush(factor, mode)


class Graphed:
    """A candidate to time from a CUDA-graph replay (see the module's docstring). ``output``,
    where given, is the tensor the callable writes: the replay must write it exactly as a direct
    call does before the graph is trusted."""

    def __init__(self, fn: Callable[[], object], output=None):
        self.fn = fn
        self.output = output

    def __call__(self):
        return self.fn()


class CudaTiming:
    """The device side of the harness: CUDA events on the current stream, synchronisation and
    graph capture (nf4tune.kernel.graphs). A test double with the same methods drives the
    harness's scheduling on the CPU."""

    def event(self):
        import torch

        return torch.cuda.Event(enable_timing=True)

    @staticmethod
    def record(event) -> None:
        event.record()

    @staticmethod
    def elapsed_us(start, end) -> float:
        return start.elapsed_time(end) * 1000.0

    @staticmethod
    def synchronize() -> None:
        import torch

        torch.cuda.synchronize()

    @staticmethod
    def capture(fn: Callable) -> Callable:
        from ..kernel.graphs import capture_graph

        return capture_graph(fn)

    @staticmethod
    def replay_mismatch(fn: Callable, replay: Callable, output) -> Optional[str]:
        from ..kernel.graphs import replay_mismatch

        return replay_mismatch(fn, replay, output)


def _graph_runner(candidate: Graphed, device) -> tuple:
    """(the callable to time, mode, note) for a candidate marked for a graph."""
    try:
        replay = device.capture(candidate.fn)
    except Exception as e:   # anything the capture raises: time directly, and say why
        try:
            device.synchronize()
        except Exception:
            pass
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return candidate.fn, DIRECT, f"graph capture failed: {type(e).__name__}: {first}"[:300]
    if candidate.output is not None:
        try:
            bad = device.replay_mismatch(candidate.fn, replay, candidate.output)
        except Exception as e:
            bad = f"{type(e).__name__}: {e}"
        if bad:
            return candidate.fn, DIRECT, f"graph not used: {bad}"[:300]
    return replay, GRAPH, ""


def measure_interleaved(fns: Dict[str, Callable[[], object]], *, warmup: int = 3, min_reps: int = 15,
                        max_reps: int = 400, target_rel_iqr: float = 0.03, time_cap_s: float = 3.0,
                        flush=None, device=None) -> Dict[str, Samples]:
    """Time every callable in ``fns``: each round flushes L2 before each candidate and times it
    with a pair of CUDA events; the order rotates between rounds so that no candidate always
    follows another. Candidates wrapped in :class:`Graphed` are captured in a CUDA graph after
    the warm-up and timed as replays (or, if that fails, directly, with the reason in their
    samples' ``note``). Stops once every candidate's relative IQR is under ``target_rel_iqr``
    (after ``min_reps``), at ``max_reps``, or after ``time_cap_s`` seconds. ``device`` is the
    device side (default :class:`CudaTiming`)."""
    device = CudaTiming() if device is None else device
    flush = l2_flush_buffer() if flush is None else flush
    names = list(fns)
    # warm up by count and by time: first calls pay for lazy initialisation (bnb, torch.compile)
    t_warm = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - t_warm < 0.2:
        for name in names:
            flush()
            fns[name]()
        device.synchronize()
        done += 1
    samples = {name: Samples() for name in names}
    runners = {}
    for name in names:
        fn = fns[name]
        if isinstance(fn, Graphed):
            runners[name], samples[name].mode, samples[name].note = _graph_runner(fn, device)
        else:
            runners[name] = fn
    if any(s.mode == GRAPH for s in samples.values()):
        for name in names:      # a graph's first replay uploads it: not a sample
            flush()
            runners[name]()
        device.synchronize()
    start = time.perf_counter()
    rep = 0
    while rep < max_reps:
        order = names[rep % len(names):] + names[:rep % len(names)]
        events = [(name, device.event(), device.event()) for name in order]   # made before the round
        for name, e0, e1 in events:
            # queued back to back: the flush's GPU time covers the host queueing the candidate
            flush()
            device.record(e0)
            runners[name]()
            device.record(e1)
        device.synchronize()
        for name, e0, e1 in events:
            samples[name].us.append(device.elapsed_us(e0, e1))
        rep += 1
        if rep >= min_reps:
            if all(s.rel_iqr <= target_rel_iqr for s in samples.values()):
                break
            if time.perf_counter() - start > time_cap_s:
                break
    return samples


def gpu_state() -> dict:
    """GPU name, SM and memory clocks (MHz) and temperature (C) from NVML, where it answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        state = dict(
            gpu_name=name.decode() if isinstance(name, bytes) else name,
            sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            mem_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            temperature_c=pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        )
        try:
            state["max_sm_clock_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
        except Exception:
            pass
        return state
    except Exception as e:
        return dict(nvml_error=f"{type(e).__name__}: {e}")
