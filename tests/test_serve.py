"""The serving runtime's decisions on the CPU: the transfer rule (exact, then transfer, then bnb), the host
path's per-weight cache and when it is built again, the per-user table, and the bnb patch's eager entry
points (swapped in and put back)."""

import json
import random
import types
import warnings

import pytest

torch = pytest.importorskip("torch")
import bitsandbytes as bnb

from nf4tune.families import MATMUL as MM
from nf4tune.kernel.arch import arch_limits
from nf4tune.serve import matmul as rt
from nf4tune.serve import table as T
from nf4tune.vocabulary import M_BUCKETS, Problem

H100 = "NVIDIA H100 80GB HBM3"
LIMITS = arch_limits("sm_90", 132)


def P(n=4096, k=4096, m=1, dtype="bf16", quant="nf4", bs=64):
    return Problem((n, k), dtype, quant, bs, "matmul", m)


def _accepts(problem):
    return lambda c: rt.plan_verdict(c, problem.m, *problem.shape, problem.blocksize, 256, LIMITS)


@pytest.fixture
def packaged():
    T.use_configs(None)
    yield T.current_table()
    T.use_configs(None)


def _use(tmp_path, entries):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dict(format=2, entries=entries)))
    T.use_configs(str(path))


def _entry(config, n, k, m, speedup, gpu="GPU X", bs=64):
    return dict(gpu=gpu, family="matmul", shape=[n, k], dtype="bf16", quant="nf4", blocksize=bs, m=m,
                config=MM.for_problem(config, P(n, k, m, bs=bs)).to_dict(), median_us=10.0, speedup_vs_bnb=speedup)


def test_transfer_never_picks_a_config_whose_plan_refuses_the_shape(packaged):
    """Over the packaged H100 entries and 300 random shapes, batch buckets and blocksizes: whatever the transfer
    rule picks, its launch plan takes the shape (and it came from a neighbour faster than bnb at that batch
    bucket); where it picks nothing, no neighbour's config would have fitted."""
    rng = random.Random(7)
    picked = refused_all = 0
    for _ in range(300):
        n = rng.choice([64, 96, 1000, 1024, 2048, 3072, 3584, 4096, 5120, 11008, 14336, 18944, 28672])
        k = rng.choice([128, 576, 2048, 3072, 3584, 4096, 8192, 13824, 14336])
        m = rng.choice(M_BUCKETS)
        bs = rng.choice([64, 64, 128, 256])
        if k % bs:
            continue
        prob = P(n, k, m, bs=bs)
        accepts = _accepts(prob)
        choice = packaged.transfer(H100, prob, accepts)
        neighbours = packaged.neighbours(H100, prob)
        if choice is None:
            refused_all += 1
            for e in neighbours:
                if m > T.TRANSFER_MAX_M:                         # no transfer above it
                    break
                try:
                    assert accepts(MM.for_problem(e.config, prob)) is not True, (prob.label(), e.problem.label())
                except Exception as err:            # the problem knobs conflict with the config: not carried
                    assert "InvalidConfig" in type(err).__name__, err
            continue
        picked += 1
        assert accepts(choice.config) is True, (prob.label(), choice.describe())
        assert choice.config.m == m and choice.config.dtype == "bf16"
        src = next(e for e in neighbours if e.problem.label() == choice.tuned_for)
        assert src.problem.m == m <= T.TRANSFER_MAX_M and src.speedup_vs_bnb > 1.0
    assert picked > 100 and refused_all > 0, (picked, refused_all)


