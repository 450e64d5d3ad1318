"""Serving the matmul family: a drop-in for bnb's grad-free ``matmul_4bit`` in decode.

:func:`matmul_4bit` takes bnb's arguments (``A``, the packed ``B`` as bnb's ``matmul_4bit``
receives it, the ``quant_state``, ``out``, ``bias``) and gives its result layout. Which kernel serves a
(GPU model, weight shape, dtype, quant type, blocksize, batch bucket) is decided once, by the rules of
:func:`serve_decision`: the exact table entry where it was measured faster than bnb; else a transfer of
the nearest tuned neighbours' config whose launch plan takes the shape (:meth:`ConfigTable.transfer`);
else bnb's own path. :func:`explain_matmul` says which rule served and from which problem.

The host path. Everything that depends only on the weight and the batch is built once per (weight,
M, dtype, device) and kept on the quant_state: bnb's checks, the decision, the loaded kernel, its launch
plan and packed parameters (:class:`_Served`). A call then looks its entry up by one attribute read and
a small tuple key, checks what can change from call to call (A's layout, ``out``, ``bias``), allocates
the output and launches: no device-name query, no :class:`Problem`, no repeated plan checks. A weight
whose statistics were replaced (a new absmax, code or offset tensor) is prepared again. Where bnb
serves, that too is decided once and remembered (:data:`BNB`), so the hand-off costs a lookup.

Under ``torch.use_deterministic_algorithms(True)`` a variant whose outputs each sum more than two
split-K or stream-K parts with fp32 atomics (whose rounding follows the order they arrive in) is not
served: bnb, which splits nothing, serves those calls (``explain_matmul`` says so).

A call never synchronises (the nested offset is read by the kernel through a pointer) and allocates
nothing but its output, so it can be captured in a CUDA graph once warmed up: the first call of a
(weight, batch) builds the launch plan, whose split-K workspace the kernel keeps zeroed; a plan missing
during a capture is not built there (bnb serves that call).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Optional

from ..families.matmul import MatmulPlan, check_matmul_inputs, stat_args
from ..vocabulary import M_BUCKETS, InvalidConfig, Problem, UnsupportedInput, m_bucket
from . import runtime as _runtime
from . import table as _table
from .table import TRANSFER_MAX_M, Choice

__all__ = ["matmul_4bit", "explain_matmul", "serve_decision", "Decision", "served_call", "fused_or_none", "run_bnb",
           "gpu_name", "plan_verdict", "set_first_use_hook", "BNB"]

_lock = threading.Lock()
#: ``declined.on`` is set while a call that the fused kernel declined runs bnb's own path: the bnb patch's
#: functions under bnb's torch op then run bnb's kernel without asking again
declined = threading.local()
_decisions: dict = {}
#: bumped whenever the serving table changes: every prepared weight is prepared again
_generation = [0]
#: the most rows of A the decode kernels serve (the largest batch bucket)
MAX_M = M_BUCKETS[-1]
_DTYPES: dict = {}           # torch dtype -> short name (filled on first use: torch is imported lazily)


def _reset():
    with _lock:
        _decisions.clear()
        _generation[0] += 1


_table.on_change(_reset)
for _key in ("matmul_calls", "matmul_bnb"):
    _runtime._counts.setdefault(_key, 0)


@dataclass(frozen=True)
class Decision:
    served: bool
    choice: Optional[Choice]
    reason: str

    @property
    def rule(self) -> str:
        """Which rule decided: ``exact``, ``transfer`` or ``bnb``."""
        return self.choice.source if self.served and self.choice is not None else "bnb"


_NAMES: dict = {}


def gpu_name(index: int) -> str:
    """The model name of CUDA device ``index`` (asked once per process)."""
    name = _NAMES.get(index)
    if name is None:
        import torch

        name = _NAMES[index] = torch.cuda.get_device_name(index)
    return name


def serve_decision(gpu: str, problem: Problem, accepts=None) -> Decision:
    """Whether and how the tuned kernel serves ``problem`` on GPU model ``gpu``: the exact table entry if it
    was measured faster than bnb at that batch bucket; else (M <= ``TRANSFER_MAX_M``) a transfer from the nearest
    neighbours measured faster than bnb whose config ``accepts(config)`` (True, or why not: the launch plan's verdict) takes;
    else bnb. ``accepts`` None: only the family's constraints are checked (a planning question asked
    without the device)."""
    key = (gpu, problem)
    d = _decisions.get(key)
    if d is not None:
        return d
    table = _table.current_table()
    entry = table.entry(gpu, problem)
    if entry is not None and entry.speedup_vs_bnb and entry.speedup_vs_bnb > 1.0:
        d = Decision(True, Choice(entry.config, "exact", problem.label(), entry.table),
                     f"tuned, {entry.speedup_vs_bnb:.2f}x bnb")
    else:
        choice = table.transfer(gpu, problem, accepts or (lambda c: True))
        if choice is not None:
            d = Decision(True, choice, f"transferred from {choice.tuned_for} ({choice.note})")
        elif entry is not None:
            x = f"{entry.speedup_vs_bnb:.2f}x" if entry.speedup_vs_bnb else "no comparison with bnb"
            d = Decision(False, Choice(entry.config, "exact", problem.label(), entry.table),
                         f"the tuned variant was not faster than bnb at m={problem.m} ({x}), and no neighbour's "
                         "config serves it: bnb serves it")
        else:
            why = ("no tuned neighbour's config takes its shape" if _table.transfers_at(problem)
                   else f"no transfer above M = {TRANSFER_MAX_M}")
            d = Decision(False, None, f"{problem.label()} is not tuned for {gpu} and {why}: bnb serves it")
    with _lock:
        _decisions[key] = d
    return d


def nondeterministic_reason(plan) -> str:
    return (f"torch's deterministic algorithms are on and {plan.config.short()} adds {plan.parts} parts of each "
            "output with fp32 atomics (the rounding follows their arrival order): bnb serves it")


def _dtype_name(dtype) -> Optional[str]:
    if not _DTYPES:
        import torch

        _DTYPES.update({torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"})
    return _DTYPES.get(dtype)


def problem_of(qs, dtype: str, N: int, K: int, M: int) -> Problem:
    return Problem((N, K), dtype, qs.quant_type, int(qs.blocksize), "matmul", m_bucket(M))


def plan_verdict(config, M, N, K, blocksize, groupsize, limits, registers=None):
    """True when ``config``'s launch plan takes an M x K by N x K problem on a device of ``limits`` (with
    ``registers`` per thread, where known), else the plan's reason (its split-K workspace on "meta": nothing
    is allocated)."""
    try:
        MatmulPlan(config, M, N, K, blocksize, groupsize, limits, registers, "meta")
    except (UnsupportedInput, InvalidConfig) as e:
        return str(e)
    return True


def _plan_verdict(config, M, N, K, blocksize, groupsize, device_index):
    """:func:`plan_verdict` on the device, with the kernel's register count (it is compiled and loaded)."""
    from ..kernel.arch import device_limits
    from ..kernel.launch import load_kernel

    try:
        registers = load_kernel(config).compiled.registers
    except Exception as e:          # a config that does not compile here transfers nowhere
        return f"does not compile: {type(e).__name__}: {e}"
    return plan_verdict(config, M, N, K, blocksize, groupsize, device_limits(device_index), registers)


