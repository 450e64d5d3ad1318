"""NVRTC compilation on the CPU: CUBIN for any arch NVRTC supports, the cache, errors, the whole space."""

import os
import random

import pytest

from nf4tune.kernel_templates import render, template_source
from nf4tune.families import DEQUANT as D
from nf4tune.kernel import compiler as C
from nf4tune.kernel.arch import ARCH_TABLE, arch_limits, supported_archs

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")


def preset(name, dtype="bf16", quant="nf4"):
    return D.preset(name, dtype=dtype, quant=quant)


def _cubin_arch(cubin: bytes) -> int:
    # CUDA cubins (ELF ABI version 8, CUDA 12.8+) keep the SM version in bits 8..15 of e_flags
    assert cubin[:4] == b"\x7fELF"
    e_flags = int.from_bytes(cubin[48:52], "little")
    return (e_flags >> 8) & 0xFF


def test_archs_come_from_nvrtc_and_have_limits():
    archs = supported_archs()
    assert {"sm_90", "sm_100", "sm_120"} <= set(archs)
    for a in archs:
        assert a in ARCH_TABLE, f"{a}: NVRTC compiles for it, the limits table lacks it"
    assert arch_limits("sm_120").max_threads_per_sm == 1536 and arch_limits("sm_90").max_threads_per_sm == 2048


@pytest.mark.parametrize("arch", ARCHS)
def test_presets_compile_to_cubin_for_each_arch(arch, compile_cache):
    for name in D.presets:
        k = C.compile_config(preset(name), arch, cache_dir=compile_cache)
        assert k.cubin[:4] == b"\x7fELF"
        assert _cubin_arch(k.cubin) == int(arch[3:])
        assert k.registers and k.registers > 0
        assert k.spill_stores is not None


def test_second_compile_is_a_cache_hit(tmp_path):
    c = preset("blog", "fp16", "fp4")
    first = C.compile_config(c, "sm_90", cache_dir=tmp_path)
    second = C.compile_config(c, "sm_90", cache_dir=tmp_path)
    assert not first.cached and second.cached
    assert first.cubin == second.cubin and first.key == second.key
    # a different arch or source is a different key
    assert C.compile_config(c, "sm_80", cache_dir=tmp_path).key != first.key
    assert C.compile_config(c.replace(store="streaming"), "sm_90", cache_dir=tmp_path).key != first.key


def test_corrupt_cache_entry_is_recompiled(tmp_path):
    c = preset("blog")
    k = C.compile_config(c, "sm_90", cache_dir=tmp_path)
    path = tmp_path / k.key[:2] / f"{k.key}.cubin"
    path.write_bytes(b"garbage")
    again = C.compile_config(c, "sm_90", cache_dir=tmp_path)
    assert not again.cached and again.cubin == k.cubin


def test_compile_error_carries_the_nvrtc_log(tmp_path):
    with pytest.raises(C.CompileError) as e:
        C.compile_source("extern \"C\" __global__ void k() { undefined_thing(); }", "sm_90", "k", cache_dir=tmp_path)
    assert "undefined_thing" in e.value.log


def test_unknown_arch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unsupported arch"):
        C.compile_config(preset("blog"), "sm_70", cache_dir=tmp_path)


def test_render_sets_every_knob_macro():
    """The macros (an enum's value as its named constant), then the family's files in order as one text."""
    src = preset("bnb-like").render()
    assert "#define NF4T_BYTES_PER_THREAD 8\n" in src and "#define NF4T_INDEX NF4T_INDEX_DIV\n" in src
    assert "#define NF4T_LUT NF4T_LUT_GLOBAL\n" in src
    assert {f"#define NF4T_LUT_{v.upper()}" for v in D.knob("lut").values} <= {x.rsplit(" ", 1)[0] for x in src.split("\n")}
    assert D.template_files(preset("bnb-like")) == ("codes.cuh", "dequant.cu")
    assert src.endswith(template_source("dequant.cu"))
    assert src.index(template_source("codes.cuh")) < src.index(template_source("dequant.cu"))
    with pytest.raises(ValueError):
        render("dequant.cu", {"NF4T_LUT": 2.5})
    with pytest.raises(ValueError, match="names no defined constant"):
        render("dequant.cu", {"NF4T_LUT": "NF4T_LUT_TEXTURE"}, {"NF4T_LUT_GLOBAL": 1})
    with pytest.raises(ValueError):
        template_source("missing.cu")


