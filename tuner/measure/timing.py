"""The one timing harness: CUDA events, warm-up, L2 flushed before every repetition, candidates
interleaved in rotating order, repetitions until the relative IQR is under a target or a time
cap, medians with spread, raw samples kept.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict

__all__ = ["Samples", "L2Flush", "measure_interleaved", "l2_flush_buffer", "gpu_state"]


@dataclass
class Samples:
    """Times of one candidate, in microseconds."""

    us: list = field(default_factory=list)

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


def measure_interleaved(fns: Dict[str, Callable[[], object]], *, warmup: int = 3, min_reps: int = 15,
                        max_reps: int = 400, target_rel_iqr: float = 0.03, time_cap_s: float = 3.0,
                        flush=None) -> Dict[str, Samples]:
    """Time every callable in ``fns``: each round flushes L2 before each candidate and times it
    with a pair of CUDA events; the order rotates between rounds so that no candidate always
    follows another. Stops once every candidate's relative IQR is under ``target_rel_iqr``
    (after ``min_reps``), at ``max_reps``, or after ``time_cap_s`` seconds."""
    import torch

    flush = l2_flush_buffer() if flush is None else flush
    names = list(fns)
    # warm up by count and by time: first calls pay for lazy initialisation (bnb, torch.compile)
    t_warm = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - t_warm < 0.2:
        for name in names:
            flush()
            fns[name]()
        torch.cuda.synchronize()
        done += 1
    samples = {name: Samples() for name in names}
    start = time.perf_counter()
    rep = 0
    while rep < max_reps:
        order = names[rep % len(names):] + names[:rep % len(names)]
        events = []
        for name in order:
            flush()
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            fns[name]()
            e1.record()
            events.append((name, e0, e1))
        torch.cuda.synchronize()
        for name, e0, e1 in events:
            samples[name].us.append(e0.elapsed_time(e1) * 1000.0)
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
