"""The matmul family's compiled kernels on the CPU (NVRTC, sm_90): what the knobs of the row-tile path do
to the registers and to the SASS of the main loops (nvdisasm), stated as relations: fewer registers with a
knob than without, no spills, the CTA launches, the same mmas and loads per group, instructions per byte no
more than another structure's."""

import pytest

from nf4tune.families import MATMUL as MM
from nf4tune.family import DeviceLimits
from nf4tune.vocabulary import InvalidConfig

LIMITS = DeviceLimits(sm_count=132)


def _launches(k, warps):
    """A CTA of ``warps`` warps at the compiled kernel's registers launches on an SM of 65,536 registers
    (sm_90; each register sub-partition holds its warps), and nothing spills."""
    return LIMITS.registers_refusal(k.registers, warps * 32) is None and not k.spill_stores


def _warps_that_fit(registers):
    """The most warps of ``registers`` registers an SM's register file holds (its 4 sub-partitions)."""
    return max(w for w in range(1, 65) if LIMITS.registers_refusal(registers, w * 32) is None)


def _shortest_loop(cubin):
    """The loop of at least 150 instructions with the shortest path in ``cubin``'s SASS (a kernel's main loop)."""
    from nf4tune.kernel.sass import disassemble, loops

    return min(loops(disassemble(cubin), min_len=150), key=lambda lp: lp.path)


def _nvdisasm_found() -> bool:
    from nf4tune.kernel.sass import find_nvdisasm

    try:
        find_nvdisasm()
    except FileNotFoundError:
        return False
    return True


def test_the_span_loop_loads_w_in_16_bytes_with_fewer_instructions_per_byte(compile_cache):
    """What span buys, in the SASS (sm_90): at blocksize 64 the 16-byte loads of span 2 (groups of 2 windows,
    64 packed bytes per lane with the prefetch) replace the 8-byte loads of span 1 (groups of 4): W's loads in
    the loop are all 16 bytes wide and the loop's shortest path takes no more instructions per packed byte."""
    from nf4tune.kernel.compiler import compile_config
    from nf4tune.kernel.sass import disassemble, find_nvdisasm, loops

    try:
        find_nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    rows = dict(mma="mma-rows", rows_per_warp=16, mtile=8, warps=14, scale="block", astage="shared", lut="pairx",
                prefetch=1, m=1)
    per_byte, widths = {}, {}
    for span, load, unroll in ((1, 8, 4), (2, 16, 2)):
        c = MM.config(**rows, load_bytes=load, unroll=unroll, span=span)
        sass = disassemble(compile_config(c, "sm_90", cache_dir=compile_cache).cubin)
        found = loops(sass, min_len=150)
        assert len(found) >= 3, (span, found)
        best = min(found, key=lambda lp: lp.path)
        per_byte[span] = best.path / 64
        assert dict(best.mix).get("HMMA", 0) == 16
        widths[span] = {w for w in ("LDG.E.NA.128", "LDG.E.NA.64") if w in sass}
    assert widths == {1: {"LDG.E.NA.64"}, 2: {"LDG.E.NA.128"}}, widths
    assert per_byte[2] <= per_byte[1], per_byte
    # the byte-permute decode on the same loop: no table lookups (its shared loads are A's chunks only), the
    # codes from register byte tables at about 3.5 permutes per packed byte
    c = MM.config(**dict(rows, lut="prmt"), load_bytes=16, unroll=2, span=2)
    best = _shortest_loop(compile_config(c, "sm_90", cache_dir=compile_cache).cubin)
    mix = dict(best.mix)
    assert mix.get("LDS", 0) <= 12 and mix.get("PRMT", 0) >= 3 * 64 and mix.get("HMMA", 0) == 16, mix


