"""The decode benchmark's pure parts on the CPU: the 4-bit-free bound and the table it prints
(the benchmark itself needs a GPU: `nf4-tune bench --family matmul --decode`)."""

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")

from nf4tune.bench.decode import format_decode, free_4bit_linears, linear4bit_bytes, quantize_linears  # noqa: E402


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


def test_decode_benchmark_records_each_variant_per_batch(monkeypatch):
    """The benchmark's orchestration with the GPU parts replaced by doubles (the model, the timed steps, the
    ceiling): bf16, bnb, patched and no-4bit per batch, in that order, with the patched calls counted and the
    bytes and ceiling carried into the result."""
    from nf4tune.bench import decode

    ms = {"bf16": 9.0, "bnb": 7.5, "patched": 6.0, "no-4bit": 2.5}
    state = {"variant": "bf16"}

    def steps(model, b, *args):
        return [ms[state["variant"]]] * 5, "cuda graph", torch.zeros(b, 1, 4)

    def quantize(model):
        state["variant"] = "bnb"
        return 224

    class Variant:
        """A context that names the variant the timed steps belong to while it is open, then back to bnb."""

        def __init__(self, name):
            self.name = name

        def __enter__(self):
            state["variant"] = self.name

        def __exit__(self, *exc):
            state["variant"] = "bnb"

    monkeypatch.setattr(decode, "build_model", lambda layers: object())
    monkeypatch.setattr(decode, "quantize_linears", quantize)
    monkeypatch.setattr(decode, "linear4bit_bytes", lambda model: 3_600_000_000)
    monkeypatch.setattr(decode, "read_ceiling_gbps", lambda: 4000.0)
    monkeypatch.setattr(decode, "decode_step_times", steps)
    monkeypatch.setattr(decode, "free_4bit_linears", lambda: Variant("no-4bit"))
    monkeypatch.setattr("nf4tune.serve.patch.patch_bitsandbytes", lambda: Variant("patched"))
    said = []
    d = decode.decode_benchmark(batches=(1, 8), layers=2, progress=said.append)
    assert [(r["variant"], r["batch"], r["step_ms"]) for r in d["results"]] == [
        ("bf16", 1, 9.0), ("bf16", 8, 9.0), ("bnb", 1, 7.5), ("patched", 1, 6.0), ("no-4bit", 1, 2.5),
        ("bnb", 8, 7.5), ("patched", 8, 6.0), ("no-4bit", 8, 2.5)]
    patched = [r for r in d["results"] if r["variant"] == "patched"]
    assert all(r["matmul_calls"] == 0 for r in patched)              # no fused call ran (the double)
    assert all(r["matmul_calls"] is None for r in d["results"] if r["variant"] != "patched")
    assert d["linear4bit_bytes"] == 3_600_000_000 and d["read_ceiling_gbps"] == 4000.0
    assert "patched batch 1: 6.000 ms/step (0 fused matmul calls outside the graph replays)" in said
    assert "no-4bit batch 8 (every Linear4bit free: a bound): 2.500 ms/step" in said
    assert "bf16 batch 1: 9.000 ms/step" in said
