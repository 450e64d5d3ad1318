"""The nightly judging maths on synthetic histories."""

import random

from nf4tune.track.regression import Night, judge, mann_whitney_greater


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


# -- noisy references ------------------------------------------------------------------------
def _stall_night(rng, spread="uniform", **kw):
    """A night on which a host stall hit bnb's calls: its samples up to 2.8x, widely spread; the
    tuned kernel's samples as usual."""
    n = _night(rng, **kw)
    if spread == "uniform":
        n.bnb_us = [180.0 * rng.uniform(1.0, 2.8) for _ in range(25)]
    else:                                   # the whole measurement slow but for 2 repetitions
        n.bnb_us = [180.0 * f * rng.gauss(1, 0.02) for f in [2.8] * 23 + [1.0] * 2]
        rng.shuffle(n.bnb_us)
    return n


def test_a_stall_night_is_a_noisy_reference_not_judged_and_not_failing():
    from nf4tune.vocabulary import FAILING_FLAGS, NOISY_REFERENCE

    for seed in range(20):
        rng = random.Random(seed)
        hist = _good_history(rng, 8)
        for spread in ("uniform", "bimodal"):
            v = judge(hist, _stall_night(rng, spread))
            assert v.flag == NOISY_REFERENCE, (seed, spread, v)
            assert v.flag not in FAILING_FLAGS and "not judged" in v.reason
            # a wide spread is caught by the spread; most repetitions slow, by the speedup's jump
            assert ("relative IQR" if spread == "uniform" else "whole measurement") in v.reason, v.reason
            assert v.drop is None and v.threshold is None          # no drop was computed
        # the same stall with a slow tuned kernel is still not judged ...
        assert judge(hist, _stall_night(rng, tuned=110.0)).flag == NOISY_REFERENCE
        # ... but a broken gate is never hidden by it
        assert judge(hist, _stall_night(rng, gate_ok=False)).flag == "broken"


def test_quiet_and_merely_noisy_nights_are_never_a_noisy_reference():
    for seed in range(20):
        rng = random.Random(seed)
        hist = []
        for i in range(30):
            noise = 0.05 if i % 7 == 3 else 0.01          # a 5%-noise night: wide, but not a stall
            n = _night(rng, drift=rng.uniform(0.95, 1.05), noise=noise)
            n.verdict = judge(hist, n).flag
            assert n.verdict != "noisy-reference", (seed, i)
            hist.append(n)


def test_a_new_bnb_or_config_that_moves_the_speedup_is_judged():
    """A speedup far over the baseline with another bnb (or another config) is a real change,
    judged as usual, not a disturbed reference."""
    rng = random.Random(9)
    hist = _good_history(rng, 6)
    assert judge(hist, _night(rng, bnb=400.0)).flag == "noisy-reference"
    assert judge(hist, _night(rng, bnb=400.0, env={"driver": "580", "bnb": "0.51.0"})).flag == "ok"


def test_the_noise_limit_follows_the_history():
    rng = random.Random(5)
    # a reference that is always noisy (about 11% relative IQR): 12% tonight is within 3x of that
    hist = [_night(rng, noise=0.08) for _ in range(6)]
    for n in hist:
        n.verdict = "ok"
    assert judge(hist, _night(rng, noise=0.09)).flag != "noisy-reference"
    # without a baseline only the absolute limit applies
    assert judge([], _stall_night(rng)).flag == "noisy-reference"
    assert judge([], _night(rng, noise=0.05)).flag == "ok"


def test_a_noisy_night_between_two_drops_does_not_reset_the_confirmation():
    rng = random.Random(7)
    hist = _good_history(rng, 10)
    first = _night(rng, tuned=110.0)
    first.verdict = judge(hist, first).flag
    assert first.verdict == "suspicious"
    stall = _stall_night(rng, tuned=110.0)
    stall.verdict = judge(hist + [first], stall).flag
    assert stall.verdict == "noisy-reference"
    assert judge(hist + [first, stall], _night(rng, tuned=110.0)).flag == "regression"


def test_flags_are_ordered_mildest_first():
    from nf4tune.track.regression import NOT_JUDGED
    from nf4tune.vocabulary import FAILING_FLAGS, FLAGS, NOISY_REFERENCE

    assert FLAGS[0] == "ok" and NOISY_REFERENCE in FLAGS
    assert FLAGS[-len(FAILING_FLAGS):] == FAILING_FLAGS          # failing verdicts last
    assert set(NOT_JUDGED) <= set(FLAGS)
    assert max(FLAGS.index(f) for f in NOT_JUDGED) < FLAGS.index("suspicious")


def test_a_change_of_how_bnb_is_timed_starts_a_new_baseline():
    """bnb timed from CUDA-graph replays runs faster than bnb timed by direct calls (no launch
    gaps): against a baseline timed the old way that would read as an 8% lower speedup."""
    rng = random.Random(11)
    hist = _good_history(rng, 6)
    for n in hist:
        n.env["bnb_timing"] = "direct"
    graphed = dict(driver="580", bnb="0.50.2", bnb_timing="graph")
    first = _night(rng, bnb=180.0 * 0.92, env=dict(graphed))
    assert judge(hist, _night(rng, bnb=180.0 * 0.92, env=dict(graphed, bnb_timing="direct"))).flag == "suspicious"
    v = judge(hist, first)
    assert v.flag == "ok" and "a new baseline: bnb_timing direct -> graph" in v.reason
    assert v.changes == {"bnb_timing": ("direct", "graph")}
    first.verdict = v.flag
    hist.append(first)
    for _ in range(3):
        n = _night(rng, bnb=180.0 * 0.92, env=dict(graphed))
        n.verdict = judge(hist, n).flag
        assert n.verdict == "ok"
        hist.append(n)
    # judged against the nights timed the same way: a real slowdown is still caught
    assert judge(hist, _night(rng, tuned=110.0, bnb=180.0 * 0.92, env=dict(graphed))).flag == "suspicious"
