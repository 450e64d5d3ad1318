"""The decode benchmark's pure parts on the CPU: the 4-bit-free bound and the table it prints
(the benchmark itself needs a GPU: `nf4-tune bench --family matmul --decode`)."""

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")

from tuner.serve.decode import format_decode, free_4bit_linears, linear4bit_bytes, quantize_linears  # noqa: E402


def test_free_4bit_linears_return_shared_zeros_and_put_the_forward_back():
    layer = bnb.nn.Linear4bit(64, 48, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4")
    other = bnb.nn.Linear4bit(32, 48, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    forward = bnb.nn.Linear4bit.forward
    x = torch.randn(3, 1, 64, dtype=torch.bfloat16)
    with free_4bit_linears():
        y = layer(x)
        assert y.shape == (3, 1, 48) and y.dtype == torch.bfloat16 and not y.any()
        assert other(torch.randn(3, 1, 32, dtype=torch.bfloat16)) is y      # one tensor per shape and dtype
        assert layer(x.float()).dtype == torch.float32
    assert bnb.nn.Linear4bit.forward is forward
    with pytest.raises(RuntimeError), free_4bit_linears():
        raise RuntimeError("the forward comes back after an error too")
    assert bnb.nn.Linear4bit.forward is forward


def test_linear4bit_bytes_count_what_a_step_reads_of_the_quantized_layers():
    """Packed weights, absmax bytes, the nested level's absmax and code, biases: of the decoder layers'
    Linear4bit only (quantize_linears leaves anything outside model.model.layers alone)."""
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    layer = torch.nn.Module()
    layer.proj = torch.nn.Linear(256, 128, bias=False, dtype=torch.bfloat16)
    layer.up = torch.nn.Linear(256, 64, bias=True, dtype=torch.bfloat16)
    model.model.layers = torch.nn.ModuleList([layer])
    model.lm_head = torch.nn.Linear(256, 1000, bias=False, dtype=torch.bfloat16)
    assert quantize_linears(model) == 2
    # proj: 128x256/2 packed, 512 absmax bytes, 2 fp32 second-level absmax, 256 fp32 code;
    # up: 64x256/2 packed, 256 absmax bytes, 1 fp32 second-level absmax, the code, 64 bf16 bias
    assert linear4bit_bytes(model) == (16384 + 512 + 8 + 1024) + (8192 + 256 + 4 + 1024 + 128)


def _result(variant, batch, ms):
    return dict(variant=variant, batch=batch, step_ms=ms, step_ms_iqr=0.01, tokens_per_s=batch * 1000 / ms,
                mode="cuda graph", matmul_calls=None, samples_ms=[ms])


def test_format_decode_prints_the_bound_and_the_matmuls_share():
    d = dict(layers=32, prompt_len=128, table=None, agreement={1: dict(max_abs_logit_diff=0.4, mean_abs_logit_diff=0.07,
                                                                          same_argmax=1.0)},
             results=[_result("bf16", 1, 9.0), _result("bnb", 1, 7.5), _result("patched", 1, 6.0),
                      _result("no-4bit", 1, 2.5), _result("bnb", 8, 18.0), _result("patched", 8, 9.8)])
    text = format_decode(d)
    assert "no kernel for them can make the decode more than 3.00x bnb" in text
    assert "their time: bnb 5.000 ms, patched 3.500 ms (1.43x)" in text
    assert "batch 8: the step without" not in text            # no bound measured at batch 8
    row = next(line for line in text.splitlines() if " no-4bit " in line)
    assert row.split()[:3] == ["1", "no-4bit", "2.500"]
    assert "read ceiling" not in text                            # no bytes or ceiling given: no floor printed
    text = format_decode(dict(d, linear4bit_bytes=3.6e9, read_ceiling_gbps=4000.0))
    assert "their 3.60 GB at the read ceiling (4000 GB/s) take 0.900 ms, so at most 2.21x bnb" in text
