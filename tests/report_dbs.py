"""Databases the report tests build: a hostile one (script in every text field a database can
hold), and one with two kernel families, failed and invalid trials, a study whose trials all
failed and a problem measured once."""

from __future__ import annotations

import sqlite3

from nf4tune.db import ENV_FIELDS, Repository, connect
from nf4tune.kernel.gpu import GPUInfo
from nf4tune.track.nightly import run_regress
from nf4tune.vocabulary import Problem

from test_regress_job import BEST, ENV, GPU, FakeMeasure, _seeded_repo

#: what is planted in every text field
EVIL = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
#: what a spreadsheet would run from a CSV cell
FORMULA = '=HYPERLINK("http://example.invalid/x","x")'


def _study(repo, name: str, trials: list, param: str = "vector") -> None:
    """An optuna study with the given trials: (params dict, value or None, reason)."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=repo.db.optuna_storage(), direction="minimize")
    choices = sorted({str(v) for params, _, _ in trials for v in params.values()})
    for params, value, reason in trials:
        dist = {k: CategoricalDistribution(choices) for k in params}
        if value is None:
            t = create_trial(params=params, distributions=dist, state=TrialState.FAIL,
                             user_attrs=dict(status="invalid", reason=reason))
        else:
            t = create_trial(params=params, distributions=dist, value=value)
        study.add_trial(t)


def hostile_database(path) -> str:
    """A database with EVIL in the GPU name, every environment column, the run command, a flag's
    reason, changes and verdict, a study's name and parameter choices and failure reasons, a
    shape, a dtype, a family, measurement labels and reasons, and config knob names and values."""
    url = f"sqlite:///{path}"
    repo = Repository(connect(url))
    gpu = GPUInfo(EVIL, "sm_90", (9, 0), 132, 62914560, 150 << 30, EVIL)
    env = {k: EVIL for k in ENV_FIELDS}
    from nf4tune.measure import record

    run = repo.start_run("search", record.gpu_row(repo, gpu), repo.environment(**env), command=EVIL)
    for shape in ((4096, 4096), (8192, 8192)):
        prob = Problem(shape, "bf16", "nf4", 64)
        repo.add_measurement(run, prob, dict(label="trial", status="ok", median_us=10.0, samples_us=[10.0] * 5,
                                             speedup_vs_bnb=1.9), repo.config(BEST.to_dict(), "th"))
    repo.finish_run(run)
    fake = FakeMeasure(seed=7)
    for night in range(4):
        run_regress(repo, gpu, measure=fake, env=env, command=EVIL)
    fake.slow["8192x8192 bf16 nf4 bs64"] = 1.3
    run_regress(repo, gpu, measure=fake, env=env, command=EVIL)
    # after the nights (the nightly job judges only problems of families it knows)
    run = repo.start_run("bench", record.gpu_row(repo, gpu), repo.environment(**env), command=EVIL)
    evil_knobs = dict(BEST.to_dict(), threads=EVIL, **{EVIL: EVIL})
    for dtype, family in ((EVIL, "dequant"), ("bf16", EVIL)):
        prob = Problem((1024, 1024), dtype, "nf4", 64, family)
        for us in (3.0, 4.0):
            repo.add_measurement(run, prob, dict(label=EVIL, status="ok", reason=EVIL, median_us=us,
                                                 samples_us=[us] * 5), repo.config(dict(evil_knobs, unroll=us), "th"))
        repo.add_measurement(run, prob, dict(label=EVIL, status="invalid", reason=EVIL))
    repo.finish_run(run)
    last = repo.runs("regress")[-1]
    for flag, reason in (("regression", FORMULA), (EVIL, EVIL)):
        repo.add_flag(last, Problem((4096, 4096), "bf16", "nf4", 64),
                      dict(flag=flag, reason=reason, changes={EVIL: [EVIL, EVIL], "config": [EVIL, EVIL]}))
    _study(repo, EVIL, [({"vector": EVIL}, 12.0, ""), ({"vector": "4x4"}, 10.0, ""), ({EVIL: EVIL}, None, EVIL),
                        ({"vector": EVIL}, 11.0, "")])
    _study(repo, "nf4-tune/" + EVIL + "/all-failed", [({"vector": EVIL}, None, EVIL)] * 3)
    repo.db.dispose()
    # a shape that is not ROWSxCOLS can only come from outside the project's own code
    con = sqlite3.connect(path)
    con.execute("UPDATE measurements SET shape = ? WHERE id = (SELECT MIN(id) FROM measurements)", (EVIL,))
    con.execute("UPDATE flags SET shape = ? WHERE id = (SELECT MIN(id) FROM flags)", (EVIL,))
    con.commit()
    con.close()
    return url


def two_family_database(path) -> str:
    """The nightly history of the regression job's tests (quiet nights, then a confirmed
    regression with a new driver), plus a second family's problems ("matmul", unknown to this
    version, peer "bnb matmul_4bit"), one measured once, and studies with failed, invalid and
    slow outlier trials and one whose trials all failed."""
    url = f"sqlite:///{path}"
    repo = _seeded_repo(url)
    fake = FakeMeasure(seed=5)
    for _ in range(4):
        run_regress(repo, GPU, measure=fake, env=ENV)
    fake.slow["8192x8192 bf16 nf4 bs64"] = 1.3
    assert run_regress(repo, GPU, measure=fake, env=dict(ENV, driver="590.0")).exit_code == 1
    from nf4tune.measure import record

    gpu_row = record.gpu_row(repo, GPU)
    knobs = dict(tile_n=128, split_k=1, threads=128, dtype="bf16", quant="nf4")
    for night, m in enumerate((1, 1, 16)):
        run = repo.start_run("search", gpu_row, repo.environment(**ENV), command=f"nf4-tune search --family matmul m{m}")
        prob = Problem((4096, 4096), "bf16", "nf4", 64, "matmul", m)
        us = 20.0 + night
        repo.add_measurement(run, prob, dict(label=f"tile_n=128 m{m}", status="ok", median_us=us,
                                             samples_us=[us] * 9, iqr_us=0.2, speedup_vs_bnb=1.5),
                             repo.config(knobs, "mm", "matmul"))
        repo.add_measurement(run, prob, dict(label="bnb matmul_4bit", status="reference", median_us=30.0,
                                             samples_us=[30.0] * 9, iqr_us=0.3))
        repo.finish_run(run)
    trials = [({"vector": v}, t, "") for v, t in (("4x4", 40.0), ("2x2", 55.0), ("1x1", 6000.0), ("4x4", 41.0))]
    trials += [({"vector": "8x2"}, None, "invalid: shape (4096, 4096): 17 of 16777216 elements differ"),
               ({"vector": "1x8"}, None, "the worker crashed (exit -11) measuring this config")]
    _study(repo, "nf4-tune/NVIDIA H200/4096x4096/bf16/nf4/bs64", trials)
    _study(repo, "nf4-tune/NVIDIA H200/all-failed/bf16/nf4/bs64",
           [({"vector": "16x1"}, None, "invalid: NVRTC: too many resources requested")] * 3)
    repo.db.dispose()
    return url
