"""Search logic on the CPU with a test double for the measurement, against SQLite (and
PostgreSQL when NF4TUNE_TEST_POSTGRES_URL names a server, as .ci/run provides)."""

import multiprocessing as mp
import os

import pytest

from nf4tune.db import Repository, connect
from nf4tune.families import DEQUANT as D
from nf4tune.tune.search import run_search, study_name
from nf4tune.tune.worker import WorkerMeasurer
from nf4tune.vocabulary import Problem

from fakes import FakeMeasurer

GPU = "Fake GPU"


def _setup(url):
    repo = Repository(connect(url))
    gpu = repo.gpu(GPU, "9.0", 132, 10**11, 60 << 20)
    env = repo.environment(project_version="t", git_commit="t", nvrtc="t", driver="t", cuda_python="t", bnb="t",
                           torch="t")
    return repo, repo.start_run("search", gpu, env)


def preset(name, dtype="bf16", quant="nf4"):
    return D.preset(name, dtype=dtype, quant=quant)


def test_search_stores_every_trial_starts_from_presets_and_resumes(db_url):
    url = db_url
    repo, run = _setup(url)
    prob = Problem((4096, 4096))
    bad = preset("bnb-like")
    m = FakeMeasurer(invalid=[bad])
    s1 = run_search(prob, repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m, n_trials=12, seed=1)
    assert s1.trials == 12 and s1.new_trials == 12
    # what is known goes first (the serving table's nearest configs: this fake GPU has none of its own, so other
    # models'), then the built-in default and the presets
    from nf4tune.tune.search import warm_starts

    starts = list(dict.fromkeys(warm_starts(repo, GPU, prob) + [D.builtin_default(prob), preset("blog"), bad]))
    assert len(starts) <= 12 and set(m.calls[:len(starts)]) == set(starts)
    stored = repo.measurements(run.id)
    assert {r.status for r in stored} >= {"ok", "invalid", "reference"}
    assert any(r.reason == "planted mismatch" for r in stored)
    # resume: the same study continues to 20 trials, nothing measured twice
    s2 = run_search(prob, repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m, n_trials=20, seed=1)
    assert s2.trials == 20 and s2.new_trials == 8
    assert s2.best_us <= s1.best_us
    assert len(m.calls) == len(set(m.calls)) == s1.measured + s2.measured
    import optuna

    study = optuna.load_study(study_name=study_name(GPU, prob), storage=url)
    assert len(study.trials) == 20
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed and failed[0].user_attrs["reason"] == "planted mismatch"


