"""Test doubles for search logic (never used in place of the real measurement path)."""

import os
import time

from tuner.tune.trial import TrialOutcome


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

    def __init__(self, invalid=(), delay_s=0.0):
        self.calls = []
        self.invalid = set(invalid)
        self.delay_s = delay_s

    def measure(self, problem, config):
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
