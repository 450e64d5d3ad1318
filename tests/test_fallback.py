"""The fallback-distance report (bench --fallback-vs): what the table serves a problem it was not
tuned on, against the config tuned on that problem. The harness is a double here (CPU); the real
path runs on the GPU (ci/gpu-session.sh coverage)."""

import pytest

import nf4tune.measure.bench as bench_mod
from nf4tune.families import DEQUANT
from nf4tune.measure.bench import BenchResult, ProblemReport
from nf4tune.bench.fallback import fallback_distance, format_fallback
from nf4tune.serve.table import ConfigTable
from nf4tune.vocabulary import Problem

GPU = "NVIDIA H200"
NEAR = DEQUANT.config(bytes_per_thread=4, unroll=4, threads=128, lut="shared", index="hoisted", dtype="bf16",
                      quant="nf4")
TUNED = DEQUANT.config(bytes_per_thread=8, unroll=2, threads=256, lut="register", index="shift", dtype="bf16",
                       quant="nf4")


class FakeRepo:
    url = "sqlite:///tuned.db"

    def __init__(self, best):
        self._best = best

    def best(self, gpu, problem):
        b = self._best.get((gpu, problem))
        return None if b is None else (b.to_dict(), None, None)


def _table():
    entry = dict(gpu=GPU, family="dequant", shape=[8192, 8192], dtype="bf16", quant="nf4", blocksize=128, m=None,
                 config=NEAR.to_dict())
    return ConfigTable([entry], "table.json")


def test_served_nearest_against_tuned(monkeypatch):
    prob = Problem((5120, 13824), "bf16", "nf4", 128)
    seen = []

    def fake_bench(problem, candidates, seed=None, **timing):
        seen.append(candidates)
        us = {NEAR: 10.5, TUNED: 10.0}
        return ProblemReport(problem.to_dict(), 1, 1.0, [BenchResult(l, c.to_dict(), "ok", median_us=us[c])
                                                         for l, c in candidates], {}, {}, seed)

    monkeypatch.setattr(bench_mod, "bench_problem", fake_bench)
    reps = fallback_distance([prob], _table(), FakeRepo({(GPU, prob): TUNED}), GPU, seed=1)
    (r,) = reps
    assert [c for _, c in seen[0]] == [NEAR, TUNED]
    assert r.source == "nearest" and "8192x8192" in r.served
    assert r.slowdown == pytest.approx(1.05)
    text = format_fallback(reps)
    assert "1.050" in text and "+5.0%" in text and "met" in text and "NOT met" not in text
    assert "NOT met" in format_fallback(reps, target=0.04)


def test_missing_tuned_config_is_refused_before_timing(monkeypatch):
    monkeypatch.setattr(bench_mod, "bench_problem", lambda *a, **k: pytest.fail("timed before checking"))
    with pytest.raises(ValueError, match="nothing tuned"):
        fallback_distance([Problem((5120, 13824), "bf16", "nf4", 128)], _table(), FakeRepo({}), GPU)