def test_no_template_file_is_over_1000_lines_and_every_one_is_used():
    """The templates are files a reader can take in: none over 1,000 lines, each one some family joins."""
    from nf4tune.families import FAMILIES
    from nf4tune.kernel_templates import templates

    used = {f for fam in FAMILIES.values() for f in fam.all_template_files()}
    assert set(templates()) == used
    for name in templates():
        assert template_source(name).count("\n") <= 1000, name


def test_a_sample_of_the_space_compiles_in_parallel(compile_cache):
    reps = list(D.distinct_sources(D.iter_space()).values())
    sample = random.Random(0).sample(reps, 24)
    summary = C.compile_many(sample, "sm_90", workers=2, cache_dir=compile_cache)
    assert summary.failures == []
    assert summary.compiled == 24


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
def test_every_three_source_knob_values_together_compile(arch, compile_cache):
    """A covering sample of the dequant space (every combination of 3 source-knob values that a
    source has) for the H200 and for archs no machine here has; the whole space is the slow test."""
    sample = D.covering_sources(D.iter_sources(), 3)
    summary = C.compile_many(sample, arch, workers=os.cpu_count(), cache_dir=compile_cache)
    assert summary.sources == len(sample) >= 50
    assert summary.failures == [], summary.failures[:3]
    assert summary.compiled == summary.sources


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
def test_every_distinct_source_compiles(arch, compile_cache):
    """The whole dequant space for the H200 and for archs no machine here has (B200, RTX 5090)."""
    configs = list(D.iter_sources())
    summary = C.compile_many(configs, arch, workers=os.cpu_count(), cache_dir=compile_cache)
    print(f"{arch}: {summary.sources} sources, {summary.seconds:.0f} s, max registers {summary.max_registers}, "
          f"{summary.spilling} with spills")
    assert summary.sources == len(configs) == D.count().sources
    assert summary.failures == [], summary.failures[:3]
    assert summary.compiled == summary.sources


def test_sass_loops_count_the_body_and_the_first_arms():
    """nf4tune.kernel.sass on a hand-written listing: one loop of 9 instructions whose if/else's second arm
    (3 instructions, jumped over by the unconditional branch) is left out of the path; a short loop
    below the minimum and a forward-only branch are not loops."""
    from nf4tune.kernel.sass import loops

    lines = ["        /*0000*/                   S2R R0, SR_TID.X ;",
             ".L_x_0:",
             "        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;",
             "        /*0020*/              @P0 BRA `(.L_x_1) ;",
             "        /*0030*/                   LDG.E R2, desc[UR4][R4.64] ;",
             "        /*0040*/                   BRA `(.L_x_2) ;",
             ".L_x_1:",
             "        /*0050*/                   LDC R3, c[0x0][0x210] ;",
             "        /*0060*/                   IMAD R2, R3, 0x2, RZ ;",
             "        /*0070*/                   MOV R6, R2 ;",
             ".L_x_2:",
             "        /*0080*/                   FFMA R7, R2, R2, R7 ;",
             "        /*0090*/              @P1 BRA `(.L_x_0) ;",
             ".L_x_3:",
             "        /*00a0*/                   NOP ;",
             "        /*00b0*/              @P2 BRA `(.L_x_3) ;",
             "        /*00c0*/                   EXIT ;"]
    found = loops("\n".join(lines), min_len=5)
    assert len(found) == 1
    lp = found[0]
    assert (lp.start, lp.end, lp.static, lp.path) == (1, 9, 9, 6)
    assert dict(lp.mix) == {"IADD3": 1, "BRA": 3, "LDG": 1, "FFMA": 1}
    assert len(loops("\n".join(lines), min_len=2)) == 2


