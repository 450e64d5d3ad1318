"""NVRTC compilation on the CPU: CUBIN for named archs, the cache, errors, the whole space."""

import os
import random

import pytest

from kernel_templates import render, template_source
from tuner import compiler as C
from tuner import space as S


def _cubin_arch(cubin: bytes) -> int:
    # CUDA cubins (ELF ABI version 8, CUDA 12.8+) keep the SM version in bits 8..15 of e_flags
    assert cubin[:4] == b"\x7fELF"
    e_flags = int.from_bytes(cubin[48:52], "little")
    return (e_flags >> 8) & 0xFF


@pytest.mark.parametrize("arch", C.SUPPORTED_ARCHS)
def test_presets_compile_to_cubin_for_each_arch(arch, compile_cache):
    for name in S.PRESETS:
        k = C.compile_config(S.preset(name), arch, cache_dir=compile_cache)
        assert k.cubin[:4] == b"\x7fELF"
        assert _cubin_arch(k.cubin) == int(arch[3:])
        assert k.registers and k.registers > 0
        assert k.spill_stores is not None


def test_second_compile_is_a_cache_hit(tmp_path):
    c = S.preset("blog", "fp16", "fp4")
    first = C.compile_config(c, "sm_90", cache_dir=tmp_path)
    second = C.compile_config(c, "sm_90", cache_dir=tmp_path)
    assert not first.cached and second.cached
    assert first.cubin == second.cubin and first.key == second.key
    # a different arch or source is a different key
    assert C.compile_config(c, "sm_80", cache_dir=tmp_path).key != first.key
    assert C.compile_config(c.replace(store="streaming"), "sm_90", cache_dir=tmp_path).key != first.key


def test_corrupt_cache_entry_is_recompiled(tmp_path):
    c = S.preset("blog")
    k = C.compile_config(c, "sm_90", cache_dir=tmp_path)
    path = tmp_path / k.key[:2] / f"{k.key}.cubin"
    path.write_bytes(b"garbage")
    again = C.compile_config(c, "sm_90", cache_dir=tmp_path)
    assert not again.cached and again.cubin == k.cubin


def test_compile_error_carries_the_nvrtc_log(tmp_path):
    with pytest.raises(C.CompileError) as e:
        C.compile_source("extern \"C\" __global__ void k() { undefined_thing(); }", "sm_90", cache_dir=tmp_path)
    assert "undefined_thing" in e.value.log


def test_unknown_arch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unsupported arch"):
        C.compile_config(S.preset("blog"), "sm_75", cache_dir=tmp_path)


def test_render_sets_every_knob_macro():
    src = render(S.preset("bnb-like").source_knobs())
    assert "#define NF4T_BYTES 8" in src and "#define NF4T_LUT 1" in src and "#define NF4T_INDEX 0" in src
    assert src.endswith(template_source())
    with pytest.raises(ValueError):
        render(dict(S.preset("blog").source_knobs(), lut="texture"))


def test_a_sample_of_the_space_compiles_in_parallel(compile_cache):
    reps = list(S.distinct_sources(S.iter_space()).values())
    sample = random.Random(0).sample(reps, 24)
    summary = C.compile_many(sample, "sm_90", workers=2, cache_dir=compile_cache)
    assert summary.failures == []
    assert summary.compiled == 24


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_every_distinct_source_compiles(arch, compile_cache):
    configs = list(S.iter_space())
    summary = C.compile_many(configs, arch, workers=os.cpu_count(), cache_dir=compile_cache)
    print(f"{arch}: {summary.sources} sources, {summary.seconds:.0f} s, max registers {summary.max_registers}, "
          f"{summary.spilling} with spills")
    assert summary.sources == len(S.distinct_sources(configs))
    assert summary.failures == [], summary.failures[:3]
    assert summary.compiled == summary.sources
