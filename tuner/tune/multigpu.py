"""Every GPU of a host: one measuring worker per GPU against the shared studies.

The parent process (``nf4-tune search --gpus``) has the problem list; it starts one child
process per GPU with ``CUDA_VISIBLE_DEVICES`` naming that GPU alone. Each child runs the same
search as a one-GPU ``nf4-tune search`` (:func:`nf4tune.tune.search.run_searches` over the full
problem list, heartbeats included) on the shared database URL: optuna hands the children
distinct trials of each study, so the studies fill up to their trial count about as many times
faster as there are GPUs. (SQLite in WAL mode serves the workers of one host; PostgreSQL serves
workers on several hosts.) The parent streams each child's progress lines, prefixed with its
GPU, waits for all of them, and reports the wall time of the whole problem set and each
child's part; a child that fails makes the set fail.

The child's entry point is a ``module:function`` target (:data:`DEFAULT_CHILD`), which tests
replace with one that measures with a test double.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..vocabulary import Problem

__all__ = ["DEFAULT_CHILD", "parse_gpus", "devices_for", "ChildResult", "MultiSearchResult", "search_on_gpus",
           "search_on_visible_gpu"]

DEFAULT_CHILD = "nf4tune.tune.multigpu:search_on_visible_gpu"


def parse_gpus(text: str):
    """``"all"``, or the distinct non-negative GPU indices of ``"0,1,..."``; ValueError otherwise."""
    text = str(text).strip()
    if text == "all":
        return "all"
    parts = [p.strip() for p in text.split(",")]
    if not text or any(not p.isdigit() for p in parts):
        raise ValueError(f"--gpus {text!r} is not 'all' or comma-separated GPU indices such as 0,1")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {text!r} names a GPU twice")
    return ids


def devices_for(spec, visible: int, env_visible: Optional[str] = None) -> list:
    """``(index, CUDA_VISIBLE_DEVICES value)`` of each GPU that ``spec`` (:func:`parse_gpus`)
    names, among the ``visible`` GPUs this process sees. Indices count the visible GPUs, so
    under ``CUDA_VISIBLE_DEVICES=2,3`` GPU 0 is device 2. LookupError when none is visible or an
    index is past the last visible GPU."""
    if visible < 1:
        raise LookupError("no CUDA GPU is visible; --gpus needs at least one")
    ids = list(range(visible)) if spec == "all" else list(spec)
    past = [i for i in ids if i >= visible]
    if past:
        raise LookupError(f"--gpus names GPU {past[0]}, but {visible} GPU(s) are visible (0..{visible - 1})")
    names = [d.strip() for d in env_visible.split(",")] if env_visible and env_visible.strip() else None
    if names is not None and len(names) < visible:
        names = None
    return [(i, names[i] if names else str(i)) for i in ids]


@dataclass
class ChildResult:
    """One GPU's worker: how it ended, how long it ran and what it contributed."""

    gpu: int                       # the index --gpus named
    device: str                    # its CUDA_VISIBLE_DEVICES value
    returncode: Optional[int]
    seconds: float
    result: dict = field(default_factory=dict)     # what the child reported (gpu_name, run_id, per problem)
    tail: list = field(default_factory=list)       # its last output lines

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.result)

    @property
    def new_trials(self) -> int:
        return sum(p.get("new_trials", 0) for p in self.result.get("problems", []))


@dataclass
class MultiSearchResult:
    problems: list
    children: list
    seconds: float                 # wall time of the whole problem set

    @property
    def failed(self) -> list:
        return [c for c in self.children if not c.ok]

    @property
    def gpu_name(self) -> Optional[str]:
        return next((c.result.get("gpu_name") for c in self.children if c.result.get("gpu_name")), None)

    def timing_line(self) -> str:
        parts = [f"gpu {c.gpu}: {c.new_trials} trial(s) in {c.seconds:.1f} s" for c in self.children]
        return (f"{len(self.problems)} problem(s) on {len(self.children)} GPU(s) in {self.seconds:.1f} s wall "
                f"({'; '.join(parts)})")