_first_use: list = [None]


def set_first_use_hook(fn) -> None:
    """``fn(A, qs, bias, B) -> bool`` is called on the first call of a problem the serving table holds no entry
    for (nf4tune.tune.autotune installs it for ``NF4TUNE_AUTOTUNE=1``); True means it added one (the table
    was reloaded). None removes it."""
    _first_use[0] = fn


class _Served:
    """One (weight, M, dtype, device) served by the fused kernel: the packed launch and what a call
    must still check."""

    __slots__ = ("launch", "plan", "N", "order_free")

    def __init__(self, launch, plan, N):
        self.launch, self.plan, self.N = launch, plan, N
        self.order_free = plan.order_free


#: the decision of a (weight, M, dtype, device) that bnb serves, kept like a served entry
BNB = object()


class _Weight:
    """A quant_state checked once: the tensors its decisions depend on (by identity), its statistics'
    kernel arguments, and the decision per (M, dtype, device)."""

    __slots__ = ("absmax", "state2", "s2_absmax", "s2_code", "offset", "shape", "blocksize", "quant", "N", "K",
                 "groupsize", "stats", "generation", "calls", "by_shape", "b_checked")

    def __init__(self, qs):
        st2 = qs.state2
        self.absmax, self.state2 = qs.absmax, st2
        self.s2_absmax = st2.absmax if st2 is not None else None
        self.s2_code = st2.code if st2 is not None else None
        self.offset = qs.offset if st2 is not None else None
        self.shape, self.blocksize, self.quant = qs.shape, qs.blocksize, qs.quant_type
        self.N, self.K = int(qs.shape[0]), int(qs.shape[1])
        self.groupsize = int(st2.blocksize) if st2 is not None else 256
        self.stats = stat_args(qs)
        self.generation = _generation[0]
        #: (M, dtype, device) -> _Served or BNB: the decision and plan of each batch bucket's rows
        self.calls: dict = {}
        #: (A.shape, A.dtype, device) -> (_Served, output shape) or (BNB, None): the hot path's one lookup, for the
        #: shapes of at most MAX_M rows (so that it stays small)
        self.by_shape: dict = {}
        #: the packed weight's address last checked (alignment, size): a call at that address skips those checks
        self.b_checked = None

    # a copied or pickled quant state carries no prepared weight (its launches hold locks and device
    # pointers): it is prepared on its own first call
    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return (_nothing, ())

    def decide(self, problem: Problem, index: int) -> Decision:
        """:func:`serve_decision` for this weight's ``problem`` on CUDA device ``index``, a transfer taking only a
        config whose launch plan (with its kernel's registers) takes the shape at the bucket's rows."""
        return serve_decision(gpu_name(index), problem, lambda c: _plan_verdict(
            c, problem.m, self.N, self.K, self.blocksize, self.groupsize, index))

    def holds(self, qs) -> bool:
        """Whether ``qs`` still holds the tensors this was prepared from."""
        st2 = qs.state2
        return (qs.absmax is self.absmax and st2 is self.state2 and self.generation == _generation[0]
                and (st2 is None or (st2.absmax is self.s2_absmax and st2.code is self.s2_code
                                     and qs.offset is self.offset)))


