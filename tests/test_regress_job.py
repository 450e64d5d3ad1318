"""The nightly job's orchestration (nf4tune.track.nightly.run_regress) against a real database, with a
test double for the GPU measurement; and `nf4-tune regress`'s exit codes."""

import random


from nf4tune import cli
from nf4tune.cli.regress import format_regress
from nf4tune.families import DEQUANT
from nf4tune.families.dequant import REF_BNB
from nf4tune.kernel.gpu import GPUInfo
from nf4tune.measure.bench import BenchResult, ProblemReport
from nf4tune.track.nightly import run_regress
from nf4tune.vocabulary import Problem
from nf4tune.db import Repository, connect

GPU = GPUInfo("NVIDIA H200", "sm_90", (9, 0), 132, 62914560, 150 << 30, "580.1")
ENV = dict(project_version="0.1.0", git_commit="abc", nvrtc="13.0", driver="580.1", cuda_python="x", bnb="0.50.2",
           torch="2.11")
BEST = DEQUANT.preset("blog", dtype="bf16", quant="nf4").replace(unroll=4, threads=128, index="hoisted")


class FakeMeasure:
    """Interleaved samples of the tuned config and bnb; ``slow`` scales the tuned kernel's time,
    ``broken`` fails the gate, per problem label."""

    def __init__(self, seed=0):
        self.rng = random.Random(seed)
        self.slow = {}
        self.broken = set()
        self.stalls = {}          # problem label -> how many of its next measurements a host stall hits
        self.bnb_timing = ""      # how the harness says it timed bnb ("" before it said so)
        self.bnb_factor = 1.0     # bnb's time under that timing
        self.calls = []

    def __call__(self, problem, candidates):
        (label, config), = candidates
        self.calls.append(problem.label())
        drift = self.rng.uniform(0.95, 1.05)
        base = 10.0 * problem.numel / 4096 ** 2
        t = base * self.slow.get(problem.label(), 1.0)
        tuned = [t * drift * self.rng.gauss(1, 0.01) for _ in range(25)]
        bnb = [1.9 * base * self.bnb_factor * drift * self.rng.gauss(1, 0.01) for _ in range(25)]
        if self.stalls.get(problem.label()):
            self.stalls[problem.label()] -= 1      # bnb's calls up to 2.8x slower, widely spread
            bnb = [1.9 * base * drift * self.rng.uniform(1.0, 2.8) for _ in range(25)]
        med = sorted(tuned)[12]
        bmed = sorted(bnb)[12]
        if problem.label() in self.broken:
            r = BenchResult(label, config.to_dict(), "invalid", "shape (4096, 4096): 17 of 16777216 elements differ")
        else:
            r = BenchResult(label, config.to_dict(), "ok", "", med, 0.1, tuned, 3000.0, 80.0, bmed / med)
        from nf4tune.families import get as get_family

        peer = get_family(problem.family).peer_label
        ref = BenchResult(peer, None, "reference", f"timing: {self.bnb_timing}" if self.bnb_timing else "", bmed,
                          0.1, bnb, 1500.0, 40.0, 1.0)
        state = dict(gpu_name=GPU.name, sm_clock_mhz=1980, max_sm_clock_mhz=1980, temperature_c=50)
        return ProblemReport(problem=problem.to_dict(), bytes_moved=1, copy_gbps=4000.0, results=[ref, r],
                             gpu_before=state, gpu_after=state, seed=0, peer_label=peer,
                             ceiling_label="device copy (ceiling)", bnb_timing=self.bnb_timing)


def _seeded_repo(url):
    """A database as a search leaves it: a best config for two problems on the H200."""
    from nf4tune.measure import record

    repo = Repository(connect(url))
    run = repo.start_run("search", record.gpu_row(repo, GPU), repo.environment(**ENV))
    row = repo.config(BEST.to_dict(), "th")
    for shape in ((4096, 4096), (8192, 8192)):
        prob = Problem(shape, "bf16", "nf4", 64)
        repo.add_measurement(run, prob, dict(label="trial", status="ok", median_us=10.0, samples_us=[10.0],
                                             speedup_vs_bnb=1.9), row)
    repo.finish_run(run)
    return repo


