"""GPU tests of what a bnb user runs: the matmul host path (prepared once per weight and batch, prepared
again when the weight changes), the transfer to shapes nobody tuned, patched eager ``generate`` against
bnb, and the per-user autotune table reused by a second process."""

import copy
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
import bitsandbytes as bnb
import bitsandbytes.functional as F

from nf4tune import serve
from nf4tune.families import MATMUL as MM
from nf4tune.families.matmul import MatmulInputs
from nf4tune.serve import matmul as rt
from nf4tune.serve import table as T
from nf4tune.vocabulary import Problem


def _table(tmp_path, entries):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dict(format=2, entries=entries)))
    T.use_configs(str(path))


def _entry(gpu, n, k, m, config, speedup=3.0):
    return dict(gpu=gpu, family="matmul", shape=[n, k], dtype="bf16", quant="nf4", blocksize=64, m=m,
                config=MM.for_problem(config, Problem((n, k), "bf16", "nf4", 64, "matmul", m)).to_dict(),
                median_us=1.0, speedup_vs_bnb=speedup)


def _gate(layer, x, got, bias=None):
    """``got`` within the family's derived bound of the fp64 reference and no worse than bnb (MM.compare)."""
    qs = layer.weight.quant_state
    inputs = MatmulInputs(x, layer.weight, qs, bias, x.shape[0], qs.shape[0], qs.shape[1])
    config = rt.explain_matmul(x, qs, bias).choice.config
    return MM.compare(got, MM.expected(inputs), inputs, config)