def _nothing():
    return None


def _weight(qs) -> _Weight:
    w = qs.__dict__.get("_nf4tune_weight")
    if w is None or not w.holds(qs):
        w = _Weight(qs)
        qs.__dict__["_nf4tune_weight"] = w
    return w


def _prepare(w: _Weight, qs, A, M: int, bias, B=None):
    """The decision for a new (M, dtype, device) of weight ``w``: a :class:`_Served`, or :data:`BNB` with its
    reason counted by the caller. Raises bnb's errors for calls bnb would refuse."""
    import torch

    N, K, dtype = check_matmul_inputs(A, qs, bias)
    if torch.cuda.is_current_stream_capturing():
        # the decision and the plan are made on the first call (kernels load, workspaces are allocated), which
        # must come before a CUDA-graph capture (warm up first): bnb serves this call, the next one outside a
        # capture decides
        return None
    index = A.get_device()
    problem = problem_of(qs, dtype, N, K, M)

    hook = _first_use[0]
    if (hook is not None and B is not None and not getattr(declined, "on", False)
            and _table.current_table().entry(gpu_name(index), problem) is None):
        hook(A, qs, bias, B)
    d = w.decide(problem, index)
    if not d.served:
        return BNB
    from ..kernel.arch import device_limits
    from ..kernel.launch import PackedLaunch, load_kernel

    config = d.choice.config
    if pdl_enabled(index):
        config = config.replace(pdl=1)
    with torch.cuda.device(index):
        kernel = load_kernel(config)
        try:
            plan = MatmulPlan(config, M, N, K, w.blocksize, w.groupsize, device_limits(index),
                              kernel.compiled.registers, A.device)
        except UnsupportedInput:
            return BNB
        plan.check_stats(w.stats)
        return _Served(PackedLaunch(kernel, plan), plan, N)


_pdl_override: list = [None]