def _resolve(target: str) -> Callable:
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def search_on_gpus(problems: Sequence[Problem], devices: Sequence[tuple], *, url: str, n_trials: int = 30,
                   sampler: str = "tpe", seed: Optional[int] = None, timeout: Optional[float] = None,
                   remeasure: bool = False, time_cap_s: float = 1.0, command: str = "",
                   target: Optional[str] = None, progress: Optional[Callable[[str], None]] = None,
                   child_timeout_s: Optional[float] = None, experimental: bool = False) -> MultiSearchResult:
    """Search ``problems`` with one worker process per device of ``devices`` (:func:`devices_for`)
    into the database at ``url``; ``progress(line)`` gets every line the workers print, prefixed
    with their GPU. ``seed`` (when given) is offset per worker so that their samplers differ."""
    from ..measure.record import open_repository
    from .search import _storage

    target = target or DEFAULT_CHILD
    t0 = time.perf_counter()
    # make or upgrade both schemas (ours and optuna's) once, before the workers race to
    open_repository(url)
    _storage(url)
    children = []
    with tempfile.TemporaryDirectory(prefix="nf4tune-gpus-") as tmp:
        procs = []
        for k, (index, device) in enumerate(devices):
            spec = dict(problems=[p.to_dict() for p in problems], url=url, n_trials=n_trials, sampler=sampler,
                        seed=None if seed is None else seed + k, timeout=timeout, remeasure=remeasure,
                        time_cap_s=time_cap_s, command=command, worker=f"gpu{device}", experimental=experimental,
                        result=str(Path(tmp) / f"gpu{index}.json"))
            spec_path = Path(tmp) / f"gpu{index}-spec.json"
            spec_path.write_text(json.dumps(spec))
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=device, PYTHONUNBUFFERED="1")
            proc = subprocess.Popen([sys.executable, "-m", __name__, target, str(spec_path)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
            tail: deque = deque(maxlen=20)
            reader = threading.Thread(target=_stream, args=(proc, f"[gpu {index}] ", tail, progress), daemon=True)
            reader.start()
            procs.append((index, device, proc, reader, tail, time.perf_counter(), Path(spec["result"])))
        try:
            for index, device, proc, reader, tail, started, result_path in procs:
                remaining = None if child_timeout_s is None else max(1.0, child_timeout_s - (time.perf_counter() - t0))
                try:
                    code = proc.wait(remaining)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    code = proc.wait()
                    tail.append(f"killed after {child_timeout_s:.0f} s")
                reader.join(10)
                result = json.loads(result_path.read_text()) if result_path.exists() else {}
                children.append(ChildResult(index, device, code, result.get("seconds", time.perf_counter() - started),
                                            result, list(tail)))
        except KeyboardInterrupt:
            _stop(procs)
            raise
    return MultiSearchResult(list(problems), children, time.perf_counter() - t0)


def _stream(proc, prefix: str, tail: deque, progress) -> None:
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        if progress:
            progress(prefix + line)


def _stop(procs) -> None:
    """Interrupt every worker (each fails its running trial and exits), then kill what is left."""
    import signal

    for _, _, proc, *_ in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30
    for _, _, proc, *_ in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ----------------------------------------------------------------------------- the child
def search_on_visible_gpu(spec: dict, gpu=None, measurer=None) -> dict:
    """One GPU's worker: :func:`nf4tune.tune.search.run_searches` of the spec's problems on the GPU
    this process sees (``gpu`` and ``measurer`` default to the real ones), one progress line
    per finished trial; returns what the parent reports."""
    from .search import run_searches

    if gpu is None:
        from ..kernel.gpu import require_gpu

        gpu = require_gpu()
    problems = [Problem.from_dict(d) for d in spec["problems"]]

    def progress_for(problem):
        label = problem.label()

        def show(done, total, best_us, bnb_us):
            best = f"best {best_us:.2f} us" if best_us else "best -"
            print(f"{label}: {done}/{total} {best}", flush=True)

        return show

    result = run_searches(problems, url=spec["url"], gpu=gpu, n_trials=spec["n_trials"], sampler=spec["sampler"],
                          seed=spec["seed"], timeout=spec["timeout"], remeasure=spec["remeasure"],
                          time_cap_s=spec["time_cap_s"], command=spec["command"], progress_for=progress_for,
                          measurer=measurer, worker=spec["worker"], experimental=spec.get("experimental", False))
    return dict(gpu_name=gpu.name, run_id=result.run_id, seconds=result.seconds,
                problems=[dict(problem=s.problem.label(), new_trials=s.new_trials, measured=s.measured,
                               stale_failed=s.stale_failed) for s in result.summaries])


def _child_main(argv: Sequence[str]) -> int:
    target, spec_path = argv
    spec = json.loads(Path(spec_path).read_text())
    try:
        out = _resolve(target)(spec)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 130
    except Exception:
        traceback.print_exc(file=sys.stdout)
        return 1
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