def test_known_configs_are_not_measured_again_unless_remeasure(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    repo, run = _setup(url)
    m = FakeMeasurer()
    run_search(Problem((512, 512)), repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m, n_trials=5,
               sampler="random", seed=3)
    first = list(m.calls)
    # a second study on the same problem (another name would be a new study): drop and re-run
    import optuna

    optuna.delete_study(study_name=study_name(GPU, Problem((512, 512))), storage=url)
    m2 = FakeMeasurer()
    s = run_search(Problem((512, 512)), repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m2,
                   n_trials=5, sampler="random", seed=3)
    assert m2.calls == [] and s.measured == 0        # same seed, same configs: all from the database
    optuna.delete_study(study_name=study_name(GPU, Problem((512, 512))), storage=url)
    m3 = FakeMeasurer()
    run_search(Problem((512, 512)), repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m3, n_trials=5,
               sampler="random", seed=3, remeasure=True)
    assert m3.calls == first


def test_nearest_tuned_problem_seeds_a_new_study(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    repo, run = _setup(url)
    m = FakeMeasurer()
    s = run_search(Problem((8192, 8192)), repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m,
                   n_trials=15, seed=0)
    m2 = FakeMeasurer()
    run_search(Problem((8192, 4096)), repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m2, n_trials=3,
               seed=0)
    assert m2.calls[0] == s.best_config


def test_grid_sampler_walks_the_space_without_invalid_points(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    repo, run = _setup(url)
    m = FakeMeasurer()
    s = run_search(Problem((256, 256)), repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m,
                   n_trials=40, sampler="grid", seed=0)
    assert s.trials == 40 and len(set(m.calls)) == len(m.calls)


def _worker(url, n, seed):
    repo = Repository(connect(url))
    run = repo.runs()[0]
    run_search(Problem((1024, 1024)), repo=repo, storage_url=url, gpu_name=GPU, run=run,
               measurer=FakeMeasurer(delay_s=0.02), n_trials=n, seed=seed)


def test_two_workers_share_one_study(db_url):
    url = db_url
    repo, run = _setup(url)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(url, 24, seed)) for seed in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    import optuna

    study = optuna.load_study(study_name=study_name(GPU, Problem((1024, 1024))), storage=url)
    numbers = [t.number for t in study.trials]
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(numbers) == len(set(numbers))                  # no trial repeated
    assert 24 <= len(finished) <= 25                          # none lost (one may overshoot by a worker)
    # none left running (a refinement one worker queued as the other finished the last trial
    # may stay WAITING: the next resume takes it first)
    assert [t.number for t in study.trials if t.state == optuna.trial.TrialState.RUNNING] == []
    # and no config measured twice: one worker queued the starts, each queued trial was taken
    # once, and a config the other worker was measuring was waited for
    measured = [m.config_id for m in repo.measurements(run.id) if m.config_id]
    assert measured and len(measured) == len(set(measured))


@pytest.mark.parametrize("target, reason", [
    ("fakes:worker_crash", "worker died"),
    ("fakes:worker_hang", "hang"),
    ("fakes:worker_raise", "illegal memory access"),
])
def test_worker_faults_become_invalid_trials_and_the_worker_restarts(target, reason, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    w = WorkerMeasurer(target=target, task_timeout_s=5)
    try:
        out = w.measure(Problem((64, 64)), preset("blog"))
        assert out.status == "invalid" and reason in out.reason
        w.target = "fakes:worker_ok"
        ok = w.measure(Problem((64, 64)), preset("blog"))
        assert ok.status == "ok" and w.restarts >= 1
    finally:
        w.close()


def test_local_refinement_reaches_the_optimum_next_to_the_best(tmp_path):
    """The last third of the trials walks one knob at a time from the best: with a synthetic
    time whose optimum is a few steps from the starting points, 30 trials find it exactly."""
    from fakes import synthetic_us

    url = f"sqlite:///{tmp_path / 'r.db'}"
    repo, run = _setup(url)
    m = FakeMeasurer()
    s = run_search(Problem((4096, 4096)), repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m,
                   n_trials=30, seed=3)
    best = min(D.iter_space(dtype=["bf16"], quant=["nf4"]), key=synthetic_us)
    assert s.best_config == best, (s.best_config, best)
    c = preset("blog")
    ns = D.neighbours(c)
    assert c not in ns and len(ns) == len(set(ns)) and all(n.dtype == c.dtype for n in ns)
    assert c.replace(threads=128) in ns and c.replace(store="streaming") in ns


def test_the_default_worker_target_resolves_to_the_real_measurement():
    """The worker imports its target by name: a stale module path would make every trial of a
    real search 'worker died' (the module moved in the layer restructure)."""
    from nf4tune.tune import worker

    fn = worker._resolve(worker.DEFAULT_TARGET)
    assert fn is worker.measure_on_gpu


def _stalling_search(url, marker, n):
    repo = Repository(connect(url))
    run = repo.runs()[0]
    from fakes import StallingMeasurer

    run_search(Problem((2048, 2048)), repo=repo, storage_url=url, gpu_name=GPU, run=run,
               measurer=StallingMeasurer(marker, stall_at=5), n_trials=n, seed=4)


def _wait_for(predicate, timeout_s, what):
    import time

    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_killed_search_loses_no_finished_trial_and_leaves_none_running(tmp_path, monkeypatch):
    """SIGKILL a search in the middle of a trial (its heartbeat recorded), wait past the grace
    period, resume: every COMPLETE trial is still there with its value, the killed trial is
    FAIL, none is RUNNING, and the study reaches its trial count."""
    import signal
    import time

    import optuna
    from optuna.trial import TrialState

    from nf4tune.tune.search import heartbeat_settings

    monkeypatch.setenv("NF4TUNE_HEARTBEAT_S", "1")
    monkeypatch.setenv("NF4TUNE_GRACE_S", "2")
    assert heartbeat_settings() == (1, 2)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    repo, run = _setup(url)
    marker = tmp_path / "stalled"
    name = study_name(GPU, Problem((2048, 2048)))
    p = mp.get_context("spawn").Process(target=_stalling_search, args=(url, str(marker), 12))
    p.start()
    try:
        _wait_for(marker.exists, 120, "the fifth trial")
        storage = optuna.storages.RDBStorage(url)

        def trials():
            return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)

        def running():
            return [t for t in trials() if t.state == TrialState.RUNNING]

        _wait_for(lambda: len(running()) == 1, 10, "a running trial")
        time.sleep(1.5)                                   # a heartbeat is on record
        before = {t.number: t.value for t in trials() if t.state == TrialState.COMPLETE}
        killed = [t.number for t in running()]
        assert len(before) == 4 and len(killed) == 1
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
    finally:
        if p.is_alive():
            p.kill()
    assert [t.number for t in running()] == killed        # left RUNNING by the dead worker
    time.sleep(2.5)                                       # past the grace period
    m = FakeMeasurer()
    s = run_search(Problem((2048, 2048)), repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m,
                   n_trials=12, seed=4)
    after = {t.number: t for t in trials()}
    assert s.stale_failed == killed and after[killed[0]].state == TrialState.FAIL
    assert {n: after[n].value for n in before} == before             # no finished trial lost
    assert [t.number for t in after.values() if t.state == TrialState.RUNNING] == []
    assert s.trials == 12 and len([t for t in after.values() if t.state.is_finished()]) == 12
    assert s.new_trials == 12 - len(before) - 1 and m.calls              # the rest run on resume


def test_heartbeat_settings_are_checked(monkeypatch):
    from nf4tune.tune.search import GRACE_S, HEARTBEAT_S, heartbeat_settings

    monkeypatch.delenv("NF4TUNE_HEARTBEAT_S", raising=False)
    monkeypatch.delenv("NF4TUNE_GRACE_S", raising=False)
    assert heartbeat_settings() == (HEARTBEAT_S, GRACE_S)
    for beat, grace, message in (("0", "5", "at least 1"), ("1.5", "5", "whole number"), ("5", "5", "longer")):
        monkeypatch.setenv("NF4TUNE_HEARTBEAT_S", beat)
        monkeypatch.setenv("NF4TUNE_GRACE_S", grace)
        with pytest.raises(ValueError, match=message):
            heartbeat_settings()


def test_of_workers_opening_a_fresh_study_at_once_exactly_one_queues_the_starts(db_url):
    # workers that finish one problem together reach the next problem's fresh study together;
    # each used to see it empty and queue (then measure) every start point
    import threading

    import optuna

    from nf4tune.tune.search import _open_study, _storage

    _setup(db_url)
    name = study_name(GPU, Problem((2048, 1024)))
    space = {k: optuna.distributions.CategoricalDistribution(v) for k, v in D.search_space(Problem((2048, 1024))).items()}
    barrier, results = threading.Barrier(4), []

    def open_it():
        storage = _storage(db_url)
        barrier.wait()
        results.append(_open_study(name, storage, optuna.samplers.RandomSampler(seed=0), space))

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4 and sorted(created for _, created in results) == [False, False, False, True]
    assert len({study._study_id for study, _ in results}) == 1
    assert len(optuna.get_all_study_names(storage=db_url)) == 1


def test_a_config_another_worker_is_measuring_is_waited_for_not_measured_twice(tmp_path, monkeypatch):
    import threading
    import time

    import optuna
    from optuna.trial import TrialState

    from nf4tune.tune.search import _storage, _wait_for_twin, fail_stale_trials

    monkeypatch.setenv("NF4TUNE_HEARTBEAT_S", "1")
    monkeypatch.setenv("NF4TUNE_GRACE_S", "2")
    storage = _storage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(study_name="twins", storage=storage)
    dist = {"x": optuna.distributions.CategoricalDistribution([1, 2, 3, 4, 5])}
    for x in (1, 1, 2, 3, 3, 4, 4, 5, 5):     # two workers queued the same refinements
        study.enqueue_trial({"x": x})

    def take():         # what a worker does: ask, first heartbeat, claim
        t = study.ask(dist)
        storage.record_heartbeat(t._trial_id)
        t.set_user_attr("config", f"x={t.params['x']}")
        return t

    first, second, other, dead, late = (take() for _ in range(5))
    assert [t.params["x"] for t in (first, second, other, dead, late)] == [1, 1, 2, 3, 3]
    assert _wait_for_twin(study, first.number, 2) is None and _wait_for_twin(study, other.number, 2) is None

    # the one that started first measures; its twin waits for it to finish
    threading.Timer(0.4, lambda: study.tell(first, 1.5)).start()
    t0 = time.perf_counter()
    assert _wait_for_twin(study, second.number, 2) == first.number
    assert time.perf_counter() - t0 >= 0.35
    assert study.get_trials(deepcopy=False)[first.number].state == TrialState.COMPLETE

    # the twin's worker died (heartbeats stopped): it is failed as stale and the wait ends
    t0 = time.perf_counter()
    assert _wait_for_twin(study, late.number, 2) == dead.number
    assert time.perf_counter() - t0 < 15
    assert study.get_trials(deepcopy=False)[dead.number].state == TrialState.FAIL

    # the start decides, not the number: the higher-numbered twin taken first measures, and the
    # lower-numbered one taken after it waits (a worker may check before its twin is taken)
    low, high = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING][:2]
    assert low.number < high.number and low.system_attrs["fixed_params"] == high.system_attrs["fixed_params"]
    storage.set_trial_state_values(high._trial_id, TrialState.RUNNING)
    assert optuna.trial.Trial(study, high._trial_id).suggest_categorical("x", [1, 2, 3, 4, 5]) == 4   # its queued x
    storage.set_trial_user_attr(high._trial_id, "config", "x=4")
    time.sleep(0.01)
    taken = take()
    assert taken.number == low.number and taken.params["x"] == 4
    assert _wait_for_twin(study, high.number, 2) is None
    threading.Timer(0.3, lambda: storage.set_trial_state_values(high._trial_id, TrialState.FAIL)).start()
    assert _wait_for_twin(study, low.number, 2) == high.number

    # a worker that died between its ask and its first heartbeat left a trial with no heartbeat to
    # age: it is waited for while young (its worker may be about to claim it), then passed over
    unclaimed = study.ask(dist)
    asked = time.perf_counter()
    assert unclaimed.params["x"] == 5
    twin = take()
    t0 = time.perf_counter()
    assert _wait_for_twin(study, twin.number, 1.0) == unclaimed.number
    assert 0.5 <= time.perf_counter() - t0 < 5
    assert study.get_trials(deepcopy=False)[unclaimed.number].state == TrialState.RUNNING
    # ... and once it is older than the grace period it is failed as stale, as a dead worker's
    # trial with a heartbeat is; a trial just asked (its worker about to claim it) is left alone
    # (the grace period is the storage's, NF4TUNE_GRACE_S = 2 here, not the 20 s default)
    young = study.ask(dist)
    assert young.number not in fail_stale_trials(study)
    time.sleep(max(0.0, 2.1 - (time.perf_counter() - asked)))
    assert unclaimed.number in fail_stale_trials(study)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[unclaimed.number] == TrialState.FAIL and states[young.number] == TrialState.RUNNING


def test_workers_popping_queued_trials_at_once_never_take_the_same_one(db_url):
    # optuna pops a queued trial by reading WAITING, then writing RUNNING; on SQLite two workers
    # used to both read WAITING and both take (and measure) the trial (about a quarter of the
    # pops of four workers here)
    import collections
    import threading

    import optuna

    from nf4tune.tune.search import _storage

    _setup(db_url)
    study = optuna.create_study(study_name="queue", storage=_storage(db_url))
    for i in range(60):
        study.enqueue_trial({"x": i})
    dist = {"x": optuna.distributions.IntDistribution(0, 1000)}
    taken, lock, barrier = collections.Counter(), threading.Lock(), threading.Barrier(4)

    def work():
        mine = optuna.load_study(study_name="queue", storage=_storage(db_url))
        barrier.wait()
        for _ in range(15):
            t = mine.ask(dist)
            with lock:
                taken[t.number] += 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(taken.values()) == 60 and [n for n, c in taken.items() if c > 1] == []
    assert sorted(taken) == list(range(60))      # every queued trial taken once, none made anew


def test_a_study_of_an_older_search_space_is_continued_in_a_study_of_the_current_one(tmp_path, monkeypatch):
    """A family whose space changed (a knob value added) cannot add trials to a study begun under the
    old space (optuna: 'CategoricalDistribution does not support dynamic value space'). The old study
    keeps its trials; the search goes on in the current space's own study, started from the best
    config measured so far, and resuming finds that study again."""
    import optuna

    from nf4tune.tune.search import load_study, space_study_name

    url = f"sqlite:///{tmp_path / 's.db'}"
    repo, run = _setup(url)
    prob = Problem((2048, 2048))
    current = D.search_space(prob)
    param = next(k for k, v in current.items() if len(v) > 2)
    older = {**current, param: current[param][:-1]}          # the space before its last choice was added
    monkeypatch.setattr(D, "search_space", lambda problem, experimental=False: older)
    s1 = run_search(prob, repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=FakeMeasurer(), n_trials=6,
                    seed=2)
    monkeypatch.undo()
    name = study_name(GPU, prob)
    assert s1.study == name
    m = FakeMeasurer()
    with pytest.warns(UserWarning, match="another search space"):
        s2 = run_search(prob, repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m, n_trials=4, seed=2)
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in current.items()}
    assert s2.study == space_study_name(name, dists) != name and s2.trials == 4
    assert len(optuna.load_study(study_name=name, storage=url).trials) == 6          # the old trials stay
    new = optuna.load_study(study_name=s2.study, storage=url)
    assert new.trials[0].user_attrs["config"] == s1.best_config.to_json()            # started from the best
    assert load_study(prob, storage_url=url, gpu_name=GPU).study_name == s2.study
    s3 = run_search(prob, repo=repo, storage_url=url, gpu_name=GPU, run=run, measurer=m, n_trials=6, seed=2)
    assert s3.study == s2.study and s3.trials == 6 and s3.new_trials == 2            # resumed, not forked again