def test_quiet_nights_then_a_slowdown_then_a_broken_kernel(db_url):
    repo = _seeded_repo(db_url)
    fake = FakeMeasure()
    for night in range(4):
        result = run_regress(repo, GPU, measure=fake, env=ENV)
        assert [v.flag for v in result.verdicts] == ["ok", "ok"], result.verdicts
        assert result.exit_code == 0
    assert len(repo.flags()) == 8 and len(repo.runs("regress")) == 4

    fake.slow["8192x8192 bf16 nf4 bs64"] = 1.05            # a 5% slower kernel, and a new bnb
    calls = len(fake.calls)
    result = run_regress(repo, GPU, measure=fake, env=dict(ENV, bnb="0.51.0"))
    flags = {v.problem: v for v in result.verdicts}
    assert flags["4096x4096 bf16 nf4 bs64"].flag == "ok"
    slow = flags["8192x8192 bf16 nf4 bs64"]
    assert slow.flag == "regression" and "immediate re-measurement" in slow.reason
    assert slow.changes == {"bnb": ["0.50.2", "0.51.0"]}
    assert len(fake.calls) == calls + 3                    # the drop was re-measured at once
    assert result.exit_code == 1
    stored = repo.flags(result.run_id)
    assert {f.flag for f in stored} == {"ok", "regression"}
    assert all(f.measurement_id is not None for f in stored)

    fake.slow.clear()
    fake.broken.add("4096x4096 bf16 nf4 bs64")
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    flags = {v.problem: v.flag for v in result.verdicts}
    assert flags == {"4096x4096 bf16 nf4 bs64": "broken", "8192x8192 bf16 nf4 bs64": "ok"}
    assert result.exit_code == 1


def test_one_slow_measurement_alone_is_only_suspicious(tmp_path):
    repo = _seeded_repo(f"sqlite:///{tmp_path / 'r.db'}")
    fake = FakeMeasure(seed=3)
    for _ in range(4):
        run_regress(repo, GPU, measure=fake, env=ENV)

    first = {"n": 0}

    def once_slow(problem, candidates):
        if problem.label().startswith("8192"):
            first["n"] += 1
            fake.slow[problem.label()] = 1.10 if first["n"] == 1 else 1.0
        return fake(problem, candidates)

    result = run_regress(repo, GPU, measure=once_slow, env=ENV)
    flags = {v.problem: v.flag for v in result.verdicts}
    assert flags["8192x8192 bf16 nf4 bs64"] == "suspicious" and result.exit_code == 0
    fake.slow.clear()
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    assert {v.flag for v in result.verdicts} == {"ok"}


def test_slower_than_bnb_fails_the_night(tmp_path):
    repo = _seeded_repo(f"sqlite:///{tmp_path / 'r.db'}")
    fake = FakeMeasure()
    fake.slow["4096x4096 bf16 nf4 bs64"] = 2.5
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    assert {v.problem: v.flag for v in result.verdicts}["4096x4096 bf16 nf4 bs64"] == "regression-vs-bnb"
    assert result.exit_code == 1
    assert "slower than bnb" in format_regress(result)


def test_regress_cannot_run_without_a_gpu_or_a_database(tmp_path, monkeypatch, capsys):
    from nf4tune.kernel import gpu as gpu_mod

    if not gpu_mod.gpu_available():
        assert cli.main(["regress", "--db", str(tmp_path / "x.db")]) == 2
        assert "cannot run" in capsys.readouterr().err
    monkeypatch.setattr(gpu_mod, "require_gpu", lambda: GPU)
    bad = tmp_path / "not-a-db.db"
    bad.write_text("this is not SQLite")
    assert cli.main(["regress", "--db", str(bad)]) == 2
    assert "cannot run" in capsys.readouterr().err
    assert cli.main(["regress", "--db", str(tmp_path / "missing.db")]) == 2
    assert "no database at" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()
    Repository(connect(str(tmp_path / "empty.db")))
    assert cli.main(["regress", "--db", str(tmp_path / "empty.db")]) == 2
    assert "no stored best config" in capsys.readouterr().err


