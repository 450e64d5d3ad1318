"""Measuring candidates in a worker process that is restarted when it dies or hangs.

An illegal memory access poisons the CUDA context of the process that made it, and a kernel
that never ends blocks its process forever: neither may end a search. The parent sends one
task at a time over a pipe and waits with a time limit; a dead or silent worker is killed,
the task becomes an invalid trial with the reason, and a fresh worker takes the next task.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
from typing import Optional

from ..families import get as get_family
from ..vocabulary import Problem
from .trial import TrialOutcome

__all__ = ["WorkerMeasurer", "measure_on_gpu"]

DEFAULT_TARGET = "nf4tune.tune.worker:measure_on_gpu"


def measure_on_gpu(problem: dict, config_json: str, options: dict) -> dict:
    """Gate and time one config against its family's peer on the visible GPU (runs inside the worker)."""
    from ..measure.bench import bench_problem

    prob = Problem.from_dict(problem)
    family = get_family(prob.family)
    config = family.from_json(config_json)
    rep = bench_problem(prob, [(config.short(), config)], seed=options.get("seed"),
                        time_cap_s=options.get("time_cap_s", 1.0), min_reps=options.get("min_reps", 10))
    d = rep.to_dict()
    cand = [r for r in d["results"] if r["config"] is not None]
    bnb = next((r for r in d["results"] if r["label"] == family.peer_label), None)
    status = cand[0]["status"] if cand else "invalid"
    reason = cand[0]["reason"] if cand else "no result"
    # a launch or CUDA error may have poisoned this process's context: ask for a fresh worker
    restart = status != "ok" and ("CUDA" in reason or "LaunchError" in reason or "launch" in reason)
    keep = [r for r in d["results"] if r["config"] is not None or r["label"] in (family.peer_label, rep.ceiling_label)]
    return dict(status=status, median_us=cand[0]["median_us"] if cand else None, reason=reason, results=keep,
                gpu_state=d["gpu_after"], bnb_median_us=bnb["median_us"] if bnb else None,
                copy_gbps=d["copy_gbps"], restart=restart)


def _resolve(target: str):
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def _worker_main(conn, target: str) -> None:
    fn = _resolve(target)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        problem, config_json, options = task
        try:
            out = fn(problem, config_json, options)
        except Exception as e:  # the candidate broke something: report it and start afresh
            out = dict(status="invalid", reason=f"{type(e).__name__}: {e}", results=[], restart=True)
        conn.send(out)
        if out.get("restart"):
            return


class WorkerMeasurer:
    """A :class:`nf4tune.tune.trial.Measurer` that measures in a restartable worker process."""

    def __init__(self, target: str = DEFAULT_TARGET, task_timeout_s: float = 180.0, options: Optional[dict] = None):
        self.target = target
        self.task_timeout_s = task_timeout_s
        self.options = dict(options or {})
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self.restarts = 0

    def _start(self):
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(child, self.target), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def _kill(self):
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def measure(self, problem: Problem, config) -> TrialOutcome:
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self.restarts += 1
            self._kill()
            self._start()
        task = (problem.to_dict(), config.to_json(), self.options)
        try:
            self._conn.send(task)
            if not self._conn.poll(self.task_timeout_s):
                self._kill()
                self.restarts += 1
                return self._invalid(config, f"hang: no result within {self.task_timeout_s:.0f} s; worker restarted")
            out = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            code = self._proc.exitcode if self._proc is not None else None
            self._kill()
            self.restarts += 1
            return self._invalid(config, f"worker died (exit code {code}); restarted")
        if out.get("restart"):
            self._kill()
            self.restarts += 1
        return TrialOutcome(status=out["status"], median_us=out.get("median_us"), reason=out.get("reason", ""),
                            results=out.get("results") or [], gpu_state=out.get("gpu_state") or {},
                            bnb_median_us=out.get("bnb_median_us"), copy_gbps=out.get("copy_gbps"))

    @staticmethod
    def _invalid(config, reason: str) -> TrialOutcome:
        return TrialOutcome(status="invalid", reason=reason,
                            results=[dict(label=config.short(), config=config.to_dict(), status="invalid",
                                          reason=reason)])

    def close(self):
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
