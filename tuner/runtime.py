"""Serving tuned kernels: a drop-in ``dequantize_4bit`` for bitsandbytes users.

:func:`dequantize_4bit` takes bnb's arguments and gives bnb's result, bit for bit, for CUDA
tensors, in one fused launch of the variant tuned for this GPU and problem. The config comes
from a table of tuned configs (``nf4-tune export``) or a database, chosen in this order:

1. what :func:`use_configs` was given (a configs.json path or a database URL);
2. ``$NF4TUNE_CONFIGS`` (a configs.json path);
3. ``$NF4TUNE_DB`` (a database URL or a SQLite path);
4. the table shipped with the package (``tuner/tuned_configs.json``, the H200 searches).

For a problem (shape, dtype, quant type, blocksize) on the current GPU model it takes the exact
entry, else the nearest tuned problem of the same dtype and quant type on this GPU (blocksize
first, then element count on a log scale), else a built-in default for the dtype that beats bnb
on the H200. Each kernel is compiled once per process (and found in the disk cache by later
processes); the launch geometry and packed arguments are built once per problem, so a call
costs the checks, six pointer writes and one ``cuLaunchKernel``.

:func:`patch_bitsandbytes` routes bnb's own ``dequantize_4bit`` (and through it ``Linear4bit``,
``matmul_4bit`` and the large-batch dequantize-then-matmul path of ``gemm_4bit``) through this
runtime; as a context manager, or as a call whose result's ``undo()`` restores bnb.
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .space import InvalidConfig, KernelConfig, preset

__all__ = ["dequantize_4bit", "patch_bitsandbytes", "use_configs", "choose_config", "explain", "Choice",
           "ConfigTable", "BUILTIN_DEFAULTS", "UnsupportedInput", "stats"]

PACKAGED_TABLE = Path(__file__).with_name("tuned_configs.json")
_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)

# The built-in defaults: what the H200 searches found best across shapes for each dtype.
_WINNER_16 = dict(bytes_per_thread=4, unroll=4, threads=128, lut="shared", index="hoisted", store="streaming")
BUILTIN_DEFAULTS = {"bf16": _WINNER_16, "fp16": _WINNER_16,
                    "fp32": dict(bytes_per_thread=2, unroll=4, threads=256, lut="shared", index="hoisted")}


class UnsupportedInput(ValueError):
    """CUDA inputs the fused kernel cannot take (more than 2**31-1 values, misaligned views);
    the bnb patch hands such calls to bnb with a warning."""


# ------------------------------------------------------------------------- config choice
@dataclass(frozen=True)
class Choice:
    config: KernelConfig
    source: str          # "exact", "nearest" or "default"
    tuned_for: Optional[str] = None   # the problem of the table entry used
    table: str = ""

    def describe(self) -> str:
        where = f" ({self.tuned_for} in {self.table})" if self.tuned_for else ""
        return f"{self.source}{where}: {self.config.short()}"


def _problem_text(shape, dtype, quant, blocksize) -> str:
    return f"{'x'.join(map(str, shape))} {dtype} {quant} bs{blocksize}"


class ConfigTable:
    """Tuned entries ``{gpu, shape, dtype, quant, blocksize, config}`` and the choice among them."""

    def __init__(self, entries: list[dict], origin: str):
        self.origin = origin
        self.entries = []
        for e in entries:
            try:
                cfg = KernelConfig.from_dict(e["config"])
                shape = tuple(int(d) for d in e["shape"])
                self.entries.append((e["gpu"], shape, e["dtype"], e["quant"], int(e["blocksize"]), cfg))
            except (KeyError, TypeError, ValueError, InvalidConfig) as err:
                raise ValueError(f"{origin}: bad entry {e!r}: {err}") from None

    @classmethod
    def from_file(cls, path) -> "ConfigTable":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the config table {path}: {e}") from None
        if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("entries"), list):
            raise ValueError(f"{path} is not a table written by `nf4-tune export` (format 1)")
        return cls(data["entries"], str(path))

    @classmethod
    def from_database(cls, url: str) -> "ConfigTable":
        from . import record
        from db import resolve_url

        resolved = resolve_url(url)
        return cls(record.best_configs(record.open_repository(resolved)), resolved)

    def choose(self, gpu: str, shape, dtype: str, quant: str, blocksize: int) -> Choice:
        shape = tuple(int(d) for d in shape)
        n = max(1, math.prod(shape))
        same = [e for e in self.entries if e[0] == gpu and e[2] == dtype and e[3] == quant]
        for e in same:
            if e[1] == shape and e[4] == blocksize:
                return Choice(e[5], "exact", _problem_text(e[1], dtype, quant, e[4]), self.origin)
        if same:
            def distance(e):
                return (e[4] != blocksize, abs(math.log(max(1, math.prod(e[1]))) - math.log(n)),
                        abs(math.log2(e[4]) - math.log2(blocksize)), e[1])
            e = min(same, key=distance)
            return Choice(e[5], "nearest", _problem_text(e[1], dtype, quant, e[4]), self.origin)
        return Choice(KernelConfig.from_dict(dict(BUILTIN_DEFAULTS[dtype], dtype=dtype, quant=quant)), "default",
                      None, self.origin)


_state_lock = threading.Lock()
_table: Optional[ConfigTable] = None
_plans: dict = {}
_counts = {"calls": 0, "plans": 0, "bnb_handoffs": 0}


def use_configs(source: Optional[str] = None) -> ConfigTable:
    """Serve from ``source``: a configs.json written by ``nf4-tune export``, or a database URL
    (``sqlite:///...``, ``postgresql://...``); None goes back to the environment / packaged
    table. Clears the per-process plans, so later calls choose again."""
    global _table
    with _state_lock:
        _plans.clear()
        _table = None if source is None else _load_table(source)
        return _current_table_locked()


def _load_table(source: str) -> ConfigTable:
    if "://" in source:
        return ConfigTable.from_database(source)
    if source.endswith(".json"):
        return ConfigTable.from_file(source)
    return ConfigTable.from_database(source)   # a SQLite path


def _current_table_locked() -> ConfigTable:
    global _table
    if _table is None:
        if os.environ.get("NF4TUNE_CONFIGS"):
            _table = ConfigTable.from_file(os.environ["NF4TUNE_CONFIGS"])
        elif os.environ.get("NF4TUNE_DB"):
            _table = ConfigTable.from_database(os.environ["NF4TUNE_DB"])
        else:
            _table = ConfigTable.from_file(PACKAGED_TABLE)
    return _table


def choose_config(gpu: str, shape, dtype: str, quant: str, blocksize: int) -> Choice:
    """The config the runtime serves for this problem on GPU model ``gpu``."""
    with _state_lock:
        table = _current_table_locked()
    return table.choose(gpu, shape, dtype, quant, blocksize)


def stats() -> dict:
    """Calls served, plans built and calls handed to bnb by the patch, in this process."""
    return dict(_counts)


# ------------------------------------------------------------------------- the call
_DTYPE_NAMES = None


def _dtype_name(torch, dtype) -> Optional[str]:
    global _DTYPE_NAMES
    if _DTYPE_NAMES is None:
        _DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    return _DTYPE_NAMES.get(dtype)


_OUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
@dataclass
class _Plan:
    launch: object          # tuner.launch.PackedLaunch
    choice: Choice
    nbytes_in: int
    nblocks: int
    ngroups: int
    load_align: int
    store_align: int


def _gpu_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def _build_plan(key, device_index: int, n: int, shape, dtype: str, quant: str, blocksize: int,
                groupsize: int) -> _Plan:
    from .launch import PackedLaunch, load_kernel, LaunchError

    choice = choose_config(_gpu_name(device_index), shape, dtype, quant, blocksize)
    c = choice.config
    import torch

    with torch.cuda.device(device_index):
        try:
            launch = PackedLaunch(load_kernel(c), n, blocksize, groupsize)
        except LaunchError as e:
            raise UnsupportedInput(str(e)) from None
    nblocks = -(-n // blocksize)
    plan = _Plan(launch, choice, (n + 1) // 2, nblocks, -(-nblocks // groupsize), c.bytes_per_thread,
                 min(16, 2 * c.bytes_per_thread * _OUT_BYTES[dtype]))
    with _state_lock:
        _plans[key] = plan
        _counts["plans"] += 1
    return plan


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
    ptrs: tuple          # absmax u8, code, absmax2, absmax f32
    offset_value: float


_prepared: dict = {}


def _still_valid(p: _Prepared, qs) -> bool:
    st2 = qs.state2
    return (p.ref() is qs and qs.absmax is p.absmax and st2 is p.state2 and qs.shape == p.shape
            and qs.dtype is p.dtype and qs.blocksize == p.blocksize and qs.quant_type == p.quant
            and (st2 is None or (st2.absmax is p.s2_absmax and st2.code is p.s2_code and qs.offset is p.offset
                                 and qs.offset._version == p.offset_version)))


def _check_attrs(qs):
    """bnb's checks of a quant_state's blocksize, quant type and dtype (its messages, ValueError)."""
    import torch

    bs = qs.blocksize
    if bs not in _BLOCKSIZES:
        raise ValueError(f"invalid blocksize {bs}")
    quant = qs.quant_type
    if quant not in ("nf4", "fp4"):
        raise ValueError(f"quant_type must be 'nf4' or 'fp4', got {quant!r}")
    dtype = _dtype_name(torch, qs.dtype)
    if dtype is None:
        raise ValueError(f"Blockwise 4bit dequantization only supports 16/32-bit floats, but got {qs.dtype}")
    return bs, quant, dtype


def _prepare(qs, A) -> _Prepared:
    """Check ``qs`` as bnb would (and as the kernel needs), build or find the plan."""
    import torch

    bs, quant, dtype = _check_attrs(qs)
    device = A.device
    state2 = qs.state2
    stats_t = qs.absmax
    torch._check(stats_t.device == device, lambda: f"Expected absmax.device == {device}, got {stats_t.device}")
    if state2 is not None:
        groupsize = state2.blocksize
        torch._check(stats_t.dtype == torch.uint8, lambda: f"nested absmax must be uint8, got {stats_t.dtype}")
        torch._check(state2.absmax.dtype == torch.float32 and state2.code.dtype == torch.float32,
                     lambda: "state2.absmax and state2.code must be float32")
        torch._check(state2.absmax.device == device and state2.code.device == device,
                     lambda: f"Expected state2 tensors on {device}")
        if groupsize <= 0 or groupsize & (groupsize - 1):
            raise UnsupportedInput(f"state2.blocksize {groupsize} is not a power of two")
        if not (stats_t.is_contiguous() and state2.absmax.is_contiguous() and state2.code.is_contiguous()):
            raise UnsupportedInput("quant_state tensors must be contiguous")
    else:
        groupsize = 256
        torch._check(stats_t.dtype == torch.float32, lambda: f"absmax must be float32, got {stats_t.dtype}")
        if not stats_t.is_contiguous():
            raise UnsupportedInput("quant_state.absmax must be contiguous")
    shape = qs.shape
    if type(shape) is not torch.Size:
        shape = torch.Size(shape)
    key = (device.index, shape, dtype, quant, bs, state2 is not None, groupsize)
    plan = _plans.get(key)
    if plan is None:
        n = math.prod(shape)
        if n < 1:
            raise UnsupportedInput(f"quant_state.shape {tuple(shape)} holds no values")
        plan = _build_plan(key, device.index, n, shape, dtype, quant, bs, groupsize)
    if stats_t.numel() < plan.nblocks:
        raise ValueError(f"absmax holds {stats_t.numel()} values, {plan.nblocks} blocks needed")
    if state2 is not None:
        if state2.absmax.numel() < plan.ngroups or state2.code.numel() != 256:
            raise ValueError("state2 holds too few absmax values or a code that is not 256 values")
        ptrs = (stats_t.data_ptr(), state2.code.data_ptr(), state2.absmax.data_ptr(), 0)
        offset_value = float(qs.offset)   # a device scalar: read back once per quant_state
        offset, version = qs.offset, qs.offset._version
    else:
        ptrs = (0, 0, 0, stats_t.data_ptr())
        offset_value, offset, version = 0.0, None, 0
    p = _Prepared(weakref.ref(qs), stats_t, state2, state2.absmax if state2 is not None else None,
                  state2.code if state2 is not None else None, offset, version, qs.shape, qs.dtype, bs, quant,
                  device.index, plan, ptrs, offset_value)
    key_q = id(qs)
    _prepared[key_q] = p
    weakref.finalize(qs, _prepared.pop, key_q, None)
    return p


def dequantize_4bit(A, quant_state=None, absmax=None, out=None, blocksize=None, quant_type="fp4"):
    """bitsandbytes' ``dequantize_4bit`` (same arguments, same result bit for bit) for CUDA tensors,
    in one launch of the tuned fused kernel. Errors are bnb's kinds: ``ValueError`` for an
    unsupported blocksize, quant type or dtype, or a mismatched ``out``; ``RuntimeError`` (as
    ``torch._check`` raises) for tensors not on a CUDA device or a wrong absmax dtype;
    :class:`UnsupportedInput` (a ``ValueError``) for CUDA inputs this kernel cannot take.

    The quant_state is checked once and remembered (while it holds the same tensors and
    attributes); a call then checks A and ``out`` and launches."""
    qs = quant_state
    if qs is None:
        if absmax is None or out is None:
            raise ValueError("dequantize_4bit requires both absmax and out when quant_state is not provided")
        from bitsandbytes.functional import QuantState

        qs = QuantState(absmax=absmax, shape=out.shape, dtype=out.dtype,
                        blocksize=64 if blocksize is None else blocksize, quant_type=quant_type)
    if not A.is_cuda:
        _check_attrs(qs)
        raise RuntimeError(f"nf4-tune's dequantize_4bit runs on CUDA tensors, A is on {A.device}")
    p = _prepared.get(id(qs))
    if p is None or not _still_valid(p, qs) or A.get_device() != p.device_index:
        p = _prepare(qs, A)
    plan = p.plan
    idx = p.device_index
    if out is None:
        out = _torch_empty(p.shape, dtype=p.dtype, device=A.device)
    else:
        if out.shape != p.shape:
            raise ValueError(f"Expected out.shape == {list(p.shape)}, got {out.shape}")
        if out.dtype is not p.dtype:
            raise ValueError(f"Expected out.dtype == {p.dtype}, got {out.dtype}")
        if out.get_device() != idx:
            raise RuntimeError(f"Expected out.device == {A.device}, got {out.device}")
        if not out.is_contiguous():
            raise UnsupportedInput("out must be contiguous")
    if not A.is_contiguous():
        A = A.contiguous()
    if A.nbytes < plan.nbytes_in:
        raise ValueError(f"A holds {A.nbytes} bytes, {plan.nbytes_in} needed for quant_state.shape "
                         f"{tuple(p.shape)}")
    a_ptr, out_ptr = A.data_ptr(), out.data_ptr()
    if a_ptr % plan.load_align or out_ptr % plan.store_align:
        raise UnsupportedInput(f"A or out is not aligned for {plan.choice.config.short()} "
                               f"({plan.load_align}/{plan.store_align} bytes)")
    q = p.ptrs
    plan.launch(a_ptr, q[0], q[1], q[2], q[3], p.offset_value, out_ptr, _raw_stream(idx))
    _counts["calls"] += 1
    # bnb's shim for the transposed [1, (n+1)//2] packed form
    if A.shape[0] == 1:
        return out.t()
    return out


def _torch_empty(*args, **kw):
    global _torch_empty
    import torch

    _torch_empty = torch.empty
    return torch.empty(*args, **kw)


def _raw_stream(idx):
    global _raw_stream
    import torch

    _raw_stream = torch._C._cuda_getCurrentRawStream
    return _raw_stream(idx)


def explain(A, quant_state) -> Choice:
    """Which config :func:`dequantize_4bit` serves for these inputs, and why."""
    import torch

    dtype = _dtype_name(torch, quant_state.dtype)
    return choose_config(_gpu_name(A.device.index), quant_state.shape, dtype, quant_state.quant_type,
                         quant_state.blocksize)


# ------------------------------------------------------------------------- the bnb patch
class _BnbPatch:
    """Swaps bnb's dequantizing entry points for the runtime's, and back."""

    def __init__(self):
        import bitsandbytes.functional as F

        self._undo = []
        self._warned = False
        self._states = {}
        original = F.dequantize_4bit
        self._original_dequantize = original

        def patched_dequantize_4bit(A, quant_state=None, absmax=None, out=None, blocksize=None, quant_type="fp4"):
            if not getattr(A, "is_cuda", False):
                return original(A, quant_state, absmax, out, blocksize, quant_type)
            try:
                return dequantize_4bit(A, quant_state, absmax, out, blocksize, quant_type)
            except UnsupportedInput as e:
                return self._hand_to_bnb(e, original, A, quant_state, absmax, out, blocksize, quant_type)

        patched_dequantize_4bit.__wrapped__ = original
        patched_dequantize_4bit.__doc__ = "nf4-tune runtime in place of bnb's dequantize_4bit (CUDA tensors)."
        self._swap(F, "dequantize_4bit", patched_dequantize_4bit)

        # gemm_4bit's large-batch path (Linear4bit / matmul_4bit without grad) dequantizes with the
        # backend's private helper, not with F.dequantize_4bit: route that helper too.
        try:
            import bitsandbytes.backends.cuda.ops as cuda_ops
        except Exception:  # bnb without its CUDA backend
            cuda_ops = None
        fallback = getattr(cuda_ops, "_dequant_linear_fallback", None)
        if fallback is not None:
            from bitsandbytes.functional import QuantState

            def patched_dequant_linear(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None,
                                       absmax_code=None, absmax_offset=None):
                import torch

                # one QuantState per weight, kept while its tensors live: the runtime then checks
                # it (and reads the nested offset back) once, not on every forward
                key = (id(absmax_8bit), id(absmax), id(absmax_code), id(absmax_offset), tuple(shapeB), blocksize,
                       quant_type, A.dtype)
                hit = self._states.get(key)
                qs = hit[1] if hit is not None and all(r() is t for r, t in zip(hit[0], (absmax_8bit, absmax))) else None
                if qs is None:
                    if absmax_8bit is not None:
                        state2 = QuantState(absmax=absmax, code=absmax_code, blocksize=256, dtype=torch.float32)
                        qs = QuantState(absmax=absmax_8bit, shape=torch.Size(shapeB), dtype=A.dtype,
                                        blocksize=blocksize, quant_type=quant_type, offset=absmax_offset, state2=state2)
                    else:
                        qs = QuantState(absmax=absmax, shape=torch.Size(shapeB), dtype=A.dtype, blocksize=blocksize,
                                        quant_type=quant_type)
                    refs = tuple(weakref.ref(t) if t is not None else (lambda: None) for t in (absmax_8bit, absmax))
                    self._states[key] = (refs, qs)
                try:
                    B_dq = dequantize_4bit(B, qs)
                except UnsupportedInput as e:
                    return self._hand_to_bnb(e, fallback, A, B, shapeB, absmax, blocksize, quant_type, bias,
                                             absmax_8bit, absmax_code, absmax_offset)
                if B_dq.shape != torch.Size(shapeB):   # B given in the [1, n] form
                    B_dq = B_dq.t()
                return torch.nn.functional.linear(A, B_dq, bias)

            self._swap(cuda_ops, "_dequant_linear_fallback", patched_dequant_linear)

    def _swap(self, module, name, new):
        old = getattr(module, name)
        setattr(module, name, new)
        self._undo.append((module, name, old))

    def _hand_to_bnb(self, err, fn, *args):
        with _state_lock:
            _counts["bnb_handoffs"] += 1
        if not self._warned:
            self._warned = True
            warnings.warn(f"nf4-tune runtime: {err}; this call (and later ones like it) runs bnb's own kernel",
                          RuntimeWarning, stacklevel=3)
        return fn(*args)

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def undo(self) -> None:
        """Put bnb's functions back (in reverse order of patching). Safe to call twice."""
        while self._undo:
            module, name, old = self._undo.pop()
            setattr(module, name, old)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()
        return False


def patch_bitsandbytes() -> _BnbPatch:
    """Route bnb's ``dequantize_4bit`` (and with it ``Linear4bit`` and ``matmul_4bit`` wherever they
    dequantize) through this runtime for CUDA tensors; other devices keep bnb's own path.
    Use as ``with patch_bitsandbytes(): ...`` or ``p = patch_bitsandbytes(); ...; p.undo()``."""
    return _BnbPatch()
