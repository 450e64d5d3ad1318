"""Storing measurements: the environment a run ran in, run bookkeeping, and bench results,
through db/."""

from __future__ import annotations

import functools
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Iterator, Optional

from ..vocabulary import Problem

__all__ = ["environment_versions", "record_report", "open_repository", "gpu_row", "RecordedRun", "recorded_run",
           "table_entries"]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=1)
def _git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip()
        if out.returncode == 0 and commit:
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return commit[:12] + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def environment_versions(driver: str = "unknown") -> dict:
    """Everything that can change a result besides the config: versions and the commit."""
    from .._version import __version__
    from ..kernel.compiler import nvrtc_version

    try:
        import torch
        torch_v = torch.__version__
    except ImportError:  # pragma: no cover
        torch_v = "none"
    cuda_python = _version("cuda-core")
    bindings = _version("cuda-bindings")
    return dict(project_version=__version__, git_commit=_git_commit(), nvrtc=nvrtc_version(), driver=driver,
                cuda_python=f"core {cuda_python}, bindings {bindings}", bnb=_version("bitsandbytes"), torch=torch_v)


def open_repository(url: Optional[str] = None, must_exist: bool = False):
    """The repository at ``url``; ``must_exist``: a read-only use, which never creates or alters
    a database (see db.connect)."""
    from nf4tune.db import Repository, connect

    return Repository(connect(url, read_only=must_exist))


def gpu_row(repo, gpu, copy_gbps: Optional[float] = None):
    return repo.gpu(gpu.name, gpu.compute_capability_text, gpu.sm_count, gpu.memory_bytes, gpu.l2_bytes, copy_gbps)


def record_report(repo, run, report) -> dict:
    """Store every result of a :class:`nf4tune.measure.bench.ProblemReport` under ``run``; returns
    the stored measurements by label."""
    from ..families import get as get_family

    problem = Problem.from_dict(report.problem)
    family = get_family(problem.family)
    peer = report.result(family.peer_label)
    th = family.template_hash()
    stored = {}
    for r in report.results:
        d = r if isinstance(r, dict) else r.__dict__
        row = repo.config(d["config"], th, family.name) if d.get("config") else None
        stored[d["label"]] = repo.add_measurement(run, problem, d, row, gpu_state=report.gpu_after,
                                                  bnb_median_us=peer.median_us if peer else None)
    return stored


@dataclass
class RecordedRun:
    """A run being recorded: the repository, its row and the GPU it runs on."""

    repo: object
    run: object
    gpu: object

    def store(self, report) -> dict:
        stored = record_report(self.repo, self.run, report)
        gpu_row(self.repo, self.gpu, copy_gbps=report.copy_gbps if report.ceiling_label.startswith("device copy")
                else None)
        return stored


@contextmanager
def recorded_run(kind: str, url: Optional[str], gpu, command: str = "", env: Optional[dict] = None,
                 repo=None) -> Iterator[RecordedRun]:
    """The run bookkeeping of bench, search and regress in one place: open the repository,
    record the GPU and the environment, start a run of ``kind``, and finish it (also when the
    work inside raises)."""
    repo = repo if repo is not None else open_repository(url)
    env = env if env is not None else environment_versions(gpu.driver_version)
    run = repo.start_run(kind, gpu_row(repo, gpu), repo.environment(**env), command=command)
    try:
        yield RecordedRun(repo, run, gpu)
    finally:
        repo.finish_run(run)


def table_entries(repo, default_space: bool = False) -> list[dict]:
    """The best stored config of every (GPU model, problem), with its median and its speedup over
    the family's peer: the entries of the serving table that ``nf4-tune export`` writes
    (``default_space``: the best config of the family's default space, no experimental knob value; a
    problem with none is left out)."""
    import statistics

    from ..families import get as get_family
    from ..vocabulary import speedup

    entries = []
    for gname, prob in repo.problems():
        family = get_family(prob.family)
        keep = (lambda knobs, family=family: not family.from_dict(knobs).experimental()) if default_space else None
        best = repo.best(gname, prob, keep)
        if best is None:
            continue
        knobs, m, _ = best
        peer = repo.reference_medians(gname, prob, family.peer_label)
        peer_us = statistics.median(peer) if peer else None
        entries.append(dict(gpu=gname, family=prob.family, shape=list(prob.shape), dtype=prob.dtype, quant=prob.quant,
                            blocksize=prob.blocksize, m=prob.m, config=knobs, median_us=m.median_us,
                            peer_median_us=peer_us, speedup_vs_bnb=speedup(peer_us, m.median_us),
                            pct_copy=m.pct_copy))
    return entries

