"""The CI scripts under ci/ on a machine without a GPU: each stops at the machine check, judges nothing
and writes nothing but its own log; and gpu-suite.sh's screen step, with a stand-in CLI that records its
calls: the commands it composes, and how it fails."""

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


FAKE_CLI = r'''
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
if args[0] == "export":
    out = args[args.index("-o") + 1]
    open(out, "w").write('{"format": 2, "entries": []}')
    print("wrote 3 tuned problem(s)")
sys.exit(1 if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in args else 0)
'''


def _screen(tmp_path, **env):
    tmp_path.mkdir(parents=True, exist_ok=True)
    fake = tmp_path / "fake_cli.py"
    fake.write_text(FAKE_CLI)
    log = tmp_path / "calls.jsonl"
    out = tmp_path / "out"
    e = dict(os.environ, STEPS="screen", NF4TUNE_CMD=f"{sys.executable} {fake}", FAKE_LOG=str(log), **env)
    r = subprocess.run(["bash", str(CI / "gpu-suite.sh"), str(out)], cwd=CI.parent, env=e, capture_output=True,
                       text=True, timeout=300)
    import json

    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return r, calls, out


def test_the_screen_step_screens_each_problem_into_one_database_and_exports_over_the_packaged_table(tmp_path):
    r, calls, out = _screen(tmp_path, SCREEN_SHAPES="4096x4096 1000x4096", SCREEN_M="1 8", SCREEN_DTYPES="bf16 fp16",
                            DEQUANT_SHAPES="4096x4096 8192x8192", SCREEN_SPACE_ARGS="--experimental --sweep mma=mma-cols")
    assert r.returncode == 0, r.stdout + r.stderr
    db = str(out / "screens.db")
    matmul = [c for c in calls if c[:4] == ["bench", "--family", "matmul", "--exhaustive"]]
    assert len(matmul) == 2 * 2 * 2
    assert all(c[4:7] == ["--experimental", "--sweep", "mma=mma-cols"] and c[-2:] == ["--db", db] for c in matmul)
    assert {(c[c.index("--shape") + 1], c[c.index("--m") + 1], c[c.index("--dtype") + 1]) for c in matmul} == {
        (s, m, d) for s in ("4096x4096", "1000x4096") for m in ("1", "8") for d in ("bf16", "fp16")}
    dequant = [c for c in calls if c[:2] == ["bench", "--exhaustive"]]
    assert [c[c.index("--dtype") + 1] for c in dequant] == ["bf16", "fp16"]
    assert all(c.count("--shape") == 2 and c[-2:] == ["--db", db] for c in dequant)
    assert calls[-1] == ["export", "--db", db, "--default-space", "--over", "tuner/serve/tuned_configs.json",
                         "-o", str(out / "tuned_configs.json")]
    assert (out / "tuned_configs.json").exists() and "packaged table with this GPU's" in (out / "suite.txt").read_text()


def test_a_failed_screen_fails_the_step_and_an_empty_one_is_refused(tmp_path):
    r, calls, out = _screen(tmp_path, SCREEN_SHAPES="4096x4096", SCREEN_M="1 8", SCREEN_DTYPES="bf16",
                            DEQUANT_SHAPES="", FAKE_FAIL="8")
    assert r.returncode == 1 and "screen matmul 4096x4096 m8 bf16 FAILED" in (out / "suite.txt").read_text()
    assert len([c for c in calls if c[0] == "bench"]) == 2 and calls[-1][0] == "export"   # the others still run
    r, calls, out = _screen(tmp_path / "none", SCREEN_SHAPES="", SCREEN_DTYPES="bf16", DEQUANT_SHAPES="")
    assert r.returncode == 1 and "no problem named" in (out / "suite.txt").read_text() and not calls