def test_the_matmul_family_is_judged_against_its_own_history_and_bnb_matmul(tmp_path):
    """A second family goes through the same nightly job: its peer is bnb's matmul_4bit at the
    same batch bucket."""
    from nf4tune.families import MATMUL
    from nf4tune.measure import record

    repo = Repository(connect(f"sqlite:///{tmp_path / 'mm.db'}"))
    run = repo.start_run("search", record.gpu_row(repo, GPU), repo.environment(**ENV))
    mm = Problem((4096, 4096), "bf16", "nf4", 64, "matmul", 8)
    cfg = MATMUL.builtin_default(mm)
    repo.add_measurement(run, mm, dict(label="trial", status="ok", median_us=10.0, samples_us=[10.0]),
                         repo.config(cfg.to_dict(), "th-mm", "matmul"))
    repo.finish_run(run)
    fake = FakeMeasure(seed=7)
    for _ in range(4):
        result = run_regress(repo, GPU, measure=fake, env=ENV)
        assert [(v.problem, v.flag) for v in result.verdicts] == [("matmul 4096x4096 bf16 nf4 bs64 m8", "ok")]
    history = repo.regress_history(GPU.name, mm, "bnb matmul_4bit")
    assert len(history) == 4 and all(h["bnb_us"] for h in history)      # the peer's samples, found by its label
    fake.slow[mm.label()] = 1.06
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    assert result.verdicts[0].flag == "regression" and result.exit_code == 1
    fake.slow[mm.label()] = 2.5
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    assert result.verdicts[0].flag == "regression-vs-bnb"


def test_a_stalled_reference_is_measured_again_and_otherwise_not_judged(tmp_path):
    repo = _seeded_repo(f"sqlite:///{tmp_path / 'r.db'}")
    fake = FakeMeasure(seed=4)
    for _ in range(4):
        run_regress(repo, GPU, measure=fake, env=ENV)
    label = "8192x8192 bf16 nf4 bs64"

    fake.stalls[label] = 1                       # the re-measurement is clean: judged on it
    calls = len(fake.calls)
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    v = {v.problem: v for v in result.verdicts}[label]
    assert v.flag == "ok" and "judged on a re-measurement" in v.reason and len(fake.calls) == calls + 3
    stored = {f.shape: f for f in repo.flags(result.run_id)}
    labels = {m.id: m.label for m in repo.measurements(result.run_id)}
    assert "re-measure: noisy reference" in labels[stored["8192x8192"].measurement_id]
    # the history of that night pairs the judged measurement with the bnb samples measured beside it
    from nf4tune.track.regression import relative_iqr

    night = repo.regress_history(GPU.name, Problem((8192, 8192)), REF_BNB)[-1]
    assert night["run_id"] == result.run_id and relative_iqr(night["bnb_us"]) < 0.05

    fake.stalls[label] = 2                       # both stalled: not judged, not failing
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    v = {v.problem: v for v in result.verdicts}[label]
    assert v.flag == "noisy-reference" and "not judged" in v.reason
    assert result.exit_code == 0 and [x.problem for x in result.not_judged] == [label]
    text = format_regress(result)
    assert "noisy-reference" in text and "relative IQR" in text and "1 not judged (noisy-reference)" in text
    assert "clean" in text.splitlines()[-1]

    fake.stalls[label] = 1                       # --no-remeasure: the stalled night stays not judged
    result = run_regress(repo, GPU, measure=fake, env=ENV, remeasure=False)
    assert {v.problem: v.flag for v in result.verdicts}[label] == "noisy-reference"
    # the nights that were not judged stay out of the baseline: a quiet night is ok again
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    assert {v.flag for v in result.verdicts} == {"ok"}


def test_bnb_timed_from_graphs_from_tonight_on_is_a_new_baseline_not_a_drop(tmp_path):
    repo = _seeded_repo(f"sqlite:///{tmp_path / 'r.db'}")
    fake = FakeMeasure(seed=6)
    for _ in range(4):                          # nights before the harness said how it timed bnb
        assert run_regress(repo, GPU, measure=fake, env=ENV).exit_code == 0
    fake.bnb_timing, fake.bnb_factor = "graph", 0.92    # replays: bnb 8% faster, so a lower speedup
    result = run_regress(repo, GPU, measure=fake, env=ENV)
    assert {v.flag for v in result.verdicts} == {"ok"} and result.exit_code == 0
    text = format_regress(result)
    assert "a new baseline: bnb_timing direct -> graph" in text
    assert "changed since the baseline: bnb_timing: direct -> graph" in text
    history = repo.regress_history(GPU.name, Problem((4096, 4096)), REF_BNB)
    assert [h["bnb_reason"] for h in history][-2:] == ["", "timing: graph"]
    for _ in range(3):
        assert {v.flag for v in run_regress(repo, GPU, measure=fake, env=ENV).verdicts} == {"ok"}
    fake.slow["4096x4096 bf16 nf4 bs64"] = 1.08         # still judged: against the graph-timed nights
    flags = {v.problem: v.flag for v in run_regress(repo, GPU, measure=fake, env=ENV).verdicts}
    assert flags["4096x4096 bf16 nf4 bs64"] == "regression"
