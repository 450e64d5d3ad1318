"""`bench --search-quality` on the CPU with the fake measurer: two searches per problem from fresh databases,
their bests compared."""

from nf4tune.kernel.gpu import GPUInfo
from nf4tune.tune.quality import best_after, format_quality, search_quality
from nf4tune.vocabulary import Problem

from fakes import FakeMeasurer


def test_best_after_skips_failed_trials():
    assert best_after([5.0, None, 3.0, 4.0], 2) == (5.0, 0)
    assert best_after([5.0, None, 3.0, 4.0], 4) == (3.0, 2)
    assert best_after([None, None], 2) == (None, None)


def test_a_short_and_a_long_search_from_fresh_databases(tmp_path):
    gpu = GPUInfo("Fake GPU", "sm_90", (9, 0), 132, 60 << 20, 10**11, "t")
    prob = Problem((2048, 2048))
    rows = search_quality([prob], gpu=gpu, short=6, long=14, seed=3, measurer=FakeMeasurer())
    (r,) = rows
    assert r.short == 6 and r.long == 14 and r.long_best_us <= r.short_best_us
    assert r.ratio >= 1.0 and 1 <= r.found_at <= 14
    text = format_quality(rows)
    assert "2048x2048 bf16 nf4 bs64" in text and ("met" in text or "MISSED" in text)


def test_what_a_user_gets_without_searching_is_measured_beside_the_searches():
    """The runtime's and autotuning's picks are measured with the searches' measurer, each compared with the
    long search's best under its own target; where bnb serves, nothing is measured."""
    from nf4tune.families import get as get_family
    from nf4tune.tune.quality import TARGETS, format_row

    gpu = GPUInfo("Fake GPU", "sm_90", (9, 0), 132, 60 << 20, 10**11, "t")
    prob = Problem((2048, 2048))
    family = get_family("dequant")
    default = family.config()
    measurer = FakeMeasurer()
    seen = []

    def alternatives(p):
        assert p == prob
        return [("transfer", default, "from a neighbour"), ("autotune", None, "none beat bnb")]

    rows = search_quality([prob], gpu=gpu, short=4, long=8, seed=1, measurer=measurer,
                          alternatives=alternatives, on_row=seen.append)
    (r,) = rows
    assert seen == rows
    t, a = r.alternatives
    assert t.name == "transfer" and t.config == default.short() and t.bnb_us == 300.0
    assert t.median_us is not None and measurer.calls.count(default) >= 1
    assert a.config is None and a.median_us is None
    ratio = r.over_long(t.median_us)
    assert ratio == t.median_us / r.long_best_us
    lines = format_row(r).splitlines()
    assert len(lines) == 4 and "bnb serves" in lines[3]
    expect = "met" if ratio <= 1 + TARGETS["transfer"] and t.median_us < 300.0 else "MISSED"
    assert f" {expect} " in lines[2] and default.short() in lines[2]


def test_an_alternative_the_gate_refuses_says_so():
    from nf4tune.families import get as get_family
    from nf4tune.tune.quality import format_row

    gpu = GPUInfo("Fake GPU", "sm_90", (9, 0), 132, 60 << 20, 10**11, "t")
    prob = Problem((2048, 2048))
    bad = get_family("dequant").config(threads=128)
    rows = search_quality([prob], gpu=gpu, short=3, long=5, seed=2, measurer=FakeMeasurer(invalid=[bad]),
                          alternatives=lambda p: [("exact", bad, "tuned")])
    (a,) = rows[0].alternatives
    assert a.median_us is None and a.note.startswith("invalid: planted mismatch")
    assert "MISSED" not in format_row(rows[0]).splitlines()[2]