def use_pdl(flag: Optional[bool]) -> None:
    """Serve with programmatic dependent launch (True), without (False), or as ``NF4TUNE_PDL`` says (None); the
    decisions already made are made again on each weight's next call."""
    _pdl_override[0] = flag
    _reset()


def pdl_enabled(index: int) -> bool:
    """Whether served kernels are launched for programmatic dependent launch on CUDA device ``index``:
    ``NF4TUNE_PDL=1`` (or :func:`use_pdl`) and a compute capability of 9.0 or more (experimental). Such a kernel
    reads the packed weight and its statistics before the kernel launched just before it in the stream has
    finished, so a weight must not be written by the kernel right before its use (quantize, then synchronize or
    run anything else first)."""
    if _pdl_override[0] is not None:
        wanted = _pdl_override[0]
    else:
        flag = os.environ.get("NF4TUNE_PDL", "0")
        if flag not in ("0", "1"):
            raise ValueError(f"NF4TUNE_PDL={flag!r}: 1 (programmatic dependent launch) or 0")
        wanted = flag == "1"
    if not wanted:
        return False
    import torch

    return torch.cuda.get_device_capability(index)[0] >= 9


def served_call(A, qs, M: Optional[int] = None, bias=None, B=None):
    """The prepared entry of this call's (weight, M, dtype, device): a :class:`_Served`, or :data:`BNB`.
    Built on the first call of the key (bnb's checks, the decision, the plan), looked up afterwards."""
    w = _weight(qs)
    if M is None:
        M = A.numel() // w.K if A.shape[-1] == w.K else 0
    key = (M, A.dtype, A.get_device())
    s = w.calls.get(key)
    if s is None:
        if not 1 <= M <= MAX_M:      # not a decode batch (nor kept: prefill lengths are many)
            return BNB
        try:
            s = _prepare(w, qs, A, M, bias, B)
        except UnsupportedInput:
            s = BNB
        if s is None:                # not decided here (a CUDA-graph capture): bnb serves this call only
            return BNB
        w.calls[key] = s
    return s


def _launch(s: _Served, w: _Weight, A, B, out, bias, out_shape):
    """Per-call checks that the entry cannot hold (A's layout, B's address, ``out``, ``bias``), then the launch.
    Returns the output, or None when this call's tensors are ones the kernel cannot take."""
    if not A.is_contiguous():
        A = A.contiguous()
    a = A.data_ptr()
    if a & 15:
        return None
    with _no_torch_function():       # bnb's Params4bit reads each attribute through __torch_function__ (~4 us)
        b = B.data_ptr()
        if not B.is_contiguous():
            return None
        if b != w.b_checked:
            if b & 15 or B.numel() * B.element_size() < s.plan.N * s.plan.K // 2:
                return None
            w.b_checked = b
    if bias is not None:
        if bias.dtype != A.dtype or bias.numel() != s.N or not bias.is_contiguous():
            return None
        bias_ptr = bias.data_ptr()
    else:
        bias_ptr = 0
    if out is None:
        out = A.new_empty(out_shape)          # A's dtype and device: fewer arguments to parse
    elif out.dtype != A.dtype or out.numel() != A.numel() // s.plan.K * s.N or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {A.dtype} tensor of shape {tuple(out_shape)}, got "
                         f"{out.dtype} {tuple(out.shape)}")
    if not s.order_free and _deterministic():
        return None
    st = w.stats
    s.launch((a, b, st[0], st[1], st[2], st[3], st[4], bias_ptr, out.data_ptr()), _raw_stream(A.get_device()))
    _runtime._counts["matmul_calls"] += 1
    return out


def fused_or_none(A, B, qs, out=None, bias=None):
    """The fused kernel's result for bnb's grad-free ``matmul_4bit(A, B, qs, out, bias)``, or None when bnb
    should serve this call (decided once per weight and M; the caller counts and calls bnb). The hot path: one
    attribute read and one dictionary lookup by A's shape, dtype and device, then :func:`_launch`."""
    w = qs.__dict__.get("_nf4tune_weight")
    if w is None or not w.holds(qs):
        w = _weight(qs)
    shape = A.shape
    key = (shape, A.dtype, A.get_device())
    hit = w.by_shape.get(key)
    if hit is None:
        K = w.K
        M = A.numel() // K if shape[-1] == K else 0
        s = served_call(A, qs, M, bias, B)
        hit = (s, None) if s is BNB else (s, (*shape[:-1], s.N))
        if (M, A.dtype, key[2]) in w.calls:        # decided (not a call inside a capture), at most MAX_M rows
            w.by_shape[key] = hit
    s = hit[0]
    if s is BNB:
        return None
    return _launch(s, w, A, B, out, bias, hit[1])


