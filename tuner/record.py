"""Storing measurements: the environment a run ran in, and bench/search results, through db/."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Optional

from kernel_templates import template_hash

__all__ = ["environment_versions", "record_report", "open_repository", "best_configs"]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=1)
def _git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
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
    from . import __version__
    from .compiler import nvrtc_version

    try:
        import torch
        torch_v = torch.__version__
    except ImportError:  # pragma: no cover
        torch_v = "none"
    cuda_python = _version("cuda-core")
    bindings = _version("cuda-bindings")
    return dict(project_version=__version__, git_commit=_git_commit(), nvrtc=nvrtc_version(), driver=driver,
                cuda_python=f"core {cuda_python}, bindings {bindings}", bnb=_version("bitsandbytes"), torch=torch_v)


def open_repository(url: Optional[str] = None):
    from db import Repository, connect

    return Repository(connect(url))


def gpu_row(repo, gpu, copy_gbps: Optional[float] = None):
    return repo.gpu(gpu.name, f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}", gpu.sm_count,
                    gpu.memory_bytes, gpu.l2_bytes, copy_gbps)


def record_report(repo, run, report) -> dict:
    """Store every result of a :class:`tuner.bench.ProblemReport` under ``run``; returns the
    stored measurements by label."""
    from .bench import REF_BNB

    d = report.to_dict()
    bnb = next((r["median_us"] for r in d["results"] if r["label"] == REF_BNB), None)
    th = template_hash()
    stored = {}
    for r in d["results"]:
        row = repo.config(r["config"], th) if r.get("config") else None
        stored[r["label"]] = repo.add_measurement(run, d["problem"], r, row, gpu_state=d.get("gpu_after"),
                                                  bnb_median_us=bnb)
    return stored


def best_configs(repo) -> list[dict]:
    """The best stored config of every (GPU model, problem): what ``nf4-tune export`` writes."""
    entries = []
    for gname, prob in repo.problems():
        knobs, m, _ = repo.best(gname, prob)
        entries.append(dict(gpu=gname, shape=list(prob["shape"]), dtype=prob["dtype"], quant=prob["quant"],
                            blocksize=prob["blocksize"], config=knobs, median_us=m.median_us,
                            speedup_vs_bnb=m.speedup, pct_copy=m.pct_copy))
    return entries