def test_prmt_quarters_move_a_quarter_of_the_lookups_each_to_permutes(compile_cache):
    """prmt_quarters in the SASS (sm_90) of the span loop (16-byte loads, groups of 2 windows with the prefetch:
    64 packed bytes per lane): each quarter takes 16 of the pair table's 64 shared loads out of the loop and puts
    permutes in their place (prmt's byte tables); the loads of W and the mmas stay as they are. Refused off
    mma-rows / pairx and with 4-byte loads."""
    from nf4tune.kernel.compiler import compile_config
    from nf4tune.kernel.sass import find_nvdisasm

    try:
        find_nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    rows = dict(mma="mma-rows", rows_per_warp=16, mtile=8, warps=14, scale="block", astage="shared", lut="pairx",
                prefetch=1, m=1, load_bytes=16, unroll=2, span=2)
    mix, path = {}, {}
    for q in (0, 1, 2):
        c = MM.config(**rows, prmt_quarters=q)
        best = _shortest_loop(compile_config(c, "sm_90", cache_dir=compile_cache).cubin)
        mix[q], path[q] = dict(best.mix), best.path
    for q in (1, 2):
        assert mix[q].get("LDS", 0) == mix[0].get("LDS", 0) - 16 * q, (q, mix[q], mix[0])
        assert mix[q].get("PRMT", 0) > mix[q - 1].get("PRMT", 0) and path[q] > path[q - 1], (q, mix, path)
        assert mix[q].get("HMMA") == mix[0].get("HMMA") == 16 and mix[q].get("LDG") == mix[0].get("LDG")
    for bad in (dict(rows, lut="pair"), dict(rows, mma="mma-ks", astage="global", span=1, warps=8, prefetch=0),
                dict(rows, load_bytes=4, span=1, unroll=1)):
        with pytest.raises(InvalidConfig, match="prmt_quarters"):
            MM.config(**dict(bad, prmt_quarters=1))


def test_a_register_cap_bounds_the_registers_and_fits_more_warps(compile_cache):
    """regcap renders __maxnreg__ on mma-rows' kernel (sm_90): on the served M = 16 shape of the H100 (8-byte
    loads, unroll 4, no prefetch) the capped kernel takes at most the cap and no more registers than the
    uncapped one, so an SM holds at least as many of its warps (more wherever the cap binds); the cap keeps the
    loop's HMMAs and W loads. Refused off mma-rows and with stream-K."""
    from nf4tune.kernel.compiler import compile_config

    rows = dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=16, warps=12, ksplit=4, scale="block",
                lut="pair", astage="shared", unroll=4, prefetch=0, m=16)
    uncapped = MM.config(**rows)
    assert MM.macros(uncapped)["NF4T_REGCAP"] == 0 and "rc" not in uncapped.short()
    free = compile_config(uncapped, "sm_90", cache_dir=compile_cache)
    assert not free.spill_stores, free.registers
    free_loop = _shortest_loop(free.cubin) if _nvdisasm_found() else None
    for cap in (80, 72):
        c = MM.config(**rows, regcap=cap)
        assert MM.macros(c)["NF4T_REGCAP"] == cap and f" rc{cap} " in c.short(), c.short()
        k = compile_config(c, "sm_90", cache_dir=compile_cache)
        assert k.registers <= min(cap, free.registers), (cap, k.registers, free.registers)
        assert _warps_that_fit(k.registers) >= _warps_that_fit(free.registers)
        if free.registers > cap:
            assert _warps_that_fit(k.registers) > _warps_that_fit(free.registers), (cap, k.registers)
        if free_loop is not None:
            capped_loop = _shortest_loop(k.cubin)
            for op in ("HMMA", "LDG"):
                assert dict(capped_loop.mix).get(op) == dict(free_loop.mix).get(op), (cap, op)
    for bad in (dict(rows, persist=1, mtile=8, m=8), dict(mma="simt", m=1),
                dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=8, lut="pair", scale="block",
                     unroll=2, m=8)):
        with pytest.raises(InvalidConfig, match="regcap"):
            MM.config(**dict(bad, regcap=80))


