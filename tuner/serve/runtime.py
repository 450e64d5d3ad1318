"""Serving tuned kernels: a drop-in ``dequantize_4bit`` for bitsandbytes users.

:func:`dequantize_4bit` takes bnb's arguments and gives bnb's result, bit for bit, for CUDA
tensors, in one fused launch of the variant tuned for this GPU and problem
(:mod:`nf4tune.serve.table` says which). Each kernel is compiled once per process (and found in
the disk cache by later processes); the launch plan (checks, geometry, packed parameters) is
built once per problem, and a quant_state is checked once and remembered while it holds the
same tensors, so a call costs the per-call checks of A and ``out``, a few pointer writes and
one ``cuLaunchKernel``.

:func:`nf4tune.serve.patch.patch_bitsandbytes` routes bnb's own entry points through this.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from ..families.dequant import DequantPlan, check_attrs, check_quant_state, stat_pointers
from ..vocabulary import Problem, UnsupportedInput
from . import table as _table
from .table import Choice, choose_config

__all__ = ["dequantize_4bit", "explain", "stats", "plan_for", "UnsupportedInput", "Choice"]

_state_lock = threading.Lock()
_plans: dict = {}
_prepared: dict = {}
_counts = {"calls": 0, "plans": 0, "bnb_handoffs": 0, "cpu_handoffs": 0}


def _reset_plans():
    with _state_lock:
        _plans.clear()
        _prepared.clear()


_table.on_change(_reset_plans)


def stats() -> dict:
    """Counts in this process: calls served by a tuned kernel (``calls``), launch plans built
    (``plans``), CUDA calls the bnb patch handed to bnb because the fused kernel cannot take them
    (``bnb_handoffs``) and calls with CPU tensors that the patch left to bnb (``cpu_handoffs``)."""
    with _state_lock:
        return dict(_counts)


def count(key: str) -> None:
    with _state_lock:
        _counts[key] += 1


def _gpu_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


@dataclass
class _Plan:
    launch: object          # nf4tune.kernel.launch.PackedLaunch
    plan: DequantPlan
    choice: Choice


def _build_plan(key, device_index: int, info) -> _Plan:
    import torch

    from ..kernel.arch import device_limits
    from ..kernel.launch import PackedLaunch, load_kernel

    problem = Problem(tuple(info.shape), info.dtype, info.quant, info.blocksize)
    choice = choose_config(_gpu_name(device_index), problem)
    c = choice.config
    with torch.cuda.device(device_index):
        kernel = load_kernel(c)
        plan = DequantPlan(c, info.n, info.blocksize, info.groupsize, device_limits(device_index),
                           kernel.compiled.registers, info.shape, info.dtype)
        built = _Plan(PackedLaunch(kernel, plan), plan, choice)
    with _state_lock:
        _plans[key] = built
        _counts["plans"] += 1
    return built


@dataclass
class _Prepared:
    """A quant_state checked once: its statistics' pointers, the nested offset and the plan.
    Valid while the quant_state holds the same tensors and attributes (checked per call)."""

    ref: object
    absmax: object
    state2: object
    s2_absmax: object
    s2_code: object
    offset: object
    offset_version: int
    shape: object
    dtype: object
    blocksize: int
    quant: str
    device_index: int
    plan: _Plan
    stats: tuple          # absmax u8, code, absmax2, absmax f32, offset
    #: the packed input's (size, address) last checked: a call with the same skips the check
    packed_checked: tuple = (0, 0)


def _still_valid(p: _Prepared, qs) -> bool:
    st2 = qs.state2
    return (p.ref() is qs and qs.absmax is p.absmax and st2 is p.state2 and qs.shape == p.shape
            and qs.dtype is p.dtype and qs.blocksize == p.blocksize and qs.quant_type == p.quant
            and (st2 is None or (st2.absmax is p.s2_absmax and st2.code is p.s2_code and qs.offset is p.offset
                                 and qs.offset._version == p.offset_version)))


def _prepare(qs, A) -> _Prepared:
    """Check ``qs`` (bnb's checks and the kernel's), build or find the plan."""
    info = check_quant_state(qs, A.device)
    key = (A.device.index, info.shape, info.dtype, info.quant, info.blocksize, info.nested, info.groupsize)
    plan = _plans.get(key) or _build_plan(key, A.device.index, info)
    st2 = qs.state2
    p = _Prepared(weakref.ref(qs), qs.absmax, st2, st2.absmax if st2 is not None else None,
                  st2.code if st2 is not None else None, qs.offset if st2 is not None else None,
                  qs.offset._version if st2 is not None else 0, qs.shape, qs.dtype, qs.blocksize, info.quant,
                  A.device.index, plan, stat_pointers(qs))   # reads the nested offset back once
    key_q = id(qs)
    _prepared[key_q] = p
    weakref.finalize(qs, _prepared.pop, key_q, None)
    return p


def _legacy_quant_state(absmax, out, blocksize, quant_type):
    from bitsandbytes.functional import QuantState

    if absmax is None or out is None:
        raise ValueError("dequantize_4bit requires both absmax and out when quant_state is not provided")
    return QuantState(absmax=absmax, shape=out.shape, dtype=out.dtype, blocksize=64 if blocksize is None else blocksize,
                      quant_type=quant_type)


def dequantize_4bit(A, quant_state=None, absmax=None, out=None, blocksize=None, quant_type="fp4"):
    """bitsandbytes' ``dequantize_4bit`` (same arguments, same result bit for bit) for CUDA tensors,
    in one launch of the tuned fused kernel. Errors are bnb's kinds: ``ValueError`` for an
    unsupported blocksize, quant type or dtype, or a mismatched ``out``; ``RuntimeError`` (as
    ``torch._check`` raises) for tensors not on a CUDA device or a wrong absmax dtype;
    :class:`UnsupportedInput` (a ``ValueError``) for CUDA inputs this kernel cannot take."""
    qs = quant_state if quant_state is not None else _legacy_quant_state(absmax, out, blocksize, quant_type)
    if not A.is_cuda:
        check_attrs(qs)
        raise RuntimeError(f"nf4-tune's dequantize_4bit runs on CUDA tensors, A is on {A.device}")
    p = _prepared.get(id(qs))
    if p is None or not _still_valid(p, qs) or A.get_device() != p.device_index:
        p = _prepare(qs, A)
    served = p.plan
    if out is None:
        out = A.new_empty(p.shape, dtype=p.dtype)       # A's device: fewer arguments to parse than torch.empty
    elif out.dtype is not p.dtype:
        raise ValueError(f"Expected out.dtype == {p.dtype}, got {out.dtype}")
    else:
        served.plan.check_out(out, A, p.device_index)
    if not A.is_contiguous():
        A = A.contiguous()
    a = A.data_ptr()
    if (A.nbytes, a) != p.packed_checked:
        served.plan.check_packed(A)
        p.packed_checked = (A.nbytes, a)
    s = p.stats
    served.launch((a, s[0], s[1], s[2], s[3], s[4], out.data_ptr()), _raw_stream(p.device_index))
    _counts["calls"] += 1
    # bnb's shim for the transposed [1, (n+1)//2] packed form
    if A.shape[0] == 1:
        return out.t()
    return out


def _raw_stream(idx):
    global _raw_stream
    import torch

    _raw_stream = torch._C._cuda_getCurrentRawStream
    return _raw_stream(idx)


def explain(A, quant_state) -> Choice:
    """Which config :func:`dequantize_4bit` serves for these inputs, and why. For CPU tensors:
    bnb's own path (the patch leaves them to bnb); the choice for this problem on the current
    GPU, if one is visible, is named beside it."""
    import torch

    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(quant_state.dtype)
    problem = Problem(tuple(quant_state.shape), dtype, quant_state.quant_type, quant_state.blocksize)
    if not A.is_cuda:
        note = f"{A.device} tensors run bnb's own dequantize_4bit"
        if torch.cuda.is_available():
            note += f"; on {_gpu_name(torch.cuda.current_device())} this problem would get " + \
                choose_config(_gpu_name(torch.cuda.current_device()), problem).describe()
        return Choice(None, "bnb", None, "", note)
    return choose_config(_gpu_name(A.device.index), problem)


def plan_for(A, quant_state) -> _Plan:
    """The served plan of these CUDA inputs (what a call would launch)."""
    p = _prepared.get(id(quant_state))
    if p is None or not _still_valid(p, quant_state):
        p = _prepare(quant_state, A)
    return p.plan
