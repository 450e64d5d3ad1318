"""The family declaration and what is derived from it: the space, its count, the search
parametrisation, the refinement neighbours, serialisation and labels."""

import itertools
import json
import math

import pytest

from nf4tune.family import Constraint, DeviceLimits, Knob
from nf4tune.families import DEQUANT as D, FAMILIES, get
from nf4tune.vocabulary import InvalidConfig, Problem

BF16 = dict(dtype=["bf16"], quant=["nf4"])


def test_count_matches_iteration():
    assert D.space_size() == sum(1 for _ in D.iter_space()) == 55440
    assert D.space_size(**BF16) * 6 == D.space_size()
    assert len(D.distinct_sources(D.iter_space())) == 2520


@pytest.mark.parametrize("strength", [1, 2, 3])
def test_a_covering_sample_has_every_combination_of_source_knob_values_some_source_has(strength):
    configs = list(D.iter_space(**BF16))
    keys = list(D.distinct_sources(configs))
    sample = D.covering_sources(configs, strength)

    def combos(key_list):
        return {t for key in key_list for t in itertools.combinations(key, strength)}

    sample_keys = [tuple(sorted(c.source_knobs().items())) for c in sample]
    assert len(set(sample_keys)) == len(sample) < len(keys)            # distinct sources, fewer than all
    assert combos(sample_keys) == combos(keys)
    assert D.covering_sources(configs, strength) == sample                  # the same configs, the same sample
    with pytest.raises(ValueError, match="strength"):
        D.covering_sources(configs, 0)


def test_every_knob_value_is_reachable():
    seen = {k: set() for k in D.knob_names}
    for c in D.iter_space(**BF16):
        for k in D.knob_names:
            seen[k].add(getattr(c, k))
    for k in D.knobs:
        if k.role == "problem":
            continue
        assert seen[k.name] == set(k.values), k.name


def test_config_is_frozen_hashable_and_round_trips():
    c = D.config(bytes_per_thread=8, threads=128, unroll=2, lut="register", index="div", store="streaming",
                 grid="persistent", ctas_per_sm=4, dtype="fp16", quant="fp4")
    assert D.from_json(c.to_json()) == c
    assert hash(D.from_json(c.to_json())) == hash(c)
    assert json.loads(c.to_json())["ctas_per_sm"] == 4
    with pytest.raises(Exception):
        c.values = ()  # frozen
    assert len({c, D.from_dict(c.to_dict())}) == 1
    assert c.short() == "8B x2 t128 register div streaming persistent x4 fp16 fp4"
    assert c.threads == 128 and c.replace(threads=64).threads == 64
    with pytest.raises(AttributeError):
        c.warps


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
    with pytest.raises(InvalidConfig, match=match):
        D.config(**bad)


def test_unknown_knob_and_bad_json():
    with pytest.raises(InvalidConfig, match="unknown"):
        D.from_dict({"warps": 4})
    with pytest.raises(InvalidConfig, match="JSON"):
        D.from_json("{not json")


def test_presets_are_points_of_the_space():
    blog = D.preset("blog", dtype="bf16", quant="nf4")
    assert (blog.bytes_per_thread, blog.threads, blog.lut, blog.index) == (4, 256, "shared", "shift")
    bnb = D.preset("bnb-like", Problem((64, 64), "fp16", "fp4"))
    assert (bnb.bytes_per_thread, bnb.threads, bnb.lut, bnb.dtype, bnb.quant) == (8, 64, "global", "fp16", "fp4")
    space = set(D.iter_space(dtype=["bf16", "fp16"], quant=["nf4", "fp4"]))
    assert blog in space and bnb in space
    with pytest.raises(InvalidConfig):
        D.preset("fastest")


def test_distinct_sources_ignore_launch_knobs():
    a = D.preset("blog", dtype="bf16", quant="nf4")
    b = a.replace(threads=1024, grid="persistent", ctas_per_sm=2)
    assert a.source_knobs() == b.source_knobs()
    assert len(D.distinct_sources([a, b])) == 1
    assert a.render() == b.render() and "#define NF4T_LUT 3" in a.render()


def test_search_parametrisation_is_exactly_the_valid_space():
    prob = Problem((4096, 4096))
    space = D.search_space(prob)
    assert D.grid_size(prob) == D.space_size(**BF16)
    configs = {D.config_from_params(dict(zip(space, combo)), prob) for combo in itertools.product(*space.values())}
    assert configs == set(D.iter_space(**BF16))
    c = D.preset("bnb-like", dtype="fp16", quant="fp4")
    assert D.config_from_params(D.params_from_config(c), Problem((8, 8), "fp16", "fp4")) == c
    # knobs tied by a constraint are one parameter; free knobs are their own
    assert set(space) == {"bytes_per_thread+unroll", "threads+grid+ctas_per_sm", "lut", "index", "store"}


def test_neighbours_are_valid_one_knob_moves_most_promising_first():
    c = D.builtin_default(Problem((4096, 4096)))
    ns = D.neighbours(c)
    assert c not in ns and len(ns) == len(set(ns))
    assert ns[0].threads != c.threads and all(n.family is D for n in ns)
    changed = [sum(a != b for a, b in zip(n.values, c.values)) for n in ns]
    assert changed == sorted(changed) and max(changed) == 2          # one knob first, then coupled pairs
    persistent = [n for n in ns if n.grid == "persistent"]
    assert {n.ctas_per_sm for n in persistent} == {1, 2, 4, 8}         # grid moves take their CTA count along