def test_a_chunk_at_a_time_frees_registers_and_keeps_the_loop(compile_cache):
    """achunk reads A's runs a 16-byte chunk at a time, next to its k-steps, instead of a window's at once
    (sm_90): the served M = 16 shape of the H100 and the 16-byte span-2 32-row batch tile both take fewer
    registers with it than without, without spills, so an SM holds at least as many of their warps, and the
    loop keeps its HMMAs, W loads and A's shared loads (only their order changes). Refused off mma-rows."""
    from nf4tune.kernel.compiler import compile_config

    sass = _nvdisasm_found()
    shapes = (
        dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=16, warps=14, ksplit=2, scale="block",
             lut="pair", astage="shared", unroll=4, prefetch=0, m=16),
        dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=32, span=2, warps=8, ksplit=2, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1, m=16),
    )
    for knobs in shapes:
        whole = MM.config(**knobs)
        chunk = MM.config(**knobs, achunk=1)
        assert MM.macros(whole)["NF4T_ACHUNK"] == 0 and " ac" not in whole.short()
        assert MM.macros(chunk)["NF4T_ACHUNK"] == 1 and " ac1 " in chunk.short(), chunk.short()
        kw = compile_config(whole, "sm_90", cache_dir=compile_cache)
        kc = compile_config(chunk, "sm_90", cache_dir=compile_cache)
        assert not kc.spill_stores and not kc.spill_loads, chunk.short()
        assert kc.registers < kw.registers, (chunk.short(), kw.registers, kc.registers)
        assert _warps_that_fit(kc.registers) >= _warps_that_fit(kw.registers), (kw.registers, kc.registers)
        assert _launches(kc, chunk.warps), (chunk.short(), kc.registers)
        if sass:
            lw = _shortest_loop(kw.cubin)
            lc = _shortest_loop(kc.cubin)
            for op in ("HMMA", "LDG", "LDS"):
                assert dict(lc.mix).get(op) == dict(lw.mix).get(op), (chunk.short(), op)
    with pytest.raises(InvalidConfig, match="achunk"):
        MM.config(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=8, lut="pair", scale="block",
                  unroll=2, m=8, achunk=1)


def test_two_groups_ahead_fit_a_16_warp_cta_and_keep_the_loop(compile_cache):
    """prefetch 2 on the span loop (sm_90): no spills, 16 warps with the 8-row batch tile still fit an SM's registers,
    and the loop computes what prefetch 1's does (the same mmas and W loads per group: only the issue point
    moves). Refused off mma-rows, off 16-byte loads, and past its registers of loads in flight."""
    from nf4tune.kernel.compiler import compile_config
    from nf4tune.kernel.sass import find_nvdisasm

    try:
        find_nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    rows = dict(mma="mma-rows", rows_per_warp=16, mtile=8, warps=16, scale="block", astage="shared", lut="pairx",
                m=1, load_bytes=16, unroll=2, span=2)
    mix = {}
    for pf in (1, 2):
        k = compile_config(MM.config(**rows, prefetch=pf), "sm_90", cache_dir=compile_cache)
        assert _launches(k, 16), (pf, k.registers)
        mix[pf] = dict(_shortest_loop(k.cubin).mix)
    for op in ("HMMA", "LDG"):
        assert mix[2].get(op) == mix[1].get(op) and mix[1].get(op), (op, mix)
    for bad in (dict(rows, mma="simt", load_bytes=16, rows_per_warp=4, mtile=1, span=1, unroll=1, warps=8),
                dict(rows, mma="mma-ks", astage="global", span=1, warps=8),
                dict(rows, load_bytes=8, span=1)):
        with pytest.raises(InvalidConfig, match="prefetch 2"):
            MM.config(**dict(bad, prefetch=2))
    with pytest.raises(InvalidConfig, match="registers of loads in flight"):
        MM.config(**dict(rows, rows_per_warp=32, prefetch=2))


def test_the_row_tile_loop_takes_about_half_the_instructions_per_byte_of_simts(compile_cache):
    """Why mma-rows exists, checked in the SASS (sm_90): the full path of its loop (8-byte loads, 16-row
    warps, groups of 4 windows, the prefetch: 64 packed bytes per lane) costs at most 0.6 of the
    instructions per packed byte of SIMT's served loop (16-byte loads, 4 rows, the prefetch: 64 bytes
    per lane). The shortest path of each kernel's loops is compared (both: plain statistics, full warps)."""
    from nf4tune.kernel.compiler import compile_config
    from nf4tune.kernel.sass import disassemble, find_nvdisasm, loops

    try:
        find_nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    simt = MM.config(load_bytes=16, rows_per_warp=4, warps=14, lut="pairx", prefetch=1, astage="shared", m=1)
    rows = MM.config(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=16, scale="block",
                     astage="shared", lut="pairx", unroll=4, prefetch=1, m=1)
    per_byte = {}
    for name, c, step_bytes in (("simt", simt, 4 * 16), ("rows", rows, 4 * 2 * 8)):
        found = loops(disassemble(compile_config(c, "sm_90", cache_dir=compile_cache).cubin), min_len=200)
        assert len(found) >= 3, (name, found)                     # the three instantiations of the steps
        per_byte[name] = min(lp.path for lp in found) / step_bytes
        assert dict(found[0].mix).get("HMMA" if name == "rows" else "FFMA", 0) >= 16
    assert per_byte["rows"] <= 0.6 * per_byte["simt"], per_byte