def test_the_rules_in_order_exact_then_the_nearest_fitting_neighbour_then_bnb(tmp_path):
    near_cfg = MM.builtin_default(P(m=1))
    far_cfg = MM.builtin_default(P(m=1)).replace(warps=4)
    slow_cfg = MM.builtin_default(P(m=1)).replace(ksplit=2)
    try:
        _use(tmp_path, [_entry(near_cfg, 4096, 4096, 1, 1.5), _entry(far_cfg, 28672, 8192, 1, 2.0),
                        _entry(slow_cfg, 4096, 3584, 1, 0.9), _entry(far_cfg, 4096, 4096, 8, 3.0),
                        _entry(near_cfg, 1024, 4096, 1, 0.8)])
        prob = P(4096, 3584, 1)
        # the exact entry was slower than bnb: the nearest neighbour faster than bnb serves instead
        d = rt.serve_decision("GPU X", prob, _accepts(prob))
        assert d.served and d.rule == "transfer" and d.choice.tuned_for == P(4096, 4096, 1).label()
        assert d.choice.config == MM.for_problem(near_cfg, prob)
        assert "transferred from matmul 4096x4096" in d.reason
        # an exact entry faster than bnb serves itself
        d = rt.serve_decision("GPU X", P(4096, 4096, 1))
        assert d.served and d.rule == "exact"
        # a neighbour whose plan refuses is passed over for the next one
        refuse_near = lambda c: "refused" if c.warps != 4 else True
        d = rt.serve_decision("GPU X", P(8192, 8192, 1), refuse_near)
        assert d.rule == "transfer" and d.choice.tuned_for == P(28672, 8192, 1).label()
        # another batch bucket, GPU, dtype is no neighbour; a neighbour slower than bnb is none either
        for prob in (P(4096, 2048, 2), P(4096, 2048, 1, dtype="fp16")):
            d = rt.serve_decision("GPU X", prob)
            assert not d.served and d.rule == "bnb" and "not tuned" in d.reason
        assert not rt.serve_decision("GPU Y", P(4096, 2048, 1)).served
        assert all(e.speedup_vs_bnb > 1 for e in T.current_table().neighbours("GPU X", P(1024, 2048, 1)))
        # no transfer above the largest bucket it serves, however fast the neighbour: bnb serves
        _use(tmp_path, [_entry(near_cfg, 4096, 4096, 64, 3.0), _entry(far_cfg, 4096, 4096, 32, 1.9)])
        d = rt.serve_decision("GPU X", P(4096, 3584, 64))
        assert T.TRANSFER_MAX_M == 32 and not d.served and d.rule == "bnb"
        assert rt.serve_decision("GPU X", P(4096, 3584, 32)).rule == "transfer"
        assert rt.serve_decision("GPU X", P(4096, 4096, 64)).rule == "exact"
    finally:
        T.use_configs(None)


