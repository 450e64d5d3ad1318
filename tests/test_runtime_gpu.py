"""GPU tests of the serving runtime: bit-identical to bnb for every dtype x quant x blocksize,
nested or not, out given or not, the [1, n] packed form; the bnb patch and Linear4bit."""

import warnings

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
import bitsandbytes as bnb
import bitsandbytes.functional as F

from nf4tune import serve as runtime
from nf4tune.families.dequant import mismatch_report
from nf4tune.vocabulary import Problem

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def _quantized(shape, dtype, quant, bs, nested, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(DTYPES[dtype])
    return F.quantize_4bit(w, blocksize=bs, compress_statistics=nested, quant_type=quant)


def _same(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    bad = mismatch_report(got, want)
    assert bad is None, bad


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("quant", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_identical_to_bnb_on_every_blocksize(seed, dtype, quant, nested):
    for i, bs in enumerate(BLOCKSIZES):
        for j, shape in enumerate([(4096, 1024), (333, 4097), (77,), (1, 5)]):   # even, odd, tiny, 5 values
            A, qs = _quantized(shape, dtype, quant, bs, nested, seed + 100 * i + j)
            want = F.dequantize_4bit(A, qs)
            _same(runtime.dequantize_4bit(A, qs), want)
            out = torch.full(qs.shape, float("nan"), dtype=DTYPES[dtype], device="cuda")
            got = runtime.dequantize_4bit(A, qs, out=out)
            assert got.data_ptr() == out.data_ptr()
            _same(got, want)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_absmax_and_out_without_a_quant_state(seed, dtype):
    A, qs = _quantized((256, 300), dtype, "fp4", 128, False, seed)
    want = torch.empty(qs.shape, dtype=DTYPES[dtype], device="cuda")
    F.dequantize_4bit(A, absmax=qs.absmax, out=want, blocksize=128, quant_type="fp4")
    out = torch.full_like(want, float("nan"))
    _same(runtime.dequantize_4bit(A, absmax=qs.absmax, out=out, blocksize=128, quant_type="fp4"), want)


def test_transposed_packed_form(seed):
    A, qs = _quantized((64, 100), "bf16", "nf4", 64, True, seed)
    At = A.view(1, -1)                       # bnb's legacy [1, (n+1)//2] form
    want = F.dequantize_4bit(At, qs)
    got = runtime.dequantize_4bit(At, qs)
    assert got.shape == want.shape == (100, 64)
    _same(got, want)


def _tuned_here(dtype, quant):
    """Whether the serving table holds dequant entries of this dtype and quant for this GPU."""
    from nf4tune.serve.table import current_table

    gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    return bool(current_table().comparable(gpu, Problem((64, 64), dtype, quant, 64)))


def test_picks_the_tuned_config_and_a_fallback(seed):
    # a GPU the table was tuned on gets its entry or the nearest; any other GPU the family's default
    A, qs = _quantized((4096, 4096), "bf16", "nf4", 64, True, seed)
    want = ("exact", "nearest") if _tuned_here("bf16", "nf4") else ("default",)
    assert runtime.explain(A, qs).source in want
    A, qs = _quantized((1000, 1000), "fp32", "fp4", 2048, True, seed)
    want = ("nearest", "default") if _tuned_here("fp32", "fp4") else ("default",)
    assert runtime.explain(A, qs).source in want


def test_bad_cuda_inputs_raise_bnbs_kinds(seed):
    A, qs = _quantized((128, 128), "bf16", "nf4", 64, True, seed)
    with pytest.raises(ValueError, match="out.shape"):
        runtime.dequantize_4bit(A, qs, out=torch.empty(128, 127, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match="out.dtype"):
        runtime.dequantize_4bit(A, qs, out=torch.empty(128, 128, dtype=torch.float16, device="cuda"))
    with pytest.raises(RuntimeError, match="CUDA"):
        runtime.dequantize_4bit(A.cpu(), qs)
    with pytest.raises(RuntimeError, match="absmax.device"):   # a new quant_state: checked in full
        bad = F.QuantState(absmax=qs.absmax.cpu(), shape=qs.shape, blocksize=64, quant_type="nf4",
                           dtype=torch.bfloat16, offset=qs.offset, state2=qs.state2)
        runtime.dequantize_4bit(A, bad)
    with pytest.raises(ValueError, match="bytes"):
        runtime.dequantize_4bit(A[:100], qs)


def test_patched_bnb_is_identical_and_hands_unsupported_inputs_to_bnb(seed):
    A, qs = _quantized((512, 640), "fp16", "nf4", 64, True, seed)
    want = F.dequantize_4bit(A, qs)
    before = runtime.stats()["calls"]
    with runtime.patch_bitsandbytes():
        _same(F.dequantize_4bit(A, qs), want)
        assert runtime.stats()["calls"] == before + 1
        # a misaligned view of the packed bytes: the fused kernel cannot load it, bnb can
        buf = torch.empty(A.numel() + 1, dtype=torch.uint8, device="cuda")
        buf[1:].copy_(A.view(-1))
        shifted = buf[1:].view(A.shape)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            _same(F.dequantize_4bit(shifted, qs), want)
        assert runtime.stats()["bnb_handoffs"] >= 1
        assert any("bnb's own kernel" in str(x.message) for x in w)


@pytest.mark.parametrize("batch", [4096, 7])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_linear4bit_identical_patched_and_unpatched(seed, dtype, batch):
    torch.manual_seed(seed)
    t = DTYPES[dtype]
    layer = bnb.nn.Linear4bit(4096, 1536, bias=True, compute_dtype=t, quant_type="nf4").cuda()
    x = torch.randn(batch, 4096, dtype=t, device="cuda")
    with torch.no_grad():
        want = layer(x)
        calls = runtime.stats()["calls"]
        with runtime.patch_bitsandbytes():
            got = layer(x)
        if batch > 1536:   # bnb's gemm_4bit dequantizes then matmuls past M=1536: routed through us
            assert runtime.stats()["calls"] > calls
        d = runtime.explain_matmul(x, layer.weight.quant_state, layer.bias)
    if d.served:
        # a decode batch the fused matmul serves (an exact entry or a transfer): its gate, not bnb's bits
        from nf4tune.families import MATMUL as MM
        from nf4tune.families.matmul import MatmulInputs

        qs = layer.weight.quant_state
        inputs = MatmulInputs(x, layer.weight, qs, layer.bias, batch, qs.shape[0], qs.shape[1])
        assert MM.compare(got, MM.expected(inputs), inputs, d.choice.config) is None
    else:
        assert torch.equal(got, want)
    # with autograd, Linear4bit dequantizes through F.dequantize_4bit in forward and backward
    xg = x.clone().requires_grad_(True)
    want = layer(xg)
    want.sum().backward()
    gwant = xg.grad.clone()
    xg.grad = None
    calls = runtime.stats()["calls"]
    with runtime.patch_bitsandbytes():
        got = layer(xg)
        got.sum().backward()
    assert runtime.stats()["calls"] >= calls + 1     # forward (and backward where bnb dequantizes there)
    assert torch.equal(got, want) and torch.equal(xg.grad, gwant)