def test_stream_k_slices_keep_the_one_slice_loop(compile_cache):
    """The stream-K kernel calls a slice function per slice (mma_rows.cu: inlined in the run's loop, ptxas added
    the pair table's base to every lookup): at the served span shape (sm_90), its group loops hold no local
    memory, keep the mmas and W loads per group, take at most 10% more instructions than the one-slice kernel's,
    and 16 warps fit."""
    from nf4tune.kernel.compiler import compile_config
    from nf4tune.kernel.sass import disassemble, find_nvdisasm, loops

    try:
        find_nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    rows = dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, scale="block", astage="shared",
                lut="pairx", unroll=2, prefetch=1, span=2, warps=16, m=1)
    group = {}
    for persist in (0, 1):
        k = compile_config(MM.config(**rows, persist=persist), "sm_90", cache_dir=compile_cache)
        # (the stream-K kernel's call saves registers to local memory once per slice: no spill check here, the
        # loops are checked for local memory below)
        assert LIMITS.registers_refusal(k.registers, 16 * 32) is None, (persist, k.registers)
        found = [lp for lp in loops(disassemble(k.cubin), min_len=150) if dict(lp.mix).get("HMMA")]
        assert found and not any(dict(lp.mix).get("LDL") or dict(lp.mix).get("STL") for lp in found), persist
        group[persist] = min(found, key=lambda lp: lp.path)
    for op in ("HMMA", "LDG"):
        assert dict(group[1].mix).get(op) == dict(group[0].mix).get(op), op
    assert group[1].path <= 1.1 * group[0].path, (group[0].path, group[1].path)


def test_every_wrong_kernel_mutation_finds_its_line():
    """The GPU tests' wrong kernels (tests/wrong_kernels.py) each change one line that the template still holds
    exactly once: a template edit that moves a line fails here, on the CPU."""
    from wrong_kernels import MUTATIONS, wrong_source

    for name, (config, old, new) in MUTATIONS.items():
        changed = wrong_source(name)
        assert changed != config.render() and new in changed, name


#: one config of each structure (the bulk feed is mma-ks with a producer warp; stream-K is mma-rows persist)
PDL_STRUCTURES = [
    MM.config(mma="simt", load_bytes=16, rows_per_warp=2, mtile=1, warps=16, lut="pairx", astage="shared",
              prefetch=1, m=1),
    MM.config(mma="mma", rows_per_warp=16, mtile=8, warps=4, scale="value", m=8),
    MM.config(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=16, warps=8, lut="pairx", m=16),
    MM.config(mma="mma-ks", load_bytes=8, rows_per_warp=16, mtile=8, warps=2, stages=2, feed="bulk", m=8),
    MM.config(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, lut="pairx", astage="shared",
              prefetch=1, unroll=2, span=2, m=1),
    MM.config(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=8, persist=1, lut="pairx",
              astage="shared", m=1),
    MM.config(mma="mma-cols", load_bytes=16, rows_per_warp=16, mtile=1, warps=8, lut="pairx", astage="shared",
              prefetch=1, m=1),
]


@pytest.mark.parametrize("config", PDL_STRUCTURES, ids=lambda c: c.short().replace(" ", "-"))
def test_pdl_adds_the_grid_dependency_wait_outside_the_main_loop(config, compile_cache):
    """pdl 1 compiles each structure with one griddepcontrol.wait (SASS ACQBULK) and one launch_dependents
    (PREEXIT), which pdl 0 lacks, outside the main loop: its trip at most one instruction longer (ptxas schedules
    the prologue around the wait; the experimental mma path's trip came out one shorter) and registers within 8."""
    from nf4tune.kernel.compiler import compile_config
    from nf4tune.kernel.sass import disassemble, find_nvdisasm, instructions, loops, opcode

    try:
        find_nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    kernels = [compile_config(config.replace(pdl=p), "sm_90", cache_dir=compile_cache) for p in (0, 1)]
    sass = [disassemble(k.cubin) for k in kernels]

    def count(text, op):
        return sum(1 for t in instructions(text)[0] if opcode(t) == op)

    assert [count(s, "ACQBULK") for s in sass] == [0, 1]
    assert [count(s, "PREEXIT") for s in sass] == [0, 1]
    inner = [min(lp.path for lp in loops(s, min_len=20)) for s in sass]
    assert inner[1] <= inner[0] + 1
    assert abs(kernels[0].registers - kernels[1].registers) <= 8 and not kernels[1].spill_stores


