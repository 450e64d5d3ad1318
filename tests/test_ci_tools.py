"""The small reading tools under ci/ (CPU only)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

CI = Path(__file__).resolve().parent.parent / "ci"


def _module(name):
    spec = importlib.util.spec_from_file_location(name, CI / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _screen(path, shape, m, times):
    screen = {json.dumps(dict(ksplit=k, warps=w, lut="pair"), sort_keys=True): us for (k, w), us in times.items()}
    path.write_text(json.dumps([dict(problem=dict(family="matmul", shape=list(shape), m=m), screen_us=screen)]))
    return str(path)


def test_explore_best_per_knob_value_and_the_table(tmp_path):
    eb = _module("explore_best")
    a = _screen(tmp_path / "a.json", (8192, 8192), 1,
                {(1, 4): 30.0, (1, 8): 25.0, (2, 8): 28.5, (16, 8): 51.0, (16, 4): None, (2, 4): 27.0})
    b = _screen(tmp_path / "b.json", (4096, 4096), 16, {(1, 8): 11.0, (16, 2): 25.5})
    best = eb.best_by(a, "ksplit")
    assert [(c["ksplit"], c["warps"]) for c in best] == [(1, 8), (2, 4), (16, 8)]     # numeric order, failures skipped
    lines = eb.table([a, b], "ksplit")
    assert lines == ["a.json  8192x8192 M=1  ksplit=1: 25.0  ksplit=2: 27.0  ksplit=16: 51.0",
                     "b.json  4096x4096 M=16  ksplit=1: 11.0  ksplit=16: 25.5"]
    assert eb.table([a], "lut") == ["a.json  8192x8192 M=1  lut=pair: 25.0"]
    run = subprocess.run([sys.executable, str(CI / "explore_best.py"), "--table", "warps", a], capture_output=True,
                         text=True)
    assert run.returncode == 0 and run.stdout.strip() == "a.json  8192x8192 M=1  warps=4: 27.0  warps=8: 25.0"
    bad = subprocess.run([sys.executable, str(CI / "explore_best.py"), "--table"], capture_output=True, text=True)
    assert bad.returncode == 1 and "Usage" in bad.stderr