def test_a_new_knob_is_one_declaration():
    """Adding a knob to the family declaration (and the template) is all it takes: the space,
    its count, the search parametrisation, the neighbours, rendering and labels see it."""
    fam = D.extended(knobs=[Knob("swizzle", (0, 1, 2), "source", "NF4T_SWIZZLE", label="sw{}", help="test knob")],
                     constraints=[Constraint(("swizzle", "bytes_per_thread"),
                                             lambda swizzle, bytes_per_thread:
                                             "swizzle needs 16 B" if swizzle == 2 and bytes_per_thread != 16 else None)],
                     defaults=dict(swizzle=0))
    assert D.space_size() == 55440 and "swizzle" not in D.knob_names      # the original is untouched
    per = D.space_size(**BF16)
    sixteen = sum(1 for c in D.iter_space(**BF16) if c.bytes_per_thread == 16)
    assert fam.space_size(**BF16) == 2 * per + sixteen == sum(1 for _ in fam.iter_space(**BF16))
    space = fam.search_space(Problem((64, 64)))
    assert "bytes_per_thread+unroll+swizzle" in space
    assert any(choice.endswith("/2") for choice in space["bytes_per_thread+unroll+swizzle"])
    c = fam.config(bytes_per_thread=16, swizzle=2)
    assert fam.config_from_params(fam.params_from_config(c), Problem((64, 64))) == c
    assert any(n.swizzle != c.swizzle for n in fam.neighbours(c))
    assert "#define NF4T_SWIZZLE 2" in fam.macros(c) or fam.macros(c)["NF4T_SWIZZLE"] == 2
    assert "sw2" in c.short()
    with pytest.raises(InvalidConfig, match="swizzle needs 16 B"):
        fam.config(swizzle=2)


def test_registry():
    assert get("dequant") is D and "dequant" in FAMILIES
    with pytest.raises(ValueError, match="unknown kernel family"):
        get("gemm9")


def test_space_restricted_by_tunable_knobs():
    """Any knob narrows the space (what `bench --exhaustive --sweep` and `compile --sweep` use):
    exactly the full space's configs with those values, counted the same way; an unknown knob or
    value is refused."""
    restrict = dict(threads=[128, 256], lut=["shared"])
    full = [c for c in D.iter_space(**BF16) if c.threads in (128, 256) and c.lut == "shared"]
    got = list(D.iter_space(**BF16, **restrict))
    assert got == full and 0 < len(got) < D.space_size(**BF16)
    assert D.space_size(**BF16, **restrict) == len(got)
    with pytest.raises(InvalidConfig, match="no knob"):
        list(D.iter_space(bogus=[1]))
    with pytest.raises(InvalidConfig, match="not in"):
        D.space_size(threads=[7])


@pytest.mark.parametrize("family_name", ["dequant", "matmul"])
def test_the_pruned_walk_finds_exactly_the_product_filtered_by_every_constraint(family_name):
    """The space enumeration prunes as soon as a constraint's knobs have values; it must keep
    exactly the combinations (and their order) that filtering the whole product keeps."""
    from nf4tune.families import DEQUANT, MATMUL

    fam = {"dequant": DEQUANT, "matmul": MATMUL}[family_name]
    fam = fam.extended()            # a fresh copy: no cached choices
    problem = {k.name: k.values[0] for k in fam.knobs if k.role == "problem"}
    for group in fam.groups:
        gset = set(group)
        rules = [c for c in fam.constraints if set(c.knobs) & gset]
        domains = [fam.knob(k).values for k in group]
        if math.prod(len(d) for d in domains) > 300_000:
            # the matmul's large group: the brute force over a slice (path and table fixed), same rules
            fix = {"mma": "mma-ks", "lut": "pairx"}
            domains = [((fix[k],) if k in fix else d) for k, d in zip(group, domains)]
            sliced = True
        else:
            sliced = False
        brute = [combo for combo in itertools.product(*domains)
                 if all(c.violation(dict(problem, **dict(zip(group, combo)))) is None for c in rules)]
        walked = fam._walk_group(group, problem)
        if sliced:
            walked = [c for c in walked if all(c[group.index(k)] == v for k, v in fix.items())]
        assert walked == brute and brute, group


def test_registers_refusal_counts_the_busiest_sub_partition():
    """A block launches when the SM sub-partition with the most of its warps holds them, registers
    allocated 256 to a warp: session 20's H100 refused 142 registers x 14 warps (4 warps x 4608 > 16384)
    although 142 x 448 fits the SM's 65,536."""
    sm = DeviceLimits(132)
    assert sm.registers_refusal(128, 14 * 32) is None                 # 4 x 4096 = 16384: fits exactly
    assert "cannot launch" in sm.registers_refusal(142, 14 * 32)      # rounded to 144: 4 x 4608
    assert sm.registers_refusal(142, 12 * 32) is None                 # 3 x 4608
    assert sm.registers_refusal(255, 256) is None                     # 2 x 8192
    assert sm.registers_refusal(255, 288) is not None                 # 3 x 8192
    assert DeviceLimits(84, regs_per_sm=32768).registers_refusal(168, 256) is not None
