"""The runtime's config choice, its errors and the bnb patch, on the CPU (no GPU needed)."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import bitsandbytes.functional as F

from nf4tune import serve as runtime
from nf4tune.families import DEQUANT
from nf4tune.serve import table as T
from nf4tune.vocabulary import Problem

GPU = "NVIDIA H200"


def P(shape, dtype="bf16", quant="nf4", bs=64):
    return Problem(shape, dtype, quant, bs)


def _entry(shape, dtype="bf16", quant="nf4", bs=64, gpu=GPU, **knobs):
    cfg = dict(dict(bytes_per_thread=4, unroll=2, threads=256, lut="shared", index="hoisted"), **knobs)
    return dict(gpu=gpu, shape=list(shape), dtype=dtype, quant=quant, blocksize=bs,
                config=dict(cfg, dtype=dtype, quant=quant), median_us=1.0, speedup_vs_bnb=2.0, pct_copy=90.0)


@pytest.fixture
def table():
    return runtime.ConfigTable([
        _entry((4096, 4096), threads=128),
        _entry((16384, 16384), threads=512),
        _entry((8192, 8192), dtype="fp16", threads=1024),
        _entry((8192, 8192), bs=128, threads=64),
        _entry((4096, 4096), gpu="NVIDIA A100", threads=256, unroll=1),
    ], "test")


def test_exact_problem_wins(table):
    c = table.choose(GPU, P((4096, 4096)))
    assert c.source == "exact" and c.config.threads == 128


def test_nearest_problem_prefers_same_blocksize_then_size(table):
    # 70.8M values: |ln 70.8M - ln 16.8M| = 1.44 > |ln 70.8M - ln 268M| = 1.33, so 16384^2
    c = table.choose(GPU, P((5120, 13824)))
    assert c.source == "nearest" and c.config.threads == 512 and "16384x16384" in c.tuned_for
    c = table.choose(GPU, P((11008, 4096)))      # 45M: 16.8M is nearer (0.99 vs 1.78)
    assert c.source == "nearest" and c.config.threads == 128
    c = table.choose(GPU, P((4096, 4096), bs=128))      # exact blocksize beats exact shape
    assert c.source == "nearest" and c.config.threads == 64


def test_other_gpu_or_dtype_falls_back_to_the_builtin_default(table):
    c = table.choose("NVIDIA L4", P((4096, 4096)))
    assert c.source == "default"
    assert c.config == DEQUANT.config(**DEQUANT.builtin_defaults["bf16"], dtype="bf16", quant="nf4")
    c = table.choose(GPU, P((4096, 4096), "fp32", "fp4"))
    assert c.source == "default" and c.config.dtype == "fp32" and c.config.quant == "fp4"
    c = table.choose(GPU, P((4096, 4096), "fp16"))       # fp16 tuned at 8192^2 only
    assert c.source == "nearest" and c.config.threads == 1024


def test_comparable_entries_are_the_gpus_own_of_the_family_dtype_and_quant(table):
    assert {e.config.threads for e in table.comparable(GPU, P((64, 64)))} == {128, 512, 64}
    assert [e.config.threads for e in table.comparable(GPU, P((64, 64), "fp16"))] == [1024]
    assert [e.config.threads for e in table.comparable("NVIDIA A100", P((1, 1), bs=4096))] == [256]
    assert table.comparable(GPU, P((64, 64), "fp32")) == [] == table.comparable("NVIDIA L4", P((64, 64)))
    assert table.comparable(GPU, Problem((64, 64), family="matmul", m=1)) == []


def test_packaged_table_loads_and_covers_the_h200():
    t = runtime.ConfigTable.from_file(T.PACKAGED_TABLE)
    assert any(e.gpu == GPU for e in t.entries)
    assert t.choose(GPU, P((4096, 4096))).source == "exact"
    # fp32 output is searched at the six target shapes, blocksizes 128 and 256 at two of them
    for shape in ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192), (8192, 28672), (16384, 16384)):
        assert t.choose(GPU, P(shape, "fp32")).source == "exact", shape
    for bs in (128, 256):
        for shape in ((4096, 14336), (8192, 8192)):
            assert t.choose(GPU, Problem(shape, "bf16", "nf4", bs)).source == "exact", (shape, bs)
        assert t.choose(GPU, Problem((5120, 13824), "bf16", "nf4", bs)).tuned_for == f"8192x8192 bf16 nf4 bs{bs}"
    # an untuned arch (a B200, an RTX 5090) is served the built-in default, never an error
    assert t.choose("NVIDIA B200", P((4096, 4096))).source == "default"


def test_use_configs_reads_exported_tables_and_never_a_database(tmp_path, monkeypatch):
    p = tmp_path / "configs.json"
    p.write_text(json.dumps(dict(format=1, entries=[_entry((64, 64), threads=64)])))
    try:
        runtime.use_configs(str(p))
        assert runtime.choose_config(GPU, P((64, 64))).config.threads == 64
        monkeypatch.setenv("NF4TUNE_CONFIGS", str(p))
        runtime.use_configs(None)
        assert runtime.choose_config(GPU, P((64, 64))).source == "exact"
        from conftest import example_db

        # a database is not a table: `nf4-tune export` turns it into one
        db = example_db("h200-search", tmp_path)
        before = Path(db).read_bytes()
        with pytest.raises(ValueError, match="is a database, not a table written by `nf4-tune export`"):
            runtime.use_configs(db)
        assert Path(db).read_bytes() == before
        monkeypatch.setenv("NF4TUNE_DB", db)          # the runtime does not look at the tuning database
        monkeypatch.delenv("NF4TUNE_CONFIGS")
        runtime.use_configs(None)
        assert T.current_table().origin.endswith("tuned_configs.json")
    finally:
        monkeypatch.delenv("NF4TUNE_CONFIGS", raising=False)
        runtime.use_configs(None)


def test_bad_tables_are_rejected_with_a_message(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{}")
    with pytest.raises(ValueError, match="nf4-tune export"):
        runtime.ConfigTable.from_file(p)
    p.write_text(json.dumps(dict(format=1, entries=[dict(gpu=GPU)])))
    with pytest.raises(ValueError, match="bad entry"):
        runtime.ConfigTable.from_file(p)
    with pytest.raises(ValueError, match="cannot read"):
        runtime.ConfigTable.from_file(tmp_path / "missing.json")


def _cpu_quantized(shape=(64, 96), quant="nf4", dtype=torch.bfloat16):
    w = torch.randn(shape, dtype=torch.float32).to(dtype)
    return F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type=quant)


def test_errors_are_bnbs_kinds():
    A, qs = _cpu_quantized()
    with pytest.raises(RuntimeError, match="CUDA"):          # torch._check, as bnb's op checks
        runtime.dequantize_4bit(A, qs)
    choice = runtime.explain(A, qs)                          # CPU tensors: says what serves them
    assert choice.source == "bnb" and "bnb's own dequantize_4bit" in choice.describe()
    with pytest.raises(ValueError, match="requires both absmax and out"):
        runtime.dequantize_4bit(A)
    qs.blocksize = 48
    with pytest.raises(ValueError, match="invalid blocksize 48"):
        runtime.dequantize_4bit(A, qs)
    qs.blocksize = 64
    qs.dtype = torch.int8
    with pytest.raises(ValueError, match="16/32-bit floats"):
        runtime.dequantize_4bit(A, qs)
    qs.dtype, qs.quant_type = torch.bfloat16, "int4"
    with pytest.raises(ValueError, match="nf4' or 'fp4'"):
        runtime.dequantize_4bit(A, qs)


def _cuda_backend():
    try:   # bnb's CUDA backend imports only with a CUDA build of torch
        import bitsandbytes.backends.cuda.ops as cuda_ops
    except Exception:
        return None
    return cuda_ops


def test_patch_swaps_bnb_and_undo_restores_it():
    cuda_ops = _cuda_backend()
    orig_deq = F.dequantize_4bit
    orig_fb = cuda_ops._dequant_linear_fallback if cuda_ops else None
    with runtime.patch_bitsandbytes() as p:
        assert p.active and F.dequantize_4bit is not orig_deq
        if cuda_ops:
            assert cuda_ops._dequant_linear_fallback is not orig_fb
    assert F.dequantize_4bit is orig_deq
    if cuda_ops:
        assert cuda_ops._dequant_linear_fallback is orig_fb
    p = runtime.patch_bitsandbytes()
    assert F.dequantize_4bit is not orig_deq
    p.undo()
    p.undo()                                              # a second undo is harmless
    assert F.dequantize_4bit is orig_deq and not p.active
    patched = None
    with runtime.patch_bitsandbytes() as q:
        patched = F.dequantize_4bit
    q.reapply()                                           # the same functions again, then bnb's again
    assert q.active and F.dequantize_4bit is patched
    q.reapply()                                           # while active: nothing
    q.undo()
    assert F.dequantize_4bit is orig_deq and not q.active
    if cuda_ops:
        assert cuda_ops._dequant_linear_fallback is orig_fb


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
def test_patched_bnb_keeps_its_own_path_for_cpu_tensors(quant):
    A, qs = _cpu_quantized(quant=quant)
    want = F.dequantize_4bit(A, qs)
    before = runtime.stats()["cpu_handoffs"]
    with runtime.patch_bitsandbytes():
        got = F.dequantize_4bit(A, qs)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert runtime.stats()["cpu_handoffs"] == before + 1
