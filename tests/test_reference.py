"""nf4tune.measure.reference against bitsandbytes' own CPU path, bit for bit."""

import itertools

import numpy as np
import pytest
import torch

bnb_F = pytest.importorskip("bitsandbytes.functional")

from nf4tune.measure import reference as R

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# element counts not divisible by the blocksize, by 2 or by 16; 1-D and 2-D
SHAPES = [(97, 33), (4097,), (7, 129), (64, 64)]


def _bnb_generic_dequantize(A, qs):
    """bnb's generic (pure torch) 4-bit dequantization, the path bnb itself falls back to."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    absmax = qs.absmax
    if qs.nested:
        absmax = bnb_F.dequantize_blockwise(qs.absmax, qs.state2)
        absmax += qs.offset
    return _dequantize_4bit_compute(A.reshape(-1), absmax.float(), _get_4bit_code(qs.quant_type, A.device),
                                    qs.blocksize, qs.shape, qs.dtype)


def _bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def test_dynamic_map_matches_bnb():
    assert np.array_equal(R.dynamic_map(), bnb_F.create_dynamic_map().numpy())


def test_codes_match_bnb_tables():
    assert np.array_equal(R.NF4_CODE, bnb_F.get_4bit_type("nf4", device="cpu").numpy())
    cpu_fp4 = bnb_F.get_4bit_type("fp4", device="cpu").numpy()
    assert np.array_equal(R.FP4_CODE_CPU.view(np.uint32), cpu_fp4.view(np.uint32))
    # the CUDA table differs from the CPU table only in the sign of zero at code 0b1000
    assert R.FP4_CODE[8] == 0 and np.signbit(R.FP4_CODE[8]) and not np.signbit(cpu_fp4[8])
    assert np.array_equal(np.delete(R.FP4_CODE, 8), np.delete(cpu_fp4, 8))


@pytest.mark.parametrize("blocksize", R.BLOCKSIZES)
@pytest.mark.parametrize("quant", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_and_dequantize_match_bnb(seed, dtype, quant, blocksize):
    g = torch.Generator().manual_seed(seed)
    for shape, nested in itertools.product(SHAPES, [True, False]):
        w = torch.randn(shape, generator=g).to(dtype)
        A, qs = bnb_F.quantize_4bit(w, blocksize=blocksize, quant_type=quant, compress_statistics=nested)
        A2, qs2 = R.quantize_4bit(w, blocksize=blocksize, quant_type=quant, compress_statistics=nested)
        ctx = f"seed {seed} shape {shape} nested {nested}"
        assert torch.equal(A, A2), ctx
        assert A2.shape == ((w.numel() + 1) // 2, 1) and A2.dtype == torch.uint8
        assert torch.equal(qs.absmax, qs2.absmax), ctx
        assert qs2.shape == qs.shape and qs2.dtype == qs.dtype and qs2.blocksize == qs.blocksize
        if nested:
            assert torch.equal(qs.offset, qs2.offset), ctx
            assert torch.equal(qs.state2.absmax, qs2.state2.absmax), ctx
            assert torch.equal(qs.state2.code, qs2.state2.code), ctx
            assert qs2.state2.blocksize == qs.state2.blocksize == 256

        got = R.dequantize_4bit(A, qs)        # bnb's own QuantState in
        got2 = R.dequantize_4bit(A2, qs2)     # the reference's QuantState in
        assert got.dtype == dtype and tuple(got.shape) == tuple(shape), ctx
        assert torch.equal(_bits(got), _bits(got2)), ctx
        # bnb's CPU oracles: its generic torch implementation always, and its native CPU kernel
        # where that kernel is right: with rows shorter than a block (64x64 at blocksize >= 128)
        # bnb 0.50's native CPU dequantize scales later blocks with the wrong absmax
        # (bnb's CUDA kernel, which the GPU tests compare with, does not)
        oracles = [("bnb generic", _bnb_generic_dequantize(A, qs))]
        if len(shape) == 1 or shape[-1] % 2 or shape[-1] >= blocksize:
            oracles.append(("bnb native CPU", bnb_F.dequantize_4bit(A, qs)))
        for name, want in oracles:
            same = _bits(got) == _bits(want)
            if quant == "nf4":
                assert bool(same.all()), f"{ctx} vs {name}: {int((~same).sum())} elements differ"
            else:
                # fp4 code 0b1000: -0.0 on CUDA (the reference), +0.0 on bnb's CPU paths
                nib = torch.from_numpy(R.nibbles(A.numpy(), w.numel()).astype(np.int64)).reshape(shape)
                assert bool(same[nib != 8].all()), f"{ctx} vs {name}"
                assert bool((got[nib == 8] == 0).all()) and bool(torch.signbit(got[nib == 8]).all())
                assert bool((want[nib == 8] == 0).all())


def test_nested_scale_is_two_roundings_without_fma(seed):
    """scale = fl(fl(code2[q] * absmax2[g]) + offset): differs from a fused multiply-add."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64 * 4096, generator=g)
    A, qs = R.quantize_4bit(w, blocksize=64)
    scales = R.block_scales(qs)
    q = qs.absmax.numpy()
    c2 = qs.state2.code.numpy().astype(np.float64)
    a2 = qs.state2.absmax.numpy().astype(np.float64)
    fused = (c2[q] * a2[np.arange(q.size) // 256] + float(qs.offset)).astype(np.float32)
    two = ((c2[q] * a2[np.arange(q.size) // 256]).astype(np.float32) + np.float32(qs.offset)).astype(np.float32)
    assert np.array_equal(scales, two)
    assert not np.array_equal(fused, two)  # a fused kernel with FMA would be off in the last bit


def test_transposed_packed_form_is_transposed_back():
    w = torch.randn(6, 10)
    A, qs = bnb_F.quantize_4bit(w, blocksize=64)
    At = A.t().contiguous()  # legacy [1, n] form
    got = R.dequantize_4bit(At, qs)
    want = bnb_F.dequantize_4bit(At, qs)
    assert got.shape == want.shape == (10, 6)
    assert torch.equal(_bits(got.contiguous()), _bits(want.contiguous()))


def _bnb_cpu_native(shape, blocksize) -> bool:
    """Whether bnb 0.50's CPU dequantize_4bit takes its native kernel (else its generic torch
    path): even rows, and not a blocksize >= 2048 on an AVX-512 machine."""
    from bitsandbytes.backends.cpu import ops

    return shape[-1] % 2 == 0 and not (ops._has_avx512 and blocksize >= 2048)


@pytest.mark.parametrize("blocksize", [64, 4096])
@pytest.mark.parametrize("n", [1, 2, 3, 63, 64, 65, 4096, 4097])
def test_one_dimensional_weights_have_bnb_shape(seed, n, blocksize):
    """A 1-D weight of n values dequantizes to shape (n,), as bnb's CUDA dequantize_4bit
    returns it (torch.empty(quant_state.shape); the legacy-form transpose is a no-op on 1-D),
    for the packed [(n+1)//2, 1] form and the legacy [1, (n+1)//2] form alike. bnb's CPU path
    gives the same values; its native CPU kernel (even n) shapes them (1, n), which the legacy
    shim then transposes to (n, 1); its generic path gives (n,)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=g).to(torch.bfloat16)
    for nested in (True, False):
        A, qs = bnb_F.quantize_4bit(w, blocksize=blocksize, quant_type="nf4", compress_statistics=nested)
        A2, qs2 = R.quantize_4bit(w, blocksize=blocksize, quant_type="nf4", compress_statistics=nested)
        assert tuple(qs2.shape) == tuple(qs.shape) == (n,) and A2.shape == A.shape
        for packed in (A, A.t().contiguous()):
            ctx = f"seed {seed} n {n} nested {nested} A {tuple(packed.shape)}"
            got = R.dequantize_4bit(packed, qs)
            assert tuple(got.shape) == (n,), ctx
            assert tuple(R.dequantize_4bit(packed, qs2).shape) == (n,), ctx
            want = bnb_F.dequantize_4bit(packed, qs)
            assert torch.equal(_bits(got), _bits(want.reshape(-1))), ctx
            if _bnb_cpu_native((n,), blocksize):
                cpu_shape = (n, 1) if packed.shape[0] == 1 else (1, n)
            else:
                cpu_shape = (n,)
            assert tuple(want.shape) == cpu_shape, ctx


def test_two_dimensional_weights_in_the_legacy_form_are_transposed_like_bnb(seed):
    """bnb transposes the output whenever A's first dimension is 1, also for a [1, 2] weight
    whose packed form [1, 1] is both forms at once. (nf4: with fp4, bnb's default, the CPU and
    CUDA paths differ in the sign of zero at code 0b1000, tested above.)"""
    g = torch.Generator().manual_seed(seed)
    for shape in [(1, 2), (2, 1), (1, 1), (1, 64), (3, 1)]:
        w = torch.randn(shape, generator=g)
        A, qs = bnb_F.quantize_4bit(w, blocksize=64, quant_type="nf4")
        got, want = R.dequantize_4bit(A, qs), bnb_F.dequantize_4bit(A, qs)
        assert got.shape == want.shape, shape
        assert torch.equal(_bits(got.contiguous()), _bits(want.contiguous())), shape


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="blocksize"):
        R.quantize_4bit(torch.randn(100), blocksize=48)
    with pytest.raises(ValueError, match="quant_type"):
        R.quantize_4bit(torch.randn(100), quant_type="int4")
    with pytest.raises(ValueError, match="16/32-bit"):
        R.quantize_4bit(torch.arange(10))
    A, qs = R.quantize_4bit(torch.randn(100))
    with pytest.raises(ValueError, match="bytes"):
        R.dequantize_4bit(A[:10], qs)


def test_bf16_rounding_is_nearest_even():
    vals = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -1.0 - 2**-8, 1.0 + 2**-8 + 2**-20], np.float32)
    bits = R.to_output_bits(vals, "bfloat16")
    want = torch.from_numpy(vals).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bits, want)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["nf4", "fp4"])
def test_reference_matches_bnb_cuda_shapes_and_bits(seed, quant):
    """On the GPU: the reference and bnb's CUDA dequantize_4bit agree in shape and in every bit,
    for 1-D weights (odd and even counts), 2-D weights, and the legacy [1, m] packed form."""
    g = torch.Generator().manual_seed(seed)
    for shape in [(1,), (2,), (65,), (4096,), (4097,), (1, 2), (2, 1), (37, 4097), (64, 64)]:
        for dtype in DTYPES:
            w = torch.randn(shape, generator=g).to(dtype).cuda()
            A, qs = bnb_F.quantize_4bit(w, blocksize=64, quant_type=quant, compress_statistics=True)
            for packed in (A, A.t().contiguous()):
                want = bnb_F.dequantize_4bit(packed, qs)
                got = R.dequantize_4bit(packed, qs)
                ctx = f"seed {seed} shape {shape} {dtype} A {tuple(packed.shape)}"
                assert got.shape == want.shape, ctx
                assert torch.equal(_bits(got.contiguous()), _bits(want.contiguous().cpu())), ctx