def test_the_host_path_is_prepared_once_and_again_when_the_weight_changes(seed, tmp_path):
    gpu = torch.cuda.get_device_name(0)
    torch.manual_seed(seed)
    layer = bnb.nn.Linear4bit(4096, 1024, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    try:
        _table(tmp_path, [_entry(gpu, 1024, 4096, 1, MM.builtin_default(Problem((1024, 4096), m=1, family="matmul")))])
        x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
        bias = layer.bias.data.to(torch.bfloat16)
        with torch.no_grad():
            y1 = serve.matmul_4bit(x, layer.weight.t(), layer.weight.quant_state, bias=bias)
            w = layer.weight.quant_state._nf4tune_weight
            assert set(w.calls) == {(1, torch.bfloat16, 0)} and w.calls[(1, torch.bfloat16, 0)] is not rt.BNB
            c0 = serve.stats()["matmul_calls"]
            for _ in range(3):
                assert torch.equal(serve.matmul_4bit(x, layer.weight.t(), layer.weight.quant_state, bias=bias), y1)
            assert serve.stats()["matmul_calls"] - c0 == 3
            assert layer.weight.quant_state._nf4tune_weight is w                  # looked up, not rebuilt
            assert _gate(layer, x, y1, bias) is None
            # new weights in the same layer (a new Params4bit and quant state): prepared again, right again
            layer.weight = bnb.nn.Params4bit(torch.randn(1024, 4096, dtype=torch.bfloat16), requires_grad=False,
                                             quant_type="nf4").cuda()
            y2 = serve.matmul_4bit(x, layer.weight.t(), layer.weight.quant_state, bias=bias)
            assert layer.weight.quant_state._nf4tune_weight is not w
            assert not torch.equal(y1, y2) and _gate(layer, x, y2, bias) is None
    finally:
        T.use_configs(None)


def test_a_shape_nobody_tuned_is_served_by_transfer_and_passes_the_gate(seed, tmp_path):
    gpu = torch.cuda.get_device_name(0)
    torch.manual_seed(seed)
    tuned = MM.builtin_default(Problem((4096, 4096), m=1, family="matmul"))
    layer = bnb.nn.Linear4bit(3584, 18944, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    try:
        _table(tmp_path, [_entry(gpu, 14336, 4096, 1, tuned), _entry(gpu, 4096, 4096, 1, tuned, 0.8)])
        x = torch.randn(1, 3584, dtype=torch.bfloat16, device="cuda")
        d = serve.explain_matmul(x, layer.weight.quant_state)
        assert d.served and d.rule == "transfer" and "14336x4096" in d.choice.tuned_for, d
        with torch.no_grad():
            c0 = serve.stats()["matmul_calls"]
            with serve.patch_bitsandbytes():
                got = layer(x)
            assert serve.stats()["matmul_calls"] - c0 == 1
        assert _gate(layer, x, got) is None
    finally:
        T.use_configs(None)


def test_patched_eager_generate_agrees_with_bnb_within_bnbs_own_error(seed):
    """One step of a 2-layer Llama-3-8B-shaped model, its logits, against a reference that runs every Linear4bit
    in float32 on its dequantized weight (the exact recipe): patched is as close as bnb on average (each matmul
    passes the family's gate: within its derived bound and no worse than bnb; through the layers the two
    roundings drift apart, so one logit's largest error may be a few times bnb's); and greedy generate gives
    bnb's tokens wherever bnb's top logit is clear of its runner-up by more than both errors."""
    from nf4tune.bench.decode import quantize_linears
    from nf4tune.bench.generate import _prompt, build_from_config, load_model_config

    model = build_from_config(load_model_config(None, layers=2), seed=seed % 1000)
    quantize_linears(model)
    ids = _prompt(model, 2, 16, seed)

    def logits():
        with torch.no_grad():
            return model(input_ids=ids).logits[:, -1].float()

    want = logits()
    with serve.patch_bitsandbytes():
        c0 = serve.stats()["matmul_calls"]
        got = logits()
        served = serve.stats()["matmul_calls"] - c0
    forward = bnb.nn.Linear4bit.forward

    def exact(self, x):
        # code x absmax in float32 (a quant state of dtype float32): the values the 4-bit weight stands for, not
        # bnb's bf16 rounding of them (a reference of bnb's own rounded weights would favour bnb's path)
        qs = copy.copy(self.weight.quant_state)
        qs.dtype = torch.float32
        w = F.dequantize_4bit(self.weight, qs)
        return torch.nn.functional.linear(x.float(), w, None if self.bias is None else self.bias.float()).to(x.dtype)

    bnb.nn.Linear4bit.forward = exact
    try:
        ref = logits()
    finally:
        bnb.nn.Linear4bit.forward = forward
    bnb_err, ours = float((want - ref).abs().max()), float((got - ref).abs().max())
    bnb_mean, ours_mean = float((want - ref).abs().mean()), float((got - ref).abs().mean())
    assert served > 0
    assert ours_mean <= 1.25 * bnb_mean + 1e-4 and ours <= 3 * bnb_err + 1e-2, (ours_mean, bnb_mean, ours, bnb_err)
    with torch.no_grad():
        base = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        with serve.patch_bitsandbytes():
            patched = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * (bnb_err + ours)
    first = ids.shape[1]
    assert torch.equal(base[clear, first], patched[clear, first])


AUTOTUNE_CHILD = r"""
import json, sys, torch, bitsandbytes as bnb
import nf4tune
from nf4tune import serve
torch.manual_seed(0)
layer = bnb.nn.Linear4bit(3072, 3072 + 512, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
x = torch.randn(1, 3072, dtype=torch.bfloat16, device="cuda")
d = serve.explain_matmul(x, layer.weight.quant_state)
print(json.dumps(dict(rule=d.rule, served=d.served, table=d.choice.table if d.choice else "")))
"""


def test_autotune_writes_the_per_user_table_that_a_second_process_serves_from(seed, tmp_path, monkeypatch):
    from nf4tune.tune.autotune import autotune_weight

    user = tmp_path / "autotuned.json"
    monkeypatch.setenv("NF4TUNE_AUTOTUNE_TABLE", str(user))
    torch.manual_seed(seed)
    layer = bnb.nn.Linear4bit(3072, 3072 + 512, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    x = torch.randn(1, 3072, dtype=torch.bfloat16, device="cuda")
    try:
        T.use_configs(None)
        r = autotune_weight(x, layer.weight, layer.weight.quant_state)
        assert r.tried and all(status in ("ok", "invalid", "skipped") for _, status, _ in r.tried)
        assert r.seconds < 30
        if r.winner is None:
            pytest.skip(f"no candidate beat bnb on this GPU ({r.describe()}): nothing to reuse")
        assert json.loads(user.read_text())["entries"][0]["shape"] == [3584, 3072]
        d = serve.explain_matmul(x, layer.weight.quant_state)
        assert d.served and d.rule == "exact" and d.choice.table == str(user)
        env = dict(os.environ, NF4TUNE_AUTOTUNE_TABLE=str(user))
        out = subprocess.run([sys.executable, "-c", AUTOTUNE_CHILD], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        child = json.loads(out.stdout.strip().splitlines()[-1])
        assert child == dict(rule="exact", served=True, table=str(user))
    finally:
        T.use_configs(None)


@pytest.mark.parametrize("via", ["bindings", "ctypes"])
def test_both_launch_paths_give_bnbs_bits(seed, via):
    """The packed serving launch through cuda.bindings' cuLaunchKernel and through ctypes: the dequant runtime's
    plan gives bnb's bits both ways, into a NaN-poisoned output."""
    from nf4tune.families.dequant import mismatch_report
    from nf4tune.kernel.launch import PackedLaunch
    from nf4tune.serve import runtime

    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(1000, 1037, generator=g, device="cuda").to(torch.bfloat16)
    A, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    want = F.dequantize_4bit(A, qs)
    runtime.dequantize_4bit(A, qs)
    served = runtime.plan_for(A, qs)
    launch = PackedLaunch(served.launch.kernel, served.launch.plan, via=via)
    assert launch.via == ("ctypes" if via == "ctypes" else "cuda.bindings")
    out = torch.full_like(want, float("nan"))
    launch((A.data_ptr(), qs.absmax.data_ptr(), qs.state2.code.data_ptr(), qs.state2.absmax.data_ptr(), 0,
            float(qs.offset), out.data_ptr()), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert mismatch_report(out, want) is None


def test_search_quality_measures_the_transfer_and_autotunings_pick(tmp_path, monkeypatch):
    """`bench --search-quality`'s library call on the GPU, tiny searches: on a shape nobody tuned, the
    runtime's transfer and autotuning's pick are gated and timed with the searches' measurer, beside bnb, and
    autotuning writes nothing to the per-user table."""
    from nf4tune.kernel.gpu import require_gpu
    from nf4tune.tune.quality import format_row, runtime_alternatives, search_quality

    user = tmp_path / "autotuned.json"
    monkeypatch.setenv("NF4TUNE_AUTOTUNE_TABLE", str(user))
    T.use_configs(None)
    prob = Problem((3584, 3072), "bf16", "nf4", 64, "matmul", 1)
    try:
        (row,) = search_quality([prob], gpu=require_gpu(), short=2, long=3, seed=5,
                                alternatives=runtime_alternatives())
    finally:
        T.use_configs(None)
    served, tuned = row.alternatives
    assert served.name == "transfer" and tuned.name == "autotune"
    assert served.config and served.median_us > 0 and served.bnb_us > 0, served
    assert tuned.config is None or tuned.median_us > 0, tuned
    assert row.long_best_us > 0 and not user.exists()
    assert "transfer" in format_row(row)
