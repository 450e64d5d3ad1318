"""Serving the matmul family: a drop-in for bnb's grad-free ``matmul_4bit`` in decode.

:func:`matmul_4bit` takes bnb's arguments (``A``, the packed ``B`` as bnb's ``matmul_4bit``
receives it, the ``quant_state``, ``out``, ``bias``) and gives its result layout. A call runs
the tuned fused kernel only where the serving table holds a variant measured faster than bnb
for this GPU model, weight shape, dtype, quant type, blocksize and batch bucket (M rounded up
to 1, 2, 4, ..., 64); everywhere else bnb's own path runs, and :func:`nf4tune.serve.runtime.stats`
counts why (``matmul_bnb``).

Under ``torch.use_deterministic_algorithms(True)`` a variant whose outputs each sum more than two
split-K or stream-K parts with fp32 atomics (whose rounding follows the order they arrive in) is not
served: bnb, which splits nothing, serves those calls (``explain_matmul`` says so).

A call never synchronises (the nested offset is read by the kernel through a pointer) and
allocates nothing but its output, so it can be captured in a CUDA graph once warmed up: the
first call of a (shape, batch) builds the launch plan, whose split-K workspace the kernel keeps
zeroed; a plan missing during a capture is not built there (bnb serves that call).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from ..families.matmul import MatmulPlan, check_matmul_inputs, stat_args
from ..vocabulary import Problem, UnsupportedInput, m_bucket
from . import runtime as _runtime
from . import table as _table
from .table import Choice

__all__ = ["matmul_4bit", "explain_matmul", "serve_decision"]

_lock = threading.Lock()
_plans: dict = {}
_decisions: dict = {}


def _reset():
    with _lock:
        _plans.clear()
        _decisions.clear()


_table.on_change(_reset)
for _key in ("matmul_calls", "matmul_bnb"):
    _runtime._counts.setdefault(_key, 0)


@dataclass(frozen=True)
class Decision:
    served: bool
    choice: Optional[Choice]
    reason: str


def serve_decision(gpu: str, problem: Problem) -> Decision:
    """Whether the tuned kernel serves ``problem`` on GPU model ``gpu``: only an exact table
    entry whose variant was measured faster than bnb at that batch bucket."""
    key = (gpu, problem)
    d = _decisions.get(key)
    if d is not None:
        return d
    entry = _table.current_table().entry(gpu, problem)
    if entry is None:
        d = Decision(False, None, f"{problem.label()} is not tuned for {gpu}: bnb serves it")
    elif not entry.speedup_vs_bnb or entry.speedup_vs_bnb <= 1.0:
        x = f"{entry.speedup_vs_bnb:.2f}x" if entry.speedup_vs_bnb else "no comparison with bnb"
        d = Decision(False, Choice(entry.config, "exact", problem.label(), _table.current_table().origin),
                     f"the tuned variant was not faster than bnb at m={problem.m} ({x}): bnb serves it")
    else:
        d = Decision(True, Choice(entry.config, "exact", problem.label(), _table.current_table().origin),
                     f"tuned, {entry.speedup_vs_bnb:.2f}x bnb")
    with _lock:
        _decisions[key] = d
    return d


def nondeterministic_reason(plan) -> str:
    return (f"torch's deterministic algorithms are on and {plan.config.short()} adds {plan.parts} parts of each "
            "output with fp32 atomics (the rounding follows their arrival order): bnb serves it")


def _problem_of(A, qs, dtype: str, N: int, K: int) -> Problem:
    M = A.numel() // K
    return Problem((N, K), dtype, qs.quant_type, int(qs.blocksize), "matmul", m_bucket(M))


def explain_matmul(A, quant_state, bias=None) -> Decision:
    """What :func:`matmul_4bit` does with these inputs, and why."""
    import torch

    if not A.is_cuda:
        return Decision(False, None, f"{A.device} tensors: bnb's own matmul_4bit")
    try:
        N, K, dtype = check_matmul_inputs(A, quant_state, bias)
    except UnsupportedInput as e:
        return Decision(False, None, f"{e}")
    M = A.numel() // K
    if M > 64:
        return Decision(False, None, f"M={M} is past the decode buckets (<= 64): bnb serves it")
    d = serve_decision(torch.cuda.get_device_name(A.device.index), _problem_of(A, quant_state, dtype, N, K))
    if d.served and torch.are_deterministic_algorithms_enabled():
        # the plan serving would build (its parts), its workspace on "meta"
        _, plan = _new_plan(d.choice.config, M, N, K, quant_state, A.device, workspace_device="meta")
        if not plan.order_free:
            return Decision(False, d.choice, nondeterministic_reason(plan))
    return d


def _new_plan(config, M, N, K, qs, device, workspace_device=None):
    """The loaded kernel of ``config`` and its launch plan on ``device`` (stream-K's grid follows the
    kernel's registers); the split-K workspace on ``workspace_device`` (default: ``device``)."""
    from ..kernel.arch import device_limits
    from ..kernel.launch import load_kernel

    g = int(qs.state2.blocksize) if qs.state2 is not None else 256
    kernel = load_kernel(config)
    return kernel, MatmulPlan(config, M, N, K, int(qs.blocksize), g, device_limits(device.index),
                              kernel.compiled.registers, workspace_device or device)


def _plan(key, config, M, N, K, qs, device):
    import torch

    from ..kernel.launch import PackedLaunch

    if torch.cuda.is_current_stream_capturing():
        raise UnsupportedInput("the launch plan of this shape is built on its first call, which must come before "
                               "a CUDA-graph capture (warm up first)")
    with torch.cuda.device(device):
        kernel, plan = _new_plan(config, M, N, K, qs, device)
        built = (PackedLaunch(kernel, plan), plan)
    with _lock:
        _plans[key] = built
    return built


def _fused(A, B, qs, out, bias):
    """The fused kernel's result, or UnsupportedInput saying why bnb must serve this call."""
    import torch

    N, K, dtype = check_matmul_inputs(A, qs, bias)
    M = A.numel() // K
    if M < 1 or M > 64:
        raise UnsupportedInput(f"M={M} is outside the decode buckets 1..64")
    d = serve_decision(torch.cuda.get_device_name(A.device.index), _problem_of(A, qs, dtype, N, K))
    if not d.served:
        raise UnsupportedInput(d.reason)
    config = d.choice.config
    key = (A.device.index, M, N, K, dtype, qs.quant_type, int(qs.blocksize), qs.state2 is not None, config)
    launch, plan = _plans.get(key) or _plan(key, config, M, N, K, qs, A.device)
    if not plan.order_free and torch.are_deterministic_algorithms_enabled():
        raise UnsupportedInput(nondeterministic_reason(plan))
    A2 = A if A.is_contiguous() else A.contiguous()
    Bflat = B.reshape(-1) if B.is_contiguous() else B.contiguous().reshape(-1)
    y = out if out is not None else torch.empty((*A.shape[:-1], N), dtype=A.dtype, device=A.device)
    if y.dtype != A.dtype or tuple(y.shape) != (*A.shape[:-1], N):
        raise ValueError(f"out must be {A.dtype} of shape {(*A.shape[:-1], N)}, got {y.dtype} {tuple(y.shape)}")
    plan.check_call(A2, Bflat, y)
    s = stat_args(qs)
    plan.check_stats(s)
    launch((A2.data_ptr(), Bflat.data_ptr(), s[0], s[1], s[2], s[3], s[4],
            bias.data_ptr() if bias is not None else 0, y.data_ptr()), _runtime._raw_stream(A.device.index))
    _runtime._counts["matmul_calls"] += 1
    return y


def matmul_4bit(A, B, quant_state, out=None, bias=None):
    """bnb's grad-free ``matmul_4bit(A, B, quant_state, out, bias)`` (B as bnb receives it, e.g.
    ``layer.weight.t()``): the tuned fused kernel where it was measured faster than bnb, bnb's
    own path elsewhere (counted as ``matmul_bnb``). Errors are bnb's kinds."""
    import torch
    import bitsandbytes as bnb

    if not A.is_cuda:
        _runtime.count("cpu_handoffs")
        return bnb.matmul_4bit(A, B, quant_state, out=out, bias=bias)
    try:
        return _fused(A, B, quant_state, out, bias)
    except UnsupportedInput:
        _runtime.count("matmul_bnb")
        with torch.no_grad():
            return bnb.matmul_4bit(A, B, quant_state, out=out, bias=bias)


def served_gemm(A, B, shapeB, blocksize, quant_type, bias, qs_of):
    """The bnb patch's entry with bnb's ``gemm_4bit`` arguments: the fused result, or None when
    bnb should run (not tuned, not faster, not fusable; counted). ``qs_of()`` builds (and keeps)
    the weight's QuantState from bnb's separate statistics."""
    import torch

    if not A.is_cuda or len(shapeB) != 2:
        return None
    N, K = int(shapeB[0]), int(shapeB[1])
    M = A.numel() // max(K, 1)
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(A.dtype)
    if dtype is None or K % blocksize or not 1 <= M <= 64:
        _runtime.count("matmul_bnb")
        return None
    problem = Problem((N, K), dtype, quant_type, int(blocksize), "matmul", m_bucket(M))
    if not serve_decision(torch.cuda.get_device_name(A.device.index), problem).served:
        _runtime.count("matmul_bnb")
        return None
    try:
        return _fused(A, B, qs_of(), None, bias)
    except UnsupportedInput:
        _runtime.count("matmul_bnb")
        return None
