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


def _entry(shape, m, us, family="matmul", **config):
    return dict(gpu="NVIDIA H200", family=family, shape=list(shape), dtype="bf16", quant="nf4", blocksize=64, m=m,
                config=config, median_us=us)


def test_merge_table_replaces_the_same_problem_and_keeps_the_rest(tmp_path):
    mt = _module("merge_table")
    base = dict(format=2, entries=[_entry((8192, 8192), 1, 25.0, lut="pair"), _entry((8192, 8192), 8, 27.0),
                                   _entry((8192, 8192), None, 44.0, family="dequant")])
    new = dict(format=2, entries=[_entry((8192, 8192), 1, 22.0, lut="pairx"),
                                  _entry((1024, 4096), 1, 9.0, warps=8, lut="pair")])     # keys out of order
    merged, replaced, added = mt.merge(base, new)
    assert (replaced, added) == (1, 1)
    assert [(e["family"], e["m"], e["median_us"]) for e in merged["entries"]] == [
        ("matmul", 1, 22.0), ("matmul", 8, 27.0), ("dequant", None, 44.0), ("matmul", 1, 9.0)]
    b, n, out = tmp_path / "base.json", tmp_path / "new.json", tmp_path / "out.json"
    b.write_text(json.dumps(base))
    n.write_text(json.dumps(new))
    run = subprocess.run([sys.executable, str(CI / "merge_table.py"), str(b), str(n), "-o", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "1 entries replaced, 1 added, 4 in all" in run.stdout
    assert json.loads(out.read_text()) == merged
    assert all(list(e["config"]) == sorted(e["config"]) for e in merged["entries"])      # one key order
    # another table format is refused, and nothing is written
    n.write_text(json.dumps(dict(new, format=3)))
    out2 = tmp_path / "out2.json"
    bad = subprocess.run([sys.executable, str(CI / "merge_table.py"), str(b), str(n), "-o", str(out2)],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "formats differ" in bad.stderr and not out2.exists()


def test_sass_loops_count_the_body_and_the_first_arms():
    """tuner.kernel.sass on a hand-written listing: one loop of 9 instructions whose if/else's second arm
    (3 instructions, jumped over by the unconditional branch) is left out of the path; a short loop
    below the minimum and a forward-only branch are not loops."""
    from tuner.kernel.sass import loops

    lines = ["        /*0000*/                   S2R R0, SR_TID.X ;",
             ".L_x_0:",
             "        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;",
             "        /*0020*/              @P0 BRA `(.L_x_1) ;",
             "        /*0030*/                   LDG.E R2, desc[UR4][R4.64] ;",
             "        /*0040*/                   BRA `(.L_x_2) ;",
             ".L_x_1:",
             "        /*0050*/                   LDC R3, c[0x0][0x210] ;",
             "        /*0060*/                   IMAD R2, R3, 0x2, RZ ;",
             "        /*0070*/                   MOV R6, R2 ;",
             ".L_x_2:",
             "        /*0080*/                   FFMA R7, R2, R2, R7 ;",
             "        /*0090*/              @P1 BRA `(.L_x_0) ;",
             ".L_x_3:",
             "        /*00a0*/                   NOP ;",
             "        /*00b0*/              @P2 BRA `(.L_x_3) ;",
             "        /*00c0*/                   EXIT ;"]
    found = loops("\n".join(lines), min_len=5)
    assert len(found) == 1
    lp = found[0]
    assert (lp.start, lp.end, lp.static, lp.path) == (1, 9, 9, 6)
    assert dict(lp.mix) == {"IADD3": 1, "BRA": 3, "LDG": 1, "FFMA": 1}
    assert len(loops("\n".join(lines), min_len=2)) == 2


def _final(shape, m, bnb_us, rows, gpu="NVIDIA H100 80GB HBM3"):
    """An exhaustive report as `bench --exhaustive -o` writes it: rows are (label, status, us, knobs)."""
    results = [dict(label="bnb matmul_4bit", config=None, status="reference", median_us=bnb_us, pct_copy=30.0)]
    results += [dict(label=lab, config=dict(mma="simt", m=m, **knobs), status=st, median_us=us, pct_copy=70.0)
                for lab, st, us, knobs in rows]
    prob = dict(family="matmul", shape=list(shape), dtype="bf16", quant="nf4", blocksize=64, m=m)
    return dict(problem=prob, final=dict(problem=prob, results=results, peer_label="bnb matmul_4bit",
                                         gpu_before=dict(gpu_name=gpu)))


def test_table_from_screens_takes_each_problems_fastest_valid_config_faster_than_bnb(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([_final((8192, 8192), 1, 38.0, [("x", "ok", 22.0, dict(warps=16)),
                                                              ("y", "invalid", None, dict(warps=8)),
                                                              ("z", "ok", 25.0, dict(warps=14))]),
                             _final((4096, 4096), 1, 10.0, [("x", "ok", 11.0, dict(warps=16))])]))
    # a second screen of the same problem: its faster config wins
    b.write_text(json.dumps([_final((8192, 8192), 1, 37.0, [("w", "ok", 21.5, dict(warps=4))])]))
    out = tmp_path / "new.json"
    run = subprocess.run([sys.executable, str(CI / "table_from_screens.py"), str(a), str(b), "-o", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    t = json.loads(out.read_text())
    assert t["format"] == 2 and len(t["entries"]) == 1      # 4096x4096: slower than bnb, no entry
    e = t["entries"][0]
    assert (e["gpu"], e["shape"], e["m"], e["config"]["warps"], e["median_us"]) == (
        "NVIDIA H100 80GB HBM3", [8192, 8192], 1, 4, 21.5)
    assert abs(e["speedup_vs_bnb"] - 37.0 / 21.5) < 1e-12
    # a file that is not an exhaustive report: a message, exit 1, nothing written
    bad, out2 = tmp_path / "bad.json", tmp_path / "out2.json"
    bad.write_text(json.dumps([dict(problem={})]))
    run = subprocess.run([sys.executable, str(CI / "table_from_screens.py"), str(bad), "-o", str(out2)],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "not an exhaustive report" in run.stderr and not out2.exists()


def test_table_from_screens_keeps_the_served_config_within_the_min_gain(tmp_path):
    """A screened config replaces the served one timed beside it ("given: ...") only if faster by more than
    --min-gain: 11.10 against the served 11.17 us (0.6%) keeps the served config; 9.02 against 10.46 (14%)
    replaces it (session 18's H100 screens of 4096x4096 and 1024x4096); --min-gain 0 takes the fastest."""
    screens = tmp_path / "s.json"
    screens.write_text(json.dumps([
        _final((4096, 4096), 1, 14.0, [("screen #1", "ok", 11.10, dict(warps=8)),
                                       ("given: simt w16", "ok", 11.17, dict(warps=16))]),
        _final((1024, 4096), 1, 11.0, [("screen #1", "ok", 9.02, dict(warps=8)),
                                       ("given: mma-rows w4", "ok", 10.46, dict(warps=4))])]))

    def table(*opts):
        out = tmp_path / "t.json"
        run = subprocess.run([sys.executable, str(CI / "table_from_screens.py"), str(screens), "-o", str(out),
                              *opts], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return {tuple(e["shape"]): (e["config"]["warps"], e["median_us"]) for e in json.loads(out.read_text())["entries"]}

    assert table() == {(4096, 4096): (16, 11.17), (1024, 4096): (8, 9.02)}
    assert table("--min-gain", "0") == {(4096, 4096): (8, 11.10), (1024, 4096): (8, 9.02)}
    assert table("--min-gain", "0.2") == {(4096, 4096): (16, 11.17), (1024, 4096): (4, 10.46)}
    bad = subprocess.run([sys.executable, str(CI / "table_from_screens.py"), str(screens), "-o",
                          str(tmp_path / "never.json"), "--min-gain", "1.5"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--min-gain" in bad.stderr and not (tmp_path / "never.json").exists()


def test_served_config_prints_what_the_runtime_serves_or_nothing_where_bnb_does(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, str(CI / "served_config.py"), *args], capture_output=True, text=True)

    table = tmp_path / "t.json"
    e = dict(gpu="GPU X", family="matmul", shape=[8192, 8192], dtype="bf16", quant="nf4", blocksize=64,
             config=dict(mma="simt", warps=16, m=1))
    table.write_text(json.dumps(dict(format=2, entries=[dict(e, m=1, speedup_vs_bnb=1.7),
                                                         dict(e, m=8, config=dict(mma="simt", m=8),
                                                              speedup_vs_bnb=0.9)])))
    got = run("8192x8192", "1", "--gpu", "GPU X", "--table", str(table))
    assert got.returncode == 0 and json.loads(got.stdout)["warps"] == 16
    # slower than bnb at that bucket, another GPU, or no entry: bnb serves, nothing printed
    for args in (("8192x8192", "8", "--gpu", "GPU X"), ("8192x8192", "1", "--gpu", "GPU Y"),
                 ("4096x4096", "1", "--gpu", "GPU X")):
        got = run(*args, "--table", str(table))
        assert got.returncode == 0 and got.stdout == "", (args, got.stdout)
    bad = run("8192x8192", "1", "--gpu", "GPU X", "--table", str(tmp_path / "missing.json"))
    assert bad.returncode == 1 and "cannot read the config table" in bad.stderr


def test_device_call_stops_at_a_failed_machine_check(tmp_path):
    """ci/device-call.sh runs nothing after a machine check that fails (here: no GPU) and says so, exit 3."""
    import os
    import shutil

    if not shutil.which("bash"):
        import pytest

        pytest.skip("no bash")
    env = dict(os.environ, OUT=str(tmp_path), STEPS="tests screens table decode", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run(["bash", str(CI / "device-call.sh")], cwd=CI.parent, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "machine check FAILED" in (tmp_path / "call.txt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["call.txt", "machine-check.txt"]


def test_nightly_stops_at_a_failed_machine_check(tmp_path):
    """ci/nightly.sh judges nothing on a machine that fails ci/machine_check.py (here: no GPU): exit 2, a
    message, and neither the database nor the report written."""
    import os

    db, report = tmp_path / "night.db", tmp_path / "report"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", NF4TUNE_PYTHON=sys.executable,
               NF4TUNE_CMD=f"{sys.executable} -m tuner.cli", PYTHONPATH=str(CI.parent))
    r = subprocess.run(["bash", str(CI / "nightly.sh"), str(db), str(report)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "failed its check" in r.stdout and "nothing judged" in r.stdout
    assert not db.exists() and not report.exists()