def run_bnb(fn, *args):
    """``fn(*args)``, bnb's own function for a call the fused kernel declined: counted as ``matmul_bnb``, and
    with :data:`declined` set so that nothing under it asks again."""
    _runtime._counts["matmul_bnb"] += 1
    declined.on = True
    try:
        return fn(*args)
    finally:
        declined.on = False


def _bnb_matmul(A, B, quant_state, out, bias):
    import torch
    import bitsandbytes as bnb

    with torch.no_grad():
        return bnb.matmul_4bit(A, B, quant_state, out=out, bias=bias)


def matmul_4bit(A, B, quant_state, out=None, bias=None):
    """bnb's grad-free ``matmul_4bit(A, B, quant_state, out, bias)`` (B as bnb receives it, e.g.
    ``layer.weight.t()``): the tuned fused kernel where it was measured faster than bnb (or a tuned
    neighbour's config transfers), bnb's own path elsewhere (counted as ``matmul_bnb``). Errors are bnb's
    kinds."""
    if A.is_cuda and quant_state is not None and quant_state.shape is not None and len(quant_state.shape) == 2:
        y = fused_or_none(A, B, quant_state, out, bias)
        if y is not None:
            return y
        return run_bnb(_bnb_matmul, A, B, quant_state, out, bias)
    _runtime.count("cpu_handoffs")
    return _bnb_matmul(A, B, quant_state, out, bias)


def explain_matmul(A, quant_state, bias=None) -> Decision:
    """What :func:`matmul_4bit` does with these inputs, and why: which rule served (exact entry, transfer
    from which tuned problem) or why bnb serves."""
    if not A.is_cuda:
        return Decision(False, None, f"{A.device} tensors: bnb's own matmul_4bit")
    try:
        N, K, dtype = check_matmul_inputs(A, quant_state, bias)
    except UnsupportedInput as e:
        return Decision(False, None, f"{e}")
    M = A.numel() // K
    if M > MAX_M:
        return Decision(False, None, f"M={M} is past the decode buckets (<= {MAX_M}): bnb serves it")
    w = _weight(quant_state)
    problem = problem_of(quant_state, dtype, N, K, M)
    index = A.get_device()
    d = w.decide(problem, index)
    if d.served:
        s = served_call(A, quant_state, M, bias)
        if s is BNB:
            return Decision(False, d.choice, f"{d.reason}, but its launch plan refuses M={M}: bnb serves it")
        if not s.order_free and _deterministic():
            return Decision(False, d.choice, nondeterministic_reason(s.plan))
    return d


def served_gemm(A, B, shapeB, blocksize, quant_type, bias, qs_of):
    """The bnb patch's entry under bnb's torch op (``gemm_4bit``: torch.compile and CUDA-graph capture
    come this way): the fused result, or None when bnb should run (counted). ``qs_of()`` gives the weight's
    QuantState, built once from bnb's separate statistics and kept."""
    if not A.is_cuda or len(shapeB) != 2 or _dtype_name(A.dtype) is None:
        _runtime._counts["matmul_bnb"] += 1
        return None
    qs = qs_of()
    y = fused_or_none(A, B, qs, None, bias)
    if y is None:
        _runtime._counts["matmul_bnb"] += 1
    return y


def _no_torch_function():
    global _no_torch_function
    import torch

    _no_torch_function = torch._C.DisableTorchFunctionSubclass
    return _no_torch_function()


def _deterministic():
    global _deterministic
    import torch

    _deterministic = torch.are_deterministic_algorithms_enabled
    return _deterministic()


def _raw_stream(idx):
    global _raw_stream
    import torch

    _raw_stream = torch._C._cuda_getCurrentRawStream
    return _raw_stream(idx)
