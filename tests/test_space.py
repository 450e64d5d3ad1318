import json

import pytest

from tuner import space as S


def test_count_matches_iteration():
    assert S.space_size() == sum(1 for _ in S.iter_space())
    assert S.space_size(["bf16"], ["nf4"]) * 6 == S.space_size()


def test_every_knob_value_is_reachable():
    seen = {k: set() for k in S.KNOBS}
    for c in S.iter_space(["bf16"], ["nf4"]):
        for k in S.KNOBS:
            seen[k].add(getattr(c, k))
    for k, values in S.KNOBS.items():
        if k in ("dtype", "quant"):
            continue
        assert seen[k] == set(values), k


def test_config_is_frozen_hashable_and_round_trips():
    c = S.KernelConfig(bytes_per_thread=8, threads=128, unroll=2, lut="register", index="div",
                       store="streaming", grid="persistent", ctas_per_sm=4, dtype="fp16", quant="fp4")
    assert S.KernelConfig.from_json(c.to_json()) == c
    assert hash(S.KernelConfig.from_json(c.to_json())) == hash(c)
    assert json.loads(c.to_json())["ctas_per_sm"] == 4
    with pytest.raises(Exception):
        c.threads = 64  # frozen
    assert len({c, S.KernelConfig.from_dict(c.to_dict())}) == 1


@pytest.mark.parametrize("bad, match", [
    (dict(bytes_per_thread=3), "bytes_per_thread"),
    (dict(threads=96), "threads"),
    (dict(lut="texture"), "lut"),
    (dict(bytes_per_thread=16, unroll=2), "in flight"),
    (dict(grid="persistent"), "ctas_per_sm"),
    (dict(grid="oneshot", ctas_per_sm=2), "persistent grid only"),
    (dict(grid="persistent", ctas_per_sm=4, threads=1024), "resident"),
    (dict(threads=True), "threads"),
])
def test_constraints_rule_points_out(bad, match):
    with pytest.raises(S.InvalidConfig, match=match):
        S.KernelConfig(**bad)


def test_unknown_knob_and_bad_json():
    with pytest.raises(S.InvalidConfig, match="unknown"):
        S.KernelConfig.from_dict({"warps": 4})
    with pytest.raises(S.InvalidConfig, match="JSON"):
        S.KernelConfig.from_json("{not json")


def test_presets_are_points_of_the_space():
    blog = S.preset("blog")
    assert (blog.bytes_per_thread, blog.threads, blog.lut, blog.index) == (4, 256, "shared", "shift")
    bnb = S.preset("bnb-like", "fp16", "fp4")
    assert (bnb.bytes_per_thread, bnb.threads, bnb.lut) == (8, 64, "global")
    space = set(S.iter_space(["bf16", "fp16"], ["nf4", "fp4"]))
    assert blog in space and bnb in space
    with pytest.raises(S.InvalidConfig):
        S.preset("fastest")


def test_distinct_sources_ignore_launch_knobs():
    a = S.preset("blog")
    b = a.replace(threads=1024, grid="persistent", ctas_per_sm=2)
    assert a.source_knobs() == b.source_knobs()
    assert len(S.distinct_sources([a, b])) == 1
