"""The nightly judging maths on synthetic histories."""

import random

from tuner.track.regression import Night, judge, mann_whitney_greater


def _night(rng, tuned=100.0, bnb=180.0, drift=1.0, noise=0.01, reps=25, **kw):
    # machine drift scales both (interleaved), per-sample noise is independent
    return Night(tuned_us=[tuned * drift * rng.gauss(1, noise) for _ in range(reps)],
                 bnb_us=[bnb * drift * rng.gauss(1, noise) for _ in range(reps)],
                 env=kw.pop("env", {"driver": "580", "bnb": "0.50.2"}), sm_clock_mhz=1980, max_sm_clock_mhz=1980,
                 temperature_c=45, **kw)


def _good_history(rng, nights):
    hist = [_night(rng) for _ in range(nights)]
    for n in hist:
        n.verdict = "ok"
    return hist


def _series(rng, nights, slow_from=None, slow=1.05, noisy_night=None, remeasure=False):
    hist = []
    flags = []
    for i in range(nights):
        drift = rng.uniform(0.95, 1.05)                     # night-to-night machine drift
        tuned = 100.0 * (slow if slow_from is not None and i >= slow_from else 1.0)
        noise = 0.06 if i == noisy_night else 0.01
        n = _night(rng, tuned=tuned, drift=drift, noise=noise)
        v = judge(hist, n)
        if v.flag == "suspicious" and remeasure:     # what `nf4-tune regress` does: measure again at once
            v = judge(hist, n, remeasure=_night(rng, tuned=tuned, drift=drift, noise=0.01))
        n.verdict = v.flag
        flags.append(v.flag)
        hist.append(n)
    return flags


def test_thirty_quiet_nights_raise_no_flag():
    for seed in range(20):
        flags = _series(random.Random(seed), 30)
        assert set(flags) == {"ok"}, (seed, flags)


def test_an_injected_five_percent_slowdown_is_a_regression_within_two_nights():
    for seed in range(40):
        for remeasure in (True, False):
            flags = _series(random.Random(seed), 30, slow_from=20, slow=1.05, remeasure=remeasure)
            assert set(flags[:20]) == {"ok"}, (seed, flags)
            assert "regression" in flags[20:22], (seed, remeasure, flags[18:24])


def test_small_drops_are_not_flagged():
    for seed in range(20):
        flags = _series(random.Random(seed), 30, slow_from=10, slow=1.02, remeasure=True)
        assert "regression" not in flags, (seed, flags)


def test_one_noisy_night_alone_is_not_a_regression():
    for seed in range(20):
        for remeasure in (True, False):
            flags = _series(random.Random(seed), 30, noisy_night=15, remeasure=remeasure)
            assert "regression" not in flags, (seed, flags)


def test_immediate_remeasurement_confirms_at_once():
    rng = random.Random(1)
    hist = []
    for _ in range(10):
        n = _night(rng)
        n.verdict = judge(hist, n).flag
        hist.append(n)
    slow = _night(rng, tuned=110.0)
    assert judge(hist, slow).flag == "suspicious"
    assert judge(hist, slow, remeasure=_night(rng, tuned=110.0)).flag == "regression"
    assert judge(hist, slow, remeasure=_night(rng, tuned=100.0)).flag == "suspicious"


def test_broken_slower_than_bnb_and_invalid_environment():
    rng = random.Random(2)
    hist = _good_history(rng, 5)
    assert judge(hist, _night(rng, gate_ok=False)).flag == "broken"
    assert judge(hist, _night(rng, tuned=200.0)).flag == "regression-vs-bnb"
    hot = _night(rng)
    hot.temperature_c = 95
    assert judge(hist, hot).flag == "invalid-environment"
    slow_clock = _night(rng)
    slow_clock.sm_clock_mhz = 1200
    assert judge(hist, slow_clock).flag == "invalid-environment"


def test_changes_between_baseline_and_tonight_are_listed():
    rng = random.Random(3)
    hist = _good_history(rng, 5)
    v = judge(hist, _night(rng, tuned=112.0, env={"driver": "590", "bnb": "0.50.2"}))
    assert v.flag == "suspicious" and v.changes == {"driver": ("580", "590")}


def test_mann_whitney_against_known_cases():
    assert mann_whitney_greater([10, 11, 12, 13, 14], [1, 2, 3, 4, 5]) < 0.01
    assert mann_whitney_greater([1, 2, 3, 4, 5], [10, 11, 12, 13, 14]) > 0.99
    p = mann_whitney_greater([1, 2, 3, 4], [1, 2, 3, 4])
    assert 0.3 < p < 0.7
