"""The CI scripts under ci/ on a machine without a GPU: each stops at the machine check, judges nothing
and writes nothing but its own log."""

import os
import subprocess
import sys
from pathlib import Path

CI = Path(__file__).resolve().parent.parent / "ci"


def test_gpu_suite_stops_at_a_failed_machine_check(tmp_path):
    """ci/gpu-suite.sh runs no test and no benchmark after a machine check that fails (here: no GPU): exit 3."""
    out = tmp_path / "out"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", NF4TUNE_CMD=f"{sys.executable} -m nf4tune.cli")
    r = subprocess.run(["bash", str(CI / "gpu-suite.sh"), str(out)], cwd=CI.parent, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "machine check FAILED" in (out / "suite.txt").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["machine-check.txt", "suite.txt"]


def test_nightly_stops_at_a_failed_machine_check(tmp_path):
    """ci/nightly.sh judges nothing on a machine that fails ci/machine_check.py (here: no GPU): exit 2, a
    message, and neither the database nor the report written."""
    db, report = tmp_path / "night.db", tmp_path / "report"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", NF4TUNE_PYTHON=sys.executable,
               NF4TUNE_CMD=f"{sys.executable} -m nf4tune.cli")
    r = subprocess.run(["bash", str(CI / "nightly.sh"), str(db), str(report)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "failed its check" in r.stdout and "nothing judged" in r.stdout
    assert not db.exists() and not report.exists()