def _listing(*loops_text) -> str:
    """A hand-written SASS listing: each loop a label, its body and a backward branch to the label."""
    lines, addr = ["        /*0000*/                   S2R R0, SR_TID.X ;"], 0x10
    for i, body in enumerate(loops_text):
        lines.append(f".L_x_{i}:")
        for text in body + [f"@P1 BRA `(.L_x_{i})"]:
            lines.append(f"        /*{addr:04x}*/                   {text} ;")
            addr += 0x10
    lines.append(f"        /*{addr:04x}*/                   EXIT ;")
    return "\n".join(lines)


def test_the_steady_loop_is_the_inner_unchecked_nested_loop_and_its_w_bytes_per_instruction():
    """nf4tune.kernel.sass.steady_loop on a hand-written listing: of the loops that load W by streaming loads
    (LDG .NA), the one that loads nested statistics (8- or 16-bit loads) and has no predicated (bounds-checked)
    global loads; its W bytes are the widths of its W loads (16 + 16 + 8 per lane), its density 32 x bytes /
    instructions. A loop without W loads is none; a listing without any is a ValueError."""
    from nf4tune.kernel.sass import load_width, steady_loop

    stats = ["LDG.E.U8.CONSTANT R9, desc[UR4][R10.64]", "LDG.E.CONSTANT R11, desc[UR4][R12.64]"]
    checked = ["@!P0 LDG.E.NA.128.CONSTANT R4, desc[UR4][R2.64]"] + stats + ["HMMA.16816.F32.BF16 R20, R4, R8, R20"] * 4
    plain = ["LDG.E.NA.128.CONSTANT R4, desc[UR4][R2.64]", "LDG.E.CONSTANT R11, desc[UR4][R12.64]"] + [
        "HMMA.16816.F32.BF16 R20, R4, R8, R20"] * 4
    fast = (["LDG.E.NA.128.CONSTANT R4, desc[UR4][R2.64]", "LDG.E.NA.128.CONSTANT R4, desc[UR4][R2.64+0x10]",
             "LDG.E.NA.64.CONSTANT R6, desc[UR4][R2.64+0x20]"] + stats + ["PRMT R1, R4, 0x7604, R3", "LDS R1, [R1]"] * 3
            + ["HMMA.16816.F32.BF16 R20, R4, R8, R20"] * 4)
    other = ["FFMA R1, R2, R3, R1"] * 12
    d = steady_loop(_listing(checked, plain, fast, other), min_len=5)
    assert (d.w_bytes, d.w_loads, d.nested) == (40, 3, True)
    assert d.instructions == len(fast) + 1 and d.loop.path == d.instructions
    assert d.bytes_per_instruction == pytest.approx(32 * 40 / (len(fast) + 1))
    assert d.to_dict()["hmma"] == 4
    assert steady_loop(_listing(checked, plain), min_len=5).w_loads == 1          # nested, though checked
    assert not steady_loop(_listing(plain), min_len=5).nested
    assert [load_width(t) for t in fast[:5]] == [16, 16, 8, 1, 4]
    with pytest.raises(ValueError, match="streaming loads"):
        steady_loop(_listing(other), min_len=5)