def test_pdl_is_asked_for_by_the_environment(monkeypatch):
    """NF4TUNE_PDL: 0 or unset serves plain launches without asking the GPU; a value other than 0 or 1 is an
    error that says what it takes."""
    from nf4tune.serve.matmul import pdl_enabled

    monkeypatch.delenv("NF4TUNE_PDL", raising=False)
    assert pdl_enabled(0) is False
    monkeypatch.setenv("NF4TUNE_PDL", "0")
    assert pdl_enabled(0) is False
    monkeypatch.setenv("NF4TUNE_PDL", "yes")
    with pytest.raises(ValueError, match="1 .programmatic dependent launch. or 0"):
        pdl_enabled(0)


def test_the_64_row_batch_tile_reads_w_once_at_m_64_and_at_m_32_with_span(compile_cache):
    """mtile 64 (mma-rows, experimental): a CTA takes 64 batch rows, so at M = 64 (span 1) and at M = 32 with
    span 2 (16-byte loads at blocksize 64) W is read and decoded once, where the 32-row tile reads it twice.
    In the SASS (sm_90): no spills, an 8-warp CTA launches, and its loop issues 8 n8 tiles' mmas per window:
    with the same loads of W per group as the 8-row tile and 8 times its HMMAs. The plan stages 64 rows of A
    where they fit (28672x8192 at split-K 8) and refuses, with the reason, where they do not. Refused off
    mma-rows, at 32 rows per warp, and where the batch fills at most half of it."""
    from nf4tune.families.matmul import MatmulPlan
    from nf4tune.kernel.compiler import compile_config
    from nf4tune.vocabulary import UnsupportedInput

    h100 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    rows = dict(mma="mma-rows", rows_per_warp=16, scale="block", astage="shared", lut="pairx", warps=8, ksplit=8,
                achunk=1, prefetch=1)
    for knobs in (dict(rows, load_bytes=8, span=1, unroll=2, m=64), dict(rows, load_bytes=16, span=2, unroll=1, m=32)):
        wide = MM.config(**knobs, mtile=64)
        assert wide.experimental() == ("mtile",) and " m64 " in wide.short()
        narrow = MM.config(**dict(knobs, m=8 if knobs["span"] == 1 else 4), mtile=8)
        k = compile_config(wide, "sm_90", cache_dir=compile_cache)
        assert _launches(k, 8), (wide.short(), k.registers)
        if _nvdisasm_found():
            mw, _ = _per_group(k.cubin, wide)
            mn, _ = _per_group(compile_config(narrow, "sm_90", cache_dir=compile_cache).cubin, narrow)
            assert mw["HMMA"] == 8 * mn["HMMA"] and mw["LDG"] == mn["LDG"], (mw, mn)
        plan = MatmulPlan(wide, knobs["m"], 28672, 8192, 64, 256, h100, k.registers, "cpu")
        assert plan.smem <= h100.smem_per_block_optin
        with pytest.raises(UnsupportedInput, match="shared memory"):
            MatmulPlan(wide.replace(ksplit=1), knobs["m"], 28672, 8192, 64, 256, h100, k.registers, "cpu")
    for bad in (dict(mma="mma-ks", load_bytes=8, rows_per_warp=16, warps=8, lut="pair", scale="block", m=64),
                dict(rows, load_bytes=8, span=1, unroll=2, m=32), dict(rows, load_bytes=8, span=1, unroll=2, m=64,
                                                                       rows_per_warp=32)):
        with pytest.raises(InvalidConfig):
            MM.config(**bad, mtile=64)


def _per_group(cubin, config):
    """The steady-state loop's mix and path per group of ``config`` (mma-rows: unroll windows of 2 rows of
    each m16 tile a lane; sass.steady_loop)."""
    from nf4tune.kernel.sass import disassemble, steady_loop

    d = steady_loop(disassemble(cubin))
    group = config.unroll * (config.rows_per_warp // 16) * 2 * config.load_bytes
    groups = d.w_bytes / group
    assert groups == int(groups) and groups >= 1, (d.w_bytes, group)
    return {op: n / groups for op, n in d.loop.mix}, d.instructions / groups
