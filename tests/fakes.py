"""Test doubles for search logic (never used in place of the real measurement path)."""

import os
import time
from pathlib import Path

from nf4tune.tune.trial import TrialOutcome


def synthetic_us(config) -> float:
    """A deterministic 'time' with structure a sampler can learn: shared/hoisted/4x4 is best."""
    t = 100.0
    t += {"shared": 0, "register": 8, "global": 15, "constant": 25, "branch": 60}[config.lut]
    t += {"hoisted": 0, "shift": 10, "div": 20}[config.index]
    t += abs(config.bytes_per_thread * config.unroll - 16) * 1.5 + (0 if config.bytes_per_thread == 4 else 6)
    t += abs(config.threads - 128) / 64.0
    t += 0 if config.grid == "oneshot" else 7
    t += 0.5 if config.store == "streaming" else 0
    return t


class FakeMeasurer:
    """Measures nothing: a synthetic time, and 'invalid' for configs the test names."""

    def __init__(self, invalid=(), delay_s=0.0, before_first=None):
        self.calls = []
        self.invalid = set(invalid)
        self.delay_s = delay_s
        self.before_first = before_first      # called once, at the first measurement (a start barrier)

    def measure(self, problem, config):
        if self.before_first is not None and not self.calls:
            self.before_first()
        self.calls.append(config)
        if self.delay_s:
            time.sleep(self.delay_s)
        if config in self.invalid:
            return TrialOutcome("invalid", reason="planted mismatch",
                                results=[dict(label=config.short(), config=config.to_dict(), status="invalid",
                                              reason="planted mismatch")])
        us = synthetic_us(config)
        return TrialOutcome("ok", median_us=us, bnb_median_us=300.0,
                            results=[dict(label=config.short(), config=config.to_dict(), status="ok", median_us=us,
                                          samples_us=[us], gbps=1.0, pct_copy=50.0, speedup_vs_bnb=300.0 / us),
                                     dict(label="bnb dequantize_4bit", config=None, status="reference",
                                          median_us=300.0, samples_us=[300.0])])


# worker-process targets (module:function) for the fault tests
def worker_ok(problem, config_json, options):
    return dict(status="ok", median_us=1.0, reason="", results=[], gpu_state={}, bnb_median_us=2.0, restart=False)


def worker_crash(problem, config_json, options):
    os._exit(11)  # dies like a process whose CUDA context was poisoned and aborted


def worker_hang(problem, config_json, options):
    time.sleep(3600)


def worker_raise(problem, config_json, options):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


class StallingMeasurer(FakeMeasurer):
    """A FakeMeasurer whose call number ``stall_at`` (1-based) writes ``marker`` and then sleeps
    for ``stall_s``: a search to kill in the middle of a trial."""

    def __init__(self, marker, stall_at=5, stall_s=600.0, delay_s=0.0):
        super().__init__(delay_s=delay_s)
        self.marker, self.stall_at, self.stall_s = marker, stall_at, stall_s

    def measure(self, problem, config):
        if len(self.calls) + 1 == self.stall_at:
            with open(self.marker, "w") as f:
                f.write(config.to_json())
            time.sleep(self.stall_s)
        return super().measure(problem, config)


# `nf4-tune search --gpus` child targets (module:function) for the CPU tests
def fake_gpu_search(spec):
    """One 'GPU' worker: the real child code with a test double for the GPU and its measurement."""
    from nf4tune.kernel.gpu import GPUInfo
    from nf4tune.tune.multigpu import search_on_visible_gpu

    gpu = GPUInfo("Fake GPU", "sm_90", (9, 0), 132, 60 << 20, 141 << 30, "580.1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] in ("0", "1", "5", "7")
    return search_on_visible_gpu(spec, gpu=gpu,
                                 measurer=FakeMeasurer(delay_s=0.05, before_first=_wait_for_the_other_workers))


def _wait_for_the_other_workers(timeout_s=120.0):
    """A start barrier for tests that check every worker measured something: on 2 busy cores one
    child can start seconds after the other and find the study already done. Set
    NF4TUNE_TEST_START_BARRIER=<dir>:<count> to make each worker's first measurement (its trial
    running) wait until <count> workers have reached theirs."""
    spec = os.environ.get("NF4TUNE_TEST_START_BARRIER")
    if not spec:
        return
    folder, count = spec.rsplit(":", 1)
    Path(folder, f"started-{os.environ['CUDA_VISIBLE_DEVICES']}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(Path(folder).glob("started-*"))) < int(count):
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(Path(folder).glob('started-*')))} of {count} workers started")
        time.sleep(0.02)


def fake_gpu_search_failing_on_1(spec):
    if os.environ["CUDA_VISIBLE_DEVICES"] == "1":
        raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")
    return fake_gpu_search(spec)
