"""The family declaration and what is derived from it: the space, its counts, the search
parametrisation, the refinement neighbours, rendering, serialisation and labels; and that a new
knob is one declaration plus the template file of each structure it changes."""

import itertools
import json
import math
import re
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from nf4tune.family import Constraint, DeviceLimits, Knob
from nf4tune.families import DEQUANT as D, FAMILIES, MATMUL as MM, get
from nf4tune.vocabulary import InvalidConfig, Problem

BF16 = dict(dtype=["bf16"], quant=["nf4"])
TEMPLATES = Path(__file__).resolve().parent.parent / "kernel_templates"


def _brute(family, experimental=False, **restrict):
    """(configs, distinct sources) by filtering the product of every knob's allowed values."""
    domains = family.domains(experimental, **restrict)
    names = family.knob_names
    sources = set()
    configs = 0
    for combo in itertools.product(*(domains[n] for n in names)):
        values = dict(zip(names, combo))
        if family.violation(values) is None:
            configs += 1
            sources.add(tuple(values[k.name] for k in family.knobs if k.in_source))
    return configs, len(sources)


# ----------------------------------------------------------------------------- the space and its counts
def test_count_matches_iteration():
    assert D.space_size() == sum(1 for _ in D.iter_space()) == 55440
    assert D.space_size(**BF16) * 6 == D.space_size()
    assert len(D.distinct_sources(D.iter_space())) == D.count().sources == 2520


@pytest.mark.parametrize("family_name, restrict", [
    ("dequant", dict(threads=[64, 1024], lut=["shared", "global"])),
    ("matmul", dict(mma=["simt", "mma-ks", "mma-rows"], load_bytes=[8, 16], rows_per_warp=[16], mtile=[8, 16],
                    warps=[4, 16], ksplit=[1], lut=["pair"], scale=["block"], wload=["stream"], prefetch=[0, 2],
                    unroll=[2], span=[1, 2], prmt_quarters=[0], persist=[0, 1], stages=[0, 4], stats=["lanes"],
                    regcap=[0, 80], achunk=[0, 1], dtype=["bf16", "fp32"], quant=["nf4"], m=[1, 8])),
])
@pytest.mark.parametrize("experimental", [False, True])
def test_the_computed_counts_equal_brute_force(family_name, restrict, experimental):
    """configs and distinct sources counted from the declaration (grouped by constraints, sources as the
    distinct values of the knobs in the source) equal filtering the whole product of the knobs' values."""
    fam = get(family_name)
    count = fam.count(experimental=experimental, **restrict)
    assert count.exact
    want = _brute(fam, experimental, **restrict)
    assert (count.configs, count.sources) == want and want[0] > 0
    assert fam.space_size(experimental=experimental, **restrict) == want[0]
    # the walk of the space and one config per distinct source agree with them
    walked = list(fam.iter_space(experimental=experimental, **restrict))
    assert len(walked) == want[0] and len(fam.distinct_sources(walked)) == want[1]
    reps = list(fam.iter_sources(experimental=experimental, **restrict))
    assert len(reps) == want[1] and all(fam.violation(c.to_dict()) is None for c in reps)
    assert set(fam.distinct_sources(reps)) == set(fam.distinct_sources(walked))


def test_sources_are_counted_across_problem_knobs_outside_the_source():
    """A knob outside the source (here the batch bucket m) that ties two otherwise free knobs: a source
    counts once whichever m makes it valid, not once per m, and not as the product of each knob's own
    projection (a and b each valid at some m, never together)."""
    fam = MM.extended(
        knobs=[Knob("ta", (0, 1), help="test"), Knob("tb", (0, 1), help="test")],
        constraints=[Constraint(("ta", "m"), lambda ta, m: "ta 1 at m 1 only" if ta and m != 1 else None, help="t"),
                     Constraint(("tb", "m"), lambda tb, m: "tb 1 at m 2 only" if tb and m != 2 else None, help="t")])
    restrict = dict(dtype=["bf16"], quant=["nf4"], m=[1, 2], mma=["simt"], load_bytes=[16], rows_per_warp=[4],
                    mtile=[1], lut=["shared"], astage=["global"], wload=["plain", "stream"], prefetch=[0])
    count = fam.count(**restrict)
    assert (count.configs, count.sources) == _brute(fam, **restrict)
    assert count.sources == 2 * 3          # wload x (ta, tb) in {00, 10, 01}: never 11


