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
