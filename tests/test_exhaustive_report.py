"""The exhaustive screen's report keeps why each failing config failed, and groups alike reasons."""
from nf4tune.tune.exhaustive import ExhaustiveReport


def test_failure_reasons_group_reasons_that_differ_only_in_numbers():
    rep = ExhaustiveReport(problem={}, screened=5, failed=4, screen_seconds=0.1, failures={
        "a": "UnsupportedInput: a window of 128 values spans 2 block(s) of 64, the variant is built for span 1",
        "b": "UnsupportedInput: a window of 128 values spans 2 block(s) of 64, the variant is built for span 1",
        "c": "UnsupportedInput: 262144 bytes of dynamic shared memory exceed the device's 232448 per block",
        "d": "UnsupportedInput: 524288 bytes of dynamic shared memory exceed the device's 232448 per block",
        "e": "CUDAError: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    })
    reasons = rep.failure_reasons()
    assert [n for n, _ in reasons] == [2, 2, 1]
    assert reasons[-1][1] == "CUDAError: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    assert {r for _, r in reasons[:2]} >= {rep.failures["a"]}
    assert rep.to_dict()["failures"] == rep.failures


def test_no_failures_no_reasons():
    assert ExhaustiveReport(problem={}, screened=1, failed=0, screen_seconds=0.0).failure_reasons() == []