def test_snapshots_compare_a_knob_added_since_at_its_default(tmp_path):
    """compare_snapshots matches a config of the later snapshot that has a knob the earlier one lacks when that
    knob is at its default (what an added knob's default must leave unchanged), and reports it missing else."""
    import json

    from nf4tune.kernel.sass import compare_snapshots

    c = preset("blog")
    before, after = tmp_path / "before", tmp_path / "after"
    for folder, rows in ((before, [dict(family="dequant", knobs={k: v for k, v in c.to_dict().items()
                                                                   if k != "store"}, registers=30, file="a.sass")]),
                         (after, [dict(family="dequant", knobs=c.to_dict(), registers=30, file="a.sass")])):
        folder.mkdir()
        (folder / "a.sass").write_text("SASS")
        (folder / "index.json").write_text(json.dumps(rows))
    assert D.defaults["store"] == c.store and compare_snapshots(before, after) == []
    rows = json.loads((after / "index.json").read_text())
    rows[0]["knobs"]["store"] = next(v for v in D.knob("store").values if v != c.store)
    (after / "index.json").write_text(json.dumps(rows))
    assert [line.startswith("missing") for line in compare_snapshots(before, after)] == [True]


def _final(shape, m, bnb_us, rows, gpu="NVIDIA H100 80GB HBM3"):
    """An exhaustive report as `bench --exhaustive -o` writes it: rows are (label, status, us, knobs)."""
    results = [dict(label="bnb matmul_4bit", config=None, status="reference", median_us=bnb_us, pct_copy=30.0)]
    results += [dict(label=lab, config=dict(mma="simt", m=m, **knobs), status=st, median_us=us, pct_copy=70.0)
                for lab, st, us, knobs in rows]
    prob = dict(family="matmul", shape=list(shape), dtype="bf16", quant="nf4", blocksize=64, m=m)
    return dict(problem=prob, final=dict(problem=prob, results=results, peer_label="bnb matmul_4bit",
                                         gpu_before=dict(gpu_name=gpu)))



def test_sass_snapshots_compare_byte_for_byte(tmp_path):
    """nf4tune.kernel.sass's identity check (run before and after a change to the templates or a family):
    the same configs give the same SASS; a changed kernel or a missing config is reported."""
    from nf4tune.kernel.sass import compare_snapshots, find_nvdisasm, identity_sample, snapshot

    try:
        find_nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    sample = identity_sample(D, strength=1)
    assert len(sample) >= 5 and len(D.distinct_sources(sample)) == len(sample)
    configs = [preset("blog"), preset("bnb-like")]
    snapshot(configs, tmp_path / "a")
    snapshot(configs, tmp_path / "b")
    assert compare_snapshots(tmp_path / "a", tmp_path / "b") == []
    snapshot([configs[0], configs[1].replace(store="streaming")], tmp_path / "c")
    diff = compare_snapshots(tmp_path / "a", tmp_path / "c")
    assert len(diff) == 1 and "missing" in diff[0]
    (tmp_path / "b" / "dequant-0000.sass").write_text("changed")
    assert ["different SASS" in line for line in compare_snapshots(tmp_path / "a", tmp_path / "b")] == [True]


def test_the_cubin_records_the_registers_the_log_says_and_a_cache_entry_without_them_reads_them(tmp_path):
    """ptxas's "Used N registers" line is not in every compile log (a GPU machine's NVRTC gave none for one
    kernel): the CUBIN's .nv.info REGCOUNT is the same count, and a cached entry without it takes that."""
    import json

    from nf4tune.families import MATMUL as MM
    from nf4tune.kernel.compiler import cubin_registers

    configs = [MM.config(load_bytes=16, rows_per_warp=2, mtile=1, warps=2, ksplit=4, m=1),
               MM.config(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, lut="pairx",
                         astage="shared", span=2, m=1),
               D.config()]
    seen = set()
    for c in configs:
        k = C.compile_config(c, "sm_90", cache_dir=tmp_path)
        assert k.registers and cubin_registers(k.cubin) == k.registers
        seen.add(k.registers)
        meta_path = next(tmp_path.glob(f"*/{k.key}.json"))
        meta = json.loads(meta_path.read_text())
        meta["registers"] = None
        meta_path.write_text(json.dumps(meta))
        again = C.compile_config(c, "sm_90", cache_dir=tmp_path)
        assert again.cached and again.registers == k.registers
    assert len(seen) > 1                                  # the counts differ: not one constant read back
    assert cubin_registers(b"not an ELF file") is None