def _qs(n=1024, k=4096, nested=True):
    absmax = torch.zeros(n * k // 64, dtype=torch.uint8 if nested else torch.float32)
    st2 = types.SimpleNamespace(absmax=torch.ones(n * k // 64 // 256 + 1), code=torch.zeros(256), blocksize=256) \
        if nested else None
    return types.SimpleNamespace(absmax=absmax, state2=st2, offset=torch.zeros(()), shape=torch.Size((n, k)),
                                 blocksize=64, quant_type="nf4", dtype=torch.bfloat16)


def test_the_host_path_decides_once_per_weight_and_batch_and_again_when_the_weight_changes(monkeypatch):
    """The decision and plan of a (weight, M, dtype, device) are made on its first call and looked up after;
    a weight whose statistics are replaced, or a new serving table, is prepared again."""
    asked = []

    def decision(gpu, problem, accepts=None):
        asked.append(problem)
        return rt.Decision(False, None, "bnb serves it (test)")

    monkeypatch.setattr(rt, "serve_decision", decision)
    monkeypatch.setattr(rt, "gpu_name", lambda index: "GPU X")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    qs = _qs()
    A1 = torch.randn(1, 4096, dtype=torch.bfloat16)
    A3 = torch.randn(3, 4096, dtype=torch.bfloat16)
    for _ in range(3):
        assert rt.served_call(A1, qs) is rt.BNB
    assert [p.m for p in asked] == [1]
    rt.served_call(A3, qs)
    rt.served_call(A3, qs)
    assert [p.m for p in asked] == [1, 4]                   # M = 3 is the bucket 4's, decided once
    w = qs._nf4tune_weight
    qs.absmax = qs.absmax.clone()                            # new statistics: prepared again
    rt.served_call(A1, qs)
    assert len(asked) == 3 and qs._nf4tune_weight is not w
    qs.state2.code = qs.state2.code.clone()
    rt.served_call(A1, qs)
    assert len(asked) == 4
    T.use_configs(None)                                      # a new serving table: every weight again
    rt.served_call(A1, qs)
    assert len(asked) == 5
    # a call whose A does not match the weight is bnb's (its error), decided without asking
    assert rt.served_call(torch.randn(1, 4000, dtype=torch.bfloat16), qs) is rt.BNB and len(asked) == 5
    assert rt.served_call(torch.randn(65, 4096, dtype=torch.bfloat16), qs) is rt.BNB and len(asked) == 5


def test_the_hot_path_looks_a_call_up_by_its_shape_and_keeps_no_prefill_lengths(monkeypatch):
    """A served call is one lookup by (A.shape, dtype, device): the M entry is prepared once and shared by its
    shapes, the output shape is kept with it; calls of more rows than the decode buckets are bnb's and leave
    nothing behind; a packed weight at a new address is checked again."""
    launches, prepared = [], []

    class Plan:
        N, K, order_free = 1024, 4096, True

    fake = rt._Served.__new__(rt._Served)
    fake.launch, fake.plan, fake.N, fake.order_free = (lambda vals, stream: launches.append(vals)), Plan, 1024, True
    monkeypatch.setattr(rt, "_prepare", lambda w, qs, A, M, bias, B=None: prepared.append(M) or fake)
    monkeypatch.setattr(rt, "_raw_stream", lambda index: 0)
    qs = _qs()
    B = torch.zeros(1024 * 4096 // 2, 1, dtype=torch.uint8)
    A3 = torch.randn(1, 1, 4096, dtype=torch.bfloat16)
    y = rt.fused_or_none(A3, B, qs)
    assert y.shape == (1, 1, 1024) and y.dtype == torch.bfloat16 and prepared == [1]
    assert launches[-1][0] == A3.data_ptr() and launches[-1][1] == B.data_ptr() and launches[-1][-1] == y.data_ptr()
    assert rt.fused_or_none(A3, B, qs).shape == (1, 1, 1024)
    assert rt.fused_or_none(torch.randn(1, 4096, dtype=torch.bfloat16), B, qs).shape == (1, 1024)
    assert prepared == [1] and len(launches) == 3                     # one M entry for both shapes
    w = qs._nf4tune_weight
    assert set(w.by_shape) == {(torch.Size([1, 1, 4096]), torch.bfloat16, -1), (torch.Size([1, 4096]), torch.bfloat16, -1)}
    # prefill lengths: bnb's, and neither table grows
    for rows in (65, 100, 300):
        assert rt.fused_or_none(torch.randn(1, rows, 4096, dtype=torch.bfloat16), B, qs) is None
    assert len(w.by_shape) == 2 and set(w.calls) == {(1, torch.bfloat16, -1)} and prepared == [1]
    # a packed weight at a new address is checked: too small, declined; the right size, served
    assert rt.fused_or_none(A3, torch.zeros(16, 1, dtype=torch.uint8), qs) is None
    assert rt.fused_or_none(A3, B.view(2, -1)[:, ::2], qs) is None                 # not contiguous, at B's address
    B2 = B.clone()
    assert rt.fused_or_none(A3, B2, qs) is not None and launches[-1][1] == B2.data_ptr() and w.b_checked == B2.data_ptr()
    # out: written in place when it holds the output, refused otherwise
    out = torch.empty(1, 1, 1024, dtype=torch.bfloat16)
    assert rt.fused_or_none(A3, B, qs, out=out) is out and launches[-1][-1] == out.data_ptr()
    with pytest.raises(ValueError, match="out must be"):
        rt.fused_or_none(A3, B, qs, out=torch.empty(1, 1000, dtype=torch.bfloat16))


def test_a_capture_never_decides(monkeypatch):
    """The first call of a (weight, M) inside a CUDA-graph capture is bnb's for that call only: the next call
    outside the capture decides."""
    asked = []
    monkeypatch.setattr(rt, "serve_decision", lambda g, p, a=None: asked.append(p) or rt.Decision(False, None, "x"))
    monkeypatch.setattr(rt, "gpu_name", lambda index: "GPU X")
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    qs, A = _qs(), torch.randn(1, 4096, dtype=torch.bfloat16)
    assert rt.served_call(A, qs) is rt.BNB and asked == []
    capturing[0] = False
    rt.served_call(A, qs)
    assert len(asked) == 1


def test_the_user_table_lies_over_the_serving_table_and_round_trips(tmp_path, monkeypatch):
    from nf4tune.tune.autotune import write_user_entry

    user = tmp_path / "cache" / "autotuned.json"
    monkeypatch.setenv("NF4TUNE_AUTOTUNE_TABLE", str(user))
    cfg = MM.builtin_default(P(m=1))
    try:
        _use(tmp_path, [_entry(cfg, 4096, 4096, 1, 1.2), _entry(cfg, 1024, 4096, 1, 1.1)])
        assert T.current_table().entry("GPU X", P(4096, 4096, 1)).speedup_vs_bnb == 1.2
        mine = _entry(cfg.replace(warps=8), 4096, 4096, 1, 1.7)
        write_user_entry(dict(mine, autotuned="2026-12-07T00:00:00Z"))
        write_user_entry(_entry(cfg, 18944, 3584, 1, 1.3))
        write_user_entry(dict(mine, speedup_vs_bnb=1.8))                  # the same problem: replaced
        data = json.loads(user.read_text())
        assert data["format"] == T.TABLE_FORMAT and len(data["entries"]) == 2
        table = T.reload_user_table()
        e = table.entry("GPU X", P(4096, 4096, 1))
        assert e.speedup_vs_bnb == 1.8 and e.config.warps == 8 and e.table == str(user)
        assert table.entry("GPU X", P(1024, 4096, 1)).speedup_vs_bnb == 1.1   # the serving table's
        assert table.entry("GPU X", P(18944, 3584, 1)) is not None
        assert rt.serve_decision("GPU X", P(4096, 4096, 1)).choice.table == str(user)
        # an unreadable per-user table is said and left out, never fatal
        user.write_text("{not json")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            table = T.reload_user_table()
        assert any("per-user table is ignored" in str(w.message) for w in caught)
        assert table.entry("GPU X", P(4096, 4096, 1)).speedup_vs_bnb == 1.2
    finally:
        monkeypatch.delenv("NF4TUNE_AUTOTUNE_TABLE")
        T.use_configs(None)


def test_autotune_candidates_are_the_neighbours_configs_that_fit(packaged):
    from nf4tune.tune.autotune import MAX_CANDIDATES, candidates

    for prob in (P(18944, 3584, 1), P(3072, 8192, 8), P(5120, 13824, 16)):
        accepts = _accepts(prob)
        cands = candidates(packaged, H100, prob, accepts)
        assert 1 <= len(cands) <= MAX_CANDIDATES and len(set(cands)) == len(cands)
        assert all(accepts(c) is True and c.m == prob.m for c in cands)
        transfer = packaged.transfer(H100, prob, accepts)
        if transfer is not None:
            assert cands[0] == transfer.config          # the transfer's pick is the first candidate


def test_the_patch_swaps_the_eager_entry_points_and_puts_them_back():
    from nf4tune import serve

    before = (bnb.matmul_4bit, bnb.nn.Linear4bit.forward)
    layer = bnb.nn.Linear4bit(256, 64, bias=True, compute_dtype=torch.float32, quant_type="nf4").to("cpu")
    x = torch.randn(3, 256)
    want = layer(x)
    with serve.patch_bitsandbytes():
        assert bnb.matmul_4bit is not before[0] and bnb.matmul_4bit.__wrapped__ is before[0]
        assert bnb.nn.Linear4bit.forward.__wrapped__ is before[1]
        got = layer(x)                               # CPU: bnb's own path, unchanged
        assert torch.equal(got, want)
    assert (bnb.matmul_4bit, bnb.nn.Linear4bit.forward) == before


def test_the_matmul_runtime_table_prints_the_floor_and_the_share_of_it():
    from nf4tune.bench.runtime import REF_MATMUL_RUNTIME, REF_SAME_READ, format_matmul_runtime
    from nf4tune.families.matmul import REF_BNB_MATMUL, REF_DENSE

    def row(us):
        return dict(us=us, iqr_us=0.1, gbps=1000.0, pct_read=50.0, pct_floor=100.0 * 9.0 / us, x_bnb=20.0 / us)

    rep = dict(label="matmul 8192x8192 bf16 nf4 bs64 m1", served=True, rule="transfer", config="cfg", reason="",
               floor=REF_SAME_READ, floor_us=9.0, read_gbps=3000.0,
               rows={REF_MATMUL_RUNTIME: row(10.0), REF_BNB_MATMUL: row(20.0), REF_DENSE: row(30.0)})
    text = format_matmul_runtime([rep])
    line = text.splitlines()[1].split()
    assert line[6:12] == ["transfer", "10.00", "1000", "9.00", "90.0", "2.00"]
    assert "floor: the faster of a read of the same bytes" in text


def test_a_copied_or_pickled_quant_state_is_prepared_again(monkeypatch):
    """copy.deepcopy and pickle of a quant state that served calls (a model copied after inference) carry no
    prepared weight, whose launches hold locks and device pointers; the copy prepares its own."""
    import copy
    import pickle

    monkeypatch.setattr(rt, "serve_decision", lambda g, p, a=None: rt.Decision(False, None, "x"))
    monkeypatch.setattr(rt, "gpu_name", lambda index: "GPU X")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    qs = _qs()
    rt.served_call(torch.randn(1, 4096, dtype=torch.bfloat16), qs)
    w = qs._nf4tune_weight
    w.calls["lock"] = __import__("threading").Lock()          # what a served entry's launch holds
    for twin in (copy.deepcopy(qs), pickle.loads(pickle.dumps(qs))):
        assert twin._nf4tune_weight is None
        rt.served_call(torch.randn(1, 4096, dtype=torch.bfloat16), twin)
        assert twin._nf4tune_weight is not w and twin._nf4tune_weight.holds(twin)


def test_the_host_table_marks_gpu_bound_figures_and_prints_the_hand_off():
    """`bench --host`'s table: a figure whose GPU time per call reached 80% of its host time is starred (the
    launch queue may have filled); each row that bnb serves prints what the patch adds over calling bnb."""
    from nf4tune.bench.runtime import format_host

    served = {"bnb matmul_4bit": (26.4, 0.3, 10.0), "nf4tune.matmul_4bit": (9.1, 0.2, 8.0),
              "patched bnb matmul_4bit": (9.6, 0.1, 3.0), "bnb Linear4bit": (37.7, 0.5, 10.0),
              "patched Linear4bit": (10.8, 0.2, 3.0)}
    handed = {"bnb matmul_4bit": (20.0, 0.3, 5.0), "nf4tune.matmul_4bit": (21.5, 0.2, 5.0),
              "patched bnb matmul_4bit": (21.2, 0.1, 5.0), "bnb Linear4bit": (30.0, 0.5, 5.0),
              "patched Linear4bit": (31.7, 0.2, 5.0)}
    text = format_host([dict(shape="4096x4096", M=1, dtype="bfloat16", rule="exact", why="tuned", **served),
                        dict(shape="1024x4096", M=8, dtype="float32", rule="bnb", why="not tuned <b>", **handed)])
    lines = text.splitlines()
    assert "8.00*" not in text and "9.10*" in lines[2] and lines[2].count("*") == 1
    assert lines[-1] == ("hand-off (1024x4096 float32 M=8, bnb serves: not tuned <b>): patched matmul_4bit +1.20 us, "
                         "patched Linear4bit +1.70 us over bnb")
