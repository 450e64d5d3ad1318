"""GPU tests: the gate against bnb's CUDA dequantize_4bit, and the launcher's input checks."""

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from nf4tune.families import DEQUANT as D
from nf4tune.families.dequant import odd_shape
from nf4tune.kernel.launch import LoadedKernel, load_kernel
from nf4tune.measure.gate import check_config
from nf4tune.vocabulary import DTYPES, QUANTS, Problem, UnsupportedInput

LUTS = D.knob("lut").values
INDEXES = D.knob("index").values


def preset(name, dtype="bf16", quant="nf4"):
    return D.preset(name, dtype=dtype, quant=quant)


@pytest.fixture(scope="module", autouse=True)
def precompiled():
    """Compile the configs of this module in parallel once (the disk cache serves the rest)."""
    from nf4tune.kernel.compiler import compile_many, visible_arch

    configs = [preset("blog", d, q).replace(lut=l, index=i) for d in DTYPES for q in QUANTS
               for l in LUTS for i in INDEXES]
    summary = compile_many(configs, visible_arch())
    assert summary.failures == []


@pytest.mark.parametrize("blocksize", [64, 128])
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_lut_and_index_mode_is_bit_exact(seed, dtype, quant, blocksize):
    prob = Problem((333, 4097), dtype, quant, blocksize)    # odd count, odd row length
    for lut in LUTS:
        for index in INDEXES:
            c = preset("blog", dtype, quant).replace(lut=lut, index=index)
            r = check_config(c, prob, seed=seed, shapes=[prob.shape, odd_shape(prob.shape), (1,), (3,)])
            assert r.ok, f"{c.short()}: {r.reason}"


@pytest.mark.parametrize("knobs", [
    dict(bytes_per_thread=1, unroll=8, threads=64),
    dict(bytes_per_thread=2, unroll=4, store="streaming"),
    dict(bytes_per_thread=8, unroll=2, grid="persistent", ctas_per_sm=2),
    dict(bytes_per_thread=16, unroll=1, threads=1024, lut="register", index="hoisted"),
    dict(bytes_per_thread=16, threads=128, grid="persistent", ctas_per_sm=1, store="streaming"),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_widths_unroll_and_grids_are_bit_exact(seed, knobs, dtype):
    c = preset("blog", dtype, "nf4").replace(**knobs)
    r = check_config(c, Problem((1000, 1001), dtype, "nf4", 64), seed=seed)
    assert r.ok, f"{c.short()}: {r.reason}"


def test_presets_are_bit_exact_on_every_blocksize(seed):
    for bs in (32, 64, 256, 1024, 4096):
        for name in D.presets:
            r = check_config(preset(name), Problem((257, 515), "bf16", "nf4", bs), seed=seed)
            assert r.ok, f"{name} bs{bs}: {r.reason}"


def _wrong_kernel(config, change):
    src = config.render()
    bad = change(src)
    assert bad != src
    return LoadedKernel(config, source=bad)


def test_gate_rejects_swapped_nibbles(seed):
    c = preset("blog")
    k = _wrong_kernel(c, lambda s: s.replace("lut(byte >> 4), sc)", "lut(byte & 15u), scx)")
                      .replace("lut(byte & 15u), sc)", "lut(byte >> 4), sc)").replace("scx)", "sc)"))
    r = check_config(c, Problem((512, 512)), seed=seed, kernel=k)
    assert not r.ok and "differ from bnb" in r.reason and "first at flat index" in r.reason


def test_gate_rejects_fused_multiply_add_in_the_scale(seed):
    c = preset("blog")
    # fp32 output shows a one-ulp change of the scale; bf16 would round most of them away
    r = check_config(c.replace(dtype="fp32"), Problem((4096, 4096), "fp32"), seed=seed,
                     kernel=_wrong_kernel(c.replace(dtype="fp32"), lambda s: s.replace(
                         "__fadd_rn(__fmul_rn(s.code2[s.absmax_q[b]], s.absmax2[g]), s.offset)",
                         "__fmaf_rn(s.code2[s.absmax_q[b]], s.absmax2[g], s.offset)")))
    assert not r.ok, "an FMA in the absmax decode must differ from bnb in the last bit somewhere"


def test_launcher_refuses_what_it_cannot_handle(seed):
    from dataclasses import replace

    prob = Problem((64, 64))
    inputs = D.make_inputs(prob, prob.shape, seed)
    A = inputs.A
    k = load_kernel(preset("blog").replace(bytes_per_thread=16))
    out = torch.empty(prob.shape, dtype=torch.bfloat16, device="cuda")
    shifted = torch.empty(A.numel() + 16, dtype=torch.uint8, device="cuda")
    shifted[1:1 + A.numel()].copy_(A.view(-1))
    with pytest.raises(UnsupportedInput, match="aligned"):
        k(replace(inputs, A=shifted[1:1 + A.numel()]), out)
    with pytest.raises(UnsupportedInput, match="aligned"):
        k(inputs, torch.empty(4097, dtype=torch.bfloat16, device="cuda")[1:].view(64, 64))
    with pytest.raises(UnsupportedInput, match="dtype"):
        k(inputs, out.float())
    with pytest.raises(UnsupportedInput, match="elements"):
        k(inputs, out[:32])
    with pytest.raises((UnsupportedInput, RuntimeError), match="device|CUDA"):
        k(replace(inputs, A=A.cpu()), out)
    with pytest.raises(ValueError, match="bytes"):
        k(replace(inputs, A=A[:100]), out)