def test_counts_take_at_most_5_s_and_300_mb_for_every_family_and_space():
    """`nf4-tune space` used to enumerate 11 million matmul configs (635 s, 2.9 GB) to print two counts:
    computed from the declaration they take well under 5 s of CPU time (this machine is shared: wall time
    would measure the neighbours) and 300 MB (tracemalloc's peak of the count), for every family, in the
    default and the whole space."""
    for fam in FAMILIES.values():
        for experimental in (False, True):
            fresh = fam.extended()                  # no cached walks
            t0 = time.process_time()
            c = fresh.count(experimental=experimental)
            seconds = time.process_time() - t0
            tracemalloc.start()
            fam.extended().count(experimental=experimental)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert c.exact and c.configs > 0 and c.sources > 0
            assert seconds < 5.0, (fam.name, experimental, seconds)
            assert peak < 300 * 2**20, (fam.name, experimental, peak)
    assert MM.count(experimental=True).configs == 22816800 and MM.count(experimental=True).sources == 191744


def test_the_space_command_answers_within_its_bounds():
    """The whole command, in a fresh process, start-up included: `space --family matmul` (the default space's
    counts and the whole space's) within 5 s of CPU time and 300 MB of resident memory (the process's own
    peaks; wall time on this shared machine would measure the neighbours too)."""
    # (VmHWM: this process's own peak; ru_maxrss would carry the forking parent's peak across the exec)
    code = ("import re, resource, sys; from nf4tune import cli; rc = cli.main(sys.argv[1:]); "
            "u = resource.getrusage(resource.RUSAGE_SELF); "
            "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1); "
            "print('USAGE', u.ru_utime + u.ru_stime, hwm, file=sys.stderr); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, "space", "--family", "matmul", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert (data["whole_space"]["size"], data["whole_space"]["distinct_sources"]) == (22816800, 191744)
    assert data["count"]["exact"] and data["whole_space"]["count"]["exact"]
    cpu, rss_kb = re.search(r"USAGE ([\d.]+) (\d+)", r.stderr).groups()
    assert float(cpu) < 5.0 and int(rss_kb) < 300 * 1024, (cpu, rss_kb)


def test_an_infeasible_count_is_estimated_and_says_so(capsys):
    """Where the exact count would take more than its budget of steps (here a budget of 50, and a rule over
    many knobs), the count is an estimate with a 95% interval that holds the true value, marked as such in
    the result, in `space`'s text and in its JSON."""
    restrict = dict(dtype=["bf16"], quant=["nf4"], m=[8], mma=["mma-rows"], lut=["pairx"])
    exact = MM.count(**restrict)
    est = MM.count(budget=50, seconds=600, probes=3000, **restrict)
    assert exact.exact and not est.exact and est.method == "estimated"
    assert est.configs_error > 0 and abs(est.configs - exact.configs) <= est.configs_error
    assert abs(est.sources - exact.sources) <= est.sources_error
    d = est.to_dict()
    assert not d["exact"] and "estimated" in d["note"] and d["configs_error"] == est.configs_error
    from nf4tune.cli import space as space_cli

    assert "an estimate" in space_cli._count_text(d, "configs") and "+-" in space_cli._count_text(d, "configs")


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
    assert D.covering_sources(D.iter_sources(**BF16), strength) == D.covering_sources(
        list(D.iter_sources(**BF16)), strength)
    with pytest.raises(ValueError, match="strength"):
        D.covering_sources(configs, 0)


def test_covering_configs_cover_sources_and_every_launch_value():
    """The GPU gate's sample: a pairwise covering of the sources, each a valid config, completed with the
    launch and batch-bucket values so that every such value appears."""
    sample = MM.covering_configs(2, experimental=True, **BF16)
    assert sample == MM.covering_configs(2, experimental=True, **BF16)       # deterministic
    assert all(MM.violation(c.to_dict()) is None for c in sample)
    pairs = {t for c in MM.iter_sources(experimental=True, **BF16)
             for t in itertools.combinations(sorted(c.source_knobs().items()), 2)}
    got = {t for c in sample for t in itertools.combinations(sorted(c.source_knobs().items()), 2)}
    assert pairs <= got
    for knob in ("warps", "ksplit", "m"):
        assert {getattr(c, knob) for c in sample} == set(MM.knob(knob).values), knob
    assert {c.mma for c in sample} == set(MM.knob("mma").values)
    # the column structure (experimental) with every value of its own knobs: the GPU gate runs them
    for knob in ("cols_mb", "part", "table64"):
        assert {getattr(c, knob) for c in sample if c.mma == "mma-cols"} == set(MM.knob(knob).values), knob


def test_every_knob_value_is_reachable():
    seen = {k: set() for k in D.knob_names}
    for c in D.iter_space(**BF16):
        for k in D.knob_names:
            seen[k].add(getattr(c, k))
    for k in D.knobs:
        if k.role == "problem":
            continue
        assert seen[k.name] == set(k.values), k.name


# ----------------------------------------------------------------------------- experimental values
def test_experimental_values_stay_out_of_the_default_space_and_are_searchable_when_asked():
    """Values that never won a served entry are valid configs, left out of the default space's walks,
    counts, search parameters and refinement moves, and in with experimental=True or when a restriction
    names them."""
    restrict = dict(dtype=["bf16"], quant=["nf4"], m=[8, 64])        # 64: the 64-row batch tile
    default = set(MM.iter_space(**restrict))
    whole = set(MM.iter_space(experimental=True, **restrict))
    assert default < whole
    assert not any(c.experimental() for c in default)
    assert all(MM.in_space(c, experimental=True) for c in whole)
    exp_values = {(k.name, v) for k in MM.knobs for v in k.experimental}
    assert exp_values == {(k, v) for c in whole - default for k, v in c.to_dict().items()
                          if v in MM.knob(k).experimental}
    assert MM.space_size(**restrict) == len(default) and MM.space_size(experimental=True, **restrict) == len(whole)
    # named in a restriction: taken
    assert {c.mma for c in MM.iter_space(mma=["mma"], scale=["value"], **restrict)} == {"mma"}
    assert not list(MM.iter_space(mma=["mma"], **restrict))          # its scale value is experimental too
    # a config with an experimental value is valid, and says so
    c = MM.config(mma="mma", rows_per_warp=16, mtile=8, scale="value", m=8)
    assert c.experimental() == ("mma", "scale") and not MM.in_space(c)
    # the search: only the default space unless asked, both parse back
    prob = Problem((4096, 4096), "bf16", "nf4", 64, "matmul", 8)
    space, space_x = MM.search_space(prob), MM.search_space(prob, experimental=True)
    assert MM.grid_size(prob) == sum(c.m == 8 for c in default)
    assert MM.grid_size(prob, experimental=True) == sum(c.m == 8 for c in whole)
    assert MM.config_from_params(MM.params_from_config(c), prob) == c
    assert MM.params_from_config(c)[MM.param_name(MM.groups[0])] not in space[MM.param_name(MM.groups[0])]
    assert MM.params_from_config(c)[MM.param_name(MM.groups[0])] in space_x[MM.param_name(MM.groups[0])]
    base = MM.builtin_default(prob)
    assert all(not n.experimental() for n in MM.neighbours(base))
    assert any(n.experimental() for n in MM.neighbours(base, experimental=True))
    # every built-in default is a point of the default space
    for fam in FAMILIES.values():
        for k in fam.knobs:
            assert k.default not in k.experimental
        for m in (1, 2, 4, 8, 16, 32, 64):
            for dtype in ("bf16", "fp16", "fp32"):
                p = Problem((64, 64), dtype, "nf4", 64, fam.name, m if fam.name == "matmul" else None)
                assert fam.in_space(fam.builtin_default(p)), (fam.name, dtype, m)


def test_no_served_config_uses_an_experimental_value():
    """The rule behind the experimental values: none of them won an entry of the packaged serving table."""
    from nf4tune.serve import table

    entries = json.loads(Path(table.__file__).with_name("tuned_configs.json").read_text())["entries"]
    assert entries
    for e in entries:
        c = get(e["family"]).from_dict(e["config"])
        assert not c.experimental(), (e["gpu"], e["shape"], e.get("m"), c.experimental())


# ----------------------------------------------------------------------------- one declaration per knob
def test_a_knob_is_one_declaration():
    """A knob carries its default, refinement rank and experimental values; its macro's name and an enum's
    named values are derived; a constraint's help is its check's docstring (or its help)."""
    k = Knob("lut", ("shared", "pair-x", "register"), default="pair-x", refine=3, experimental=("register",))
    assert k.macro == "NF4T_LUT" and k.enum and k.constant("pair-x") == "NF4T_LUT_PAIR_X"
    assert k.allowed() == ("shared", "pair-x") and k.allowed(experimental=True) == k.values
    assert Knob("x", (0, 1, 2), experimental=True).experimental == (1, 2)
    assert Knob("warps", (1, 2), "launch").macro is None and Knob("m", (1, 2), "problem", in_source=False).macro is None
    for bad in (dict(default=7), dict(experimental=(0,)), dict(experimental=(9,))):
        with pytest.raises(ValueError):
            Knob("x", (0, 1), **bad)
    with pytest.raises(ValueError, match="problem knob"):
        Knob("dtype", ("bf16", "fp16"), "problem", experimental=("fp16",))

    def rule(a, b):
        """a and b: never both."""
        return "both" if a and b else None

    assert Constraint(("a", "b"), rule).text == "a and b: never both."
    assert Constraint(("a", "b"), rule, help="said here").text == "said here"
    with pytest.raises(ValueError, match="docstring or the constraint a help"):
        Constraint(("a", "b"), lambda a, b: None)
    # the families' derived parts
    assert D.defaults["threads"] == 256 and MM.defaults["load_bytes"] == 16
    assert D.refine_order == ("threads", "store", "grid", "ctas_per_sm", "unroll", "bytes_per_thread", "lut", "index")
    assert MM.refine_order[:4] == ("ksplit", "warps", "rows_per_warp", "prefetch")
    assert all(c.text for fam in FAMILIES.values() for c in fam.constraints)
    for fam in FAMILIES.values():
        for k in fam.knobs:
            if k.in_source:
                assert k.macro == "NF4T_" + k.name.upper()


def test_enum_values_are_named_constants_in_the_source_and_the_templates():
    """An enum knob is compiled as named constants: the rendered source defines every value's name and the
    knob's macro as one of them; every template compares an enum macro only with ==/!= against a declared
    value's name (never a number); and every NF4T_ macro a template reads that looks like a knob's is one."""
    c = D.preset("blog", dtype="bf16", quant="nf4")
    src = c.render()
    assert "#define NF4T_LUT NF4T_LUT_SHARED\n" in src
    names = dict(re.findall(r"#define (NF4T_LUT_[A-Z]+) (\d+)\n", src))
    assert set(names) == {f"NF4T_LUT_{v.upper()}" for v in D.knob("lut").values} and len(set(names.values())) == 5
    assert D.macros(c)["NF4T_LUT"] == "NF4T_LUT_SHARED" and D.macros(c)["NF4T_BYTES_PER_THREAD"] == 4
    for fam in FAMILIES.values():
        enums = {k.macro: k for k in fam.knobs if k.enum}
        for name in fam.all_template_files():
            text = re.sub(r"//[^\n]*|\"[^\"\n]*\"", "", (TEMPLATES / name).read_text())
            for m in re.finditer(r"\b(NF4T_[A-Z0-9_]+)\b", text):
                macro = m.group(1)
                if macro in enums:
                    rest = text[m.end():m.end() + 64]
                    cmp = re.match(r"\s*(==|!=)\s*(NF4T_[A-Z0-9_]+)", rest)
                    assert cmp, (name, macro, rest)
                    assert cmp.group(2) in {enums[macro].constant(v) for v in enums[macro].values}, (name, cmp.group(2))


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
    assert a.render() == b.render() and "#define NF4T_LUT NF4T_LUT_SHARED" in a.render()


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
    with pytest.raises(InvalidConfig, match="not a choice"):
        D.config_from_params(dict(D.params_from_config(c), **{"bytes_per_thread+unroll": "16/2"}), prob)


def test_neighbours_are_valid_one_knob_moves_most_promising_first():
    c = D.builtin_default(Problem((4096, 4096)))
    ns = D.neighbours(c)
    assert c not in ns and len(ns) == len(set(ns))
    assert ns[0].threads != c.threads and all(n.family is D for n in ns)
    changed = [sum(a != b for a, b in zip(n.values, c.values)) for n in ns]
    assert changed == sorted(changed) and max(changed) == 2          # one knob first, then coupled pairs
    persistent = [n for n in ns if n.grid == "persistent"]
    assert {n.ctas_per_sm for n in persistent} == {1, 2, 4, 8}         # grid moves take their CTA count along


def _copy_templates(tmp_path) -> Path:
    root = tmp_path / "kernel_templates"
    shutil.copytree(TEMPLATES, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return root


def test_a_new_knob_is_one_declaration(tmp_path, compile_cache):
    """Adding a knob to the dequant family is its declaration and the template that reads it (here a copy of
    kernel_templates/ with dequant.cu changed): the space, its counts, the search parametrisation, the
    neighbours, rendering, NVRTC and labels see it."""
    from nf4tune.kernel.compiler import compile_config

    root = _copy_templates(tmp_path)
    tmpl = root / "dequant.cu"
    store = "#if NF4T_STORE == NF4T_STORE_STREAMING"
    assert tmpl.read_text().count(store) == 3
    tmpl.write_text(tmpl.read_text().replace(store, "#if NF4T_STORE == NF4T_STORE_STREAMING || NF4T_SWIZZLE == 2"))
    fam = D.extended(knobs=[Knob("swizzle", (0, 1, 2), label="sw{}", help="test knob")],
                     constraints=[Constraint(("swizzle", "bytes_per_thread"),
                                             lambda swizzle, bytes_per_thread:
                                             "swizzle needs 16 B" if swizzle == 2 and bytes_per_thread != 16 else None,
                                             help="swizzle 2: 16-byte loads")],
                     template_root=str(root))
    assert D.space_size() == 55440 and "swizzle" not in D.knob_names      # the original is untouched
    per = D.space_size(**BF16)
    sixteen = sum(1 for c in D.iter_space(**BF16) if c.bytes_per_thread == 16)
    assert fam.space_size(**BF16) == 2 * per + sixteen == sum(1 for _ in fam.iter_space(**BF16))
    assert fam.count().sources == 2 * D.count().sources + D.count(bytes_per_thread=[16]).sources
    space = fam.search_space(Problem((64, 64)))
    assert "bytes_per_thread+unroll+swizzle" in space
    assert any(choice.endswith("/2") for choice in space["bytes_per_thread+unroll+swizzle"])
    c = fam.config(bytes_per_thread=16, swizzle=2)
    assert fam.config_from_params(fam.params_from_config(c), Problem((64, 64))) == c
    assert any(n.swizzle != c.swizzle for n in fam.neighbours(c))
    assert fam.macros(c)["NF4T_SWIZZLE"] == 2 and "#define NF4T_SWIZZLE 2\n" in c.render()
    assert "sw2" in c.short() and fam.template_hash() != D.template_hash()
    with pytest.raises(InvalidConfig, match="swizzle needs 16 B"):
        fam.config(swizzle=2)
    # the template's change takes effect: swizzle 2 stores as streaming does
    plain = compile_config(c.replace(store="plain", swizzle=0), "sm_90", cache_dir=compile_cache)
    assert compile_config(c.replace(store="plain"), "sm_90", cache_dir=compile_cache).cubin == compile_config(
        c.replace(store="streaming", swizzle=0), "sm_90", cache_dir=compile_cache).cubin != plain.cubin


def test_a_new_matmul_knob_touches_only_the_declaration_and_its_structure_file(tmp_path, compile_cache):
    """A knob of one matmul structure (mma-rows) is one Knob and one Constraint in the declaration, and a change
    to that structure's file (matmul/mma_rows.cu, in a copy of kernel_templates/). The counts, the search
    parameter, the neighbours, the labels, `nf4-tune space` and rendering see it; the shared headers are not
    touched; every other structure's source is its old text plus the knob's defines; and the kernel changes only
    where the knob is set (the default value compiles to the old cubin)."""
    from nf4tune.cli.space import describe
    from nf4tune.kernel.compiler import compile_config

    root = _copy_templates(tmp_path)
    rows = root / "matmul" / "mma_rows.cu"
    pitch = "__device__ __forceinline__ u32 tc_a_pitch(u32 kper) { return ((kper * 2u + 127u) & ~127u) + 64u; }"
    assert rows.read_text().count(pitch) == 1
    rows.write_text(rows.read_text().replace(pitch, "#if NF4T_APAD == NF4T_APAD_WIDE\n" + pitch.replace("64u;", "80u;")
                                             + "\n#else\n" + pitch + "\n#endif"))
    fam = MM.extended(
        knobs=[Knob("apad", ("narrow", "wide"), label="ap:{}", hidden=("narrow",), help="mma-rows: A's row padding")],
        constraints=[Constraint(("mma", "apad"),
                                lambda mma, apad: "apad is a knob of mma-rows" if apad != "narrow" and mma != "mma-rows"
                                else None, help="apad wide: mma-rows only")],
        template_root=str(root))
    changed = {p.relative_to(root).as_posix() for p in root.rglob("*.cu*")
               if p.read_bytes() != (TEMPLATES / p.relative_to(root)).read_bytes()}
    assert changed == {"matmul/mma_rows.cu"}
    # the space: one more value for every mma-rows config and source
    rows_only = dict(mma=["mma-rows"])
    assert fam.count().configs == MM.count().configs + MM.count(**rows_only).configs
    assert fam.count().sources == MM.count().sources + MM.count(**rows_only).sources
    prob = Problem((4096, 4096), "bf16", "nf4", 64, "matmul", 1)
    group = next(g for g in fam.groups if "apad" in g)
    assert "mma" in group and fam.param_name(group) in fam.search_space(prob)
    knobs = dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=16, scale="block", astage="shared",
                 lut="pairx", unroll=2, prefetch=1, span=2, m=1)
    narrow, wide = fam.config(**knobs), fam.config(**knobs, apad="wide")
    assert wide in fam.neighbours(narrow) and wide.short() == narrow.short() + " ap:wide"
    assert narrow.short() == MM.config(**knobs).short()
    with pytest.raises(InvalidConfig, match="apad is a knob of mma-rows"):
        fam.config(apad="wide", m=1)
    d = describe(fam, {})
    assert "apad" in d["knobs"] and {"knobs": ["mma", "apad"], "help": "apad wide: mma-rows only"} in d["constraints"]
    # rendering: named constants, the changed file for mma-rows, every other structure's old text
    assert fam.macros(wide)["NF4T_APAD"] == "NF4T_APAD_WIDE" and "+ 80u; }" in wide.render()
    added = {f"#define {name} {code}" for name, code in fam.constants().items() if name.startswith("NF4T_APAD_")}
    added |= {"#define NF4T_APAD NF4T_APAD_NARROW"}
    for other in (fam.config(m=1), fam.config(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=8,
                                              lut="pair", unroll=2, m=1)):
        lines = other.render().split("\n")
        assert added <= set(lines)
        assert [x for x in lines if x not in added] == MM.from_dict(
            {k: v for k, v in other.to_dict().items() if k != "apad"}).render().split("\n")
    # NVRTC: the default value is the old kernel, the new value another one
    old = compile_config(MM.config(**knobs), "sm_90", cache_dir=compile_cache)
    assert compile_config(narrow, "sm_90", cache_dir=compile_cache).cubin == old.cubin
    assert compile_config(wide, "sm_90", cache_dir=compile_cache).cubin != old.cubin


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
    fam = get(family_name).extended()            # a fresh copy: no cached choices
    problem = {k.name: k.values[0] for k in fam.knobs if k.role == "problem"}
    domains = fam.domains(experimental=True)
    for group in fam.groups:
        gset = set(group)
        rules = [c for c in fam.constraints if set(c.knobs) & gset]
        doms = [domains[k] for k in group]
        slices = [domains]
        if math.prod(len(d) for d in doms) > 300_000:
            # the matmul's large group: the brute force over slices (path and table fixed), same rules
            fix = {"lut": ("pairx",), "regcap": (0,), "prmt_quarters": (0,), "achunk": (0,), "span": (1,),
                   "warps": (4, 8)}
            slices = [dict(domains, **fix, mma=("mma-ks",), cols_mb=(1,), part=(64,), table64=(1,)),
                      dict(domains, **fix, mma=("mma-cols",), load_bytes=(16,), stages=(0,), feed=("lanes",),
                           ksplit=(1, 2), unroll=(1,), persist=(0,))]
        for sliced in slices:
            doms = [sliced[k] for k in group]
            brute = [combo for combo in itertools.product(*doms)
                     if all(c.violation(dict(problem, **dict(zip(group, combo)))) is None for c in rules)]
            walked = fam._walk_group(group, problem, sliced)
            assert walked == brute and brute, group


def test_registers_refusal_counts_the_busiest_sub_partition():
    """A block launches when the SM sub-partition with the most of its warps holds them, registers
    allocated 256 to a warp: an H100 refused 142 registers x 14 warps (4 warps x 4608 > 16384)
    although 142 x 448 fits the SM's 65,536."""
    sm = DeviceLimits(132)
    assert sm.registers_refusal(128, 14 * 32) is None                 # 4 x 4096 = 16384: fits exactly
    assert "cannot launch" in sm.registers_refusal(142, 14 * 32)      # rounded to 144: 4 x 4608
    assert sm.registers_refusal(142, 12 * 32) is None                 # 3 x 4608
    assert sm.registers_refusal(255, 256) is None                     # 2 x 8192
    assert sm.registers_refusal(255, 288) is not None                 # 3 x 8192
    assert DeviceLimits(84, regs_per_sm=32768).registers_refusal(168, 256) is not None
