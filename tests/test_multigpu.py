"""`nf4-tune search --gpus`: one measuring worker per GPU against the shared studies, on the CPU
with a child target that measures with a test double (the process plumbing, the database and
the search code are the real ones)."""

import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from nf4tune import cli
from nf4tune.tune import multigpu
from nf4tune.tune.multigpu import devices_for, parse_gpus, search_on_gpus
from nf4tune.tune.search import study_name
from nf4tune.vocabulary import Problem

TESTS = str(Path(__file__).resolve().parent)


@pytest.fixture
def child_path(monkeypatch):
    """The children import the test doubles from tests/."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def start_together(tmp_path, monkeypatch):
    """The two fake workers start measuring together (see fakes._wait_for_the_other_workers)."""
    folder = tmp_path / "barrier"
    folder.mkdir()
    monkeypatch.setenv("NF4TUNE_TEST_START_BARRIER", f"{folder}:2")


def _trials(url, problem):
    return optuna.load_study(study_name=study_name("Fake GPU", problem), storage=url).get_trials(deepcopy=False)


def test_two_gpu_workers_fill_the_shared_studies_with_distinct_trials(tmp_path, child_path, start_together):
    url = f"sqlite:///{tmp_path / 'multi.db'}"
    problems = [Problem((1024, 1024)), Problem((2048, 1024))]
    lines = []
    result = search_on_gpus(problems, [(0, "0"), (1, "1")], url=url, n_trials=16, seed=1,
                            target="fakes:fake_gpu_search", progress=lines.append, child_timeout_s=240)
    assert result.failed == [] and [c.gpu for c in result.children] == [0, 1]
    for prob in problems:
        trials = _trials(url, prob)
        finished = [t for t in trials if t.state.is_finished()]
        assert 16 <= len(finished) <= 17                       # one may overshoot per extra worker
        assert [t for t in trials if t.state == TrialState.RUNNING] == []
        assert len({t.number for t in trials}) == len(trials)
        workers = {t.user_attrs.get("worker") for t in finished}
        assert workers == {"gpu0", "gpu1"}, workers          # both GPUs contributed to every study
    # each worker measured its share under its own run, and no config was measured twice: one
    # worker queues the start points, a queued trial is taken by one worker, and a config the
    # other worker is measuring is waited for and served from the database
    from nf4tune.db import Repository, connect

    repo = Repository(connect(url))
    runs = repo.runs("search")
    assert len(runs) == 2
    for prob in problems:
        per_run = [{m.config_id for m in repo.measurements(r.id) if m.config_id and m.shape == prob.shape_text}
                   for r in runs]
        print(prob.label(), [len(x) for x in per_run], len(per_run[0] & per_run[1]))
        assert all(per_run) and per_run[0].isdisjoint(per_run[1]), (prob.label(), per_run[0] & per_run[1])
    assert sum(c.new_trials for c in result.children) >= 32
    assert any(line.startswith("[gpu 0] ") for line in lines) and any(line.startswith("[gpu 1] ") for line in lines)
    assert result.seconds > 0 and all(c.seconds > 0 for c in result.children)
    assert "2 problem(s) on 2 GPU(s) in" in result.timing_line()


def test_parse_and_map_gpus():
    assert parse_gpus("all") == "all" and parse_gpus("0,1") == [0, 1] and parse_gpus(" 3 ") == [3]
    for bad in ("", "0,0", "-1", "0,x", "1.5", "0,,1"):
        with pytest.raises(ValueError):
            parse_gpus(bad)
    assert devices_for("all", 2) == [(0, "0"), (1, "1")]
    assert devices_for([1], 2, env_visible="5,7") == [(1, "7")]        # indices count the visible GPUs
    with pytest.raises(LookupError, match="no CUDA GPU"):
        devices_for("all", 0)
    with pytest.raises(LookupError, match="GPU 2, but 2 GPU"):
        devices_for([0, 2], 2)


def test_cli_gpus_is_checked_before_any_work(tmp_path, capsys, monkeypatch):
    db = tmp_path / "never.db"
    for value in ("0,0", "x", "-1"):
        with pytest.raises(SystemExit) as e:
            cli.main(["search", "--shape", "64x64", "--gpus", value, "--db", str(db)])
        assert e.value.code == 2
        assert "--gpus" in capsys.readouterr().err
    from nf4tune.kernel import gpu as gpu_mod

    monkeypatch.setattr(gpu_mod, "visible_gpu_count", lambda: 0)
    assert cli.main(["search", "--shape", "64x64", "--gpus", "all", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "cannot run: no CUDA GPU is visible" in err and err.count("\n") == 1
    monkeypatch.setattr(gpu_mod, "visible_gpu_count", lambda: 2)
    assert cli.main(["search", "--shape", "64x64", "--gpus", "0,3", "--db", str(db)]) == 2
    assert "GPU 3, but 2 GPU(s) are visible" in capsys.readouterr().err
    assert not db.exists()


def test_cli_gpus_runs_a_worker_per_gpu_and_fails_when_one_fails(tmp_path, capsys, monkeypatch, child_path,
                                                                 start_together):
    from nf4tune.kernel import gpu as gpu_mod

    monkeypatch.setattr(gpu_mod, "visible_gpu_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(multigpu, "DEFAULT_CHILD", "fakes:fake_gpu_search")
    db = tmp_path / "cli.db"
    assert cli.main(["search", "--shape", "512x512", "--trials", "10", "--gpus", "all", "--db", str(db)]) == 0
    out, err = capsys.readouterr()
    assert "512x512 bf16 nf4 bs64" in out and "[gpu 0] " in err and "[gpu 1] " in err
    assert "1 problem(s) on 2 GPU(s) in" in err
    finished = [t for t in _trials(f"sqlite:///{db}", Problem((512, 512))) if t.state.is_finished()]
    assert len(finished) >= 10 and {t.user_attrs["worker"] for t in finished} == {"gpu0", "gpu1"}

    monkeypatch.delenv("NF4TUNE_TEST_START_BARRIER")             # GPU 1 fails before it would start
    monkeypatch.setattr(multigpu, "DEFAULT_CHILD", "fakes:fake_gpu_search_failing_on_1")
    assert cli.main(["search", "--shape", "256x512", "--trials", "6", "--gpus", "0,1", "--db", str(db),
                     "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "the worker on GPU 1 (CUDA_VISIBLE_DEVICES=1) exited with 1" in err and "illegal memory access" in err
    assert "256x512 bf16 nf4 bs64" in out                      # GPU 0 finished the study alone
