"""Loading compiled variants and launching them on torch-owned device memory (cuda.core).

Together with :mod:`tuner.compiler` this is where every direct CUDA call lives. A variant runs
on the current torch stream; loaded modules are cached per process. Inputs are checked before
any launch: a kernel never touches memory out of bounds because of a bad pointer or count.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from kernel_templates import KERNEL_NAME
from .compiler import compile_config
from .space import KernelConfig

__all__ = ["LaunchError", "DequantKernel", "BoundLaunch", "PackedLaunch", "load_kernel", "run_config",
           "MAX_ELEMENTS", "problem_bytes", "raw_stream"]

#: the kernel indexes elements with 32-bit unsigned integers and packed bytes as 2*i
MAX_ELEMENTS = 2**31 - 1
_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_OUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


_MODULES: dict = {}   # sha256 of a CUBIN -> (ObjectCode, Kernel), per process


class LaunchError(ValueError):
    """Inputs the variant cannot handle, or a failed launch; nothing was written."""


def _torch():
    import torch

    return torch


def problem_bytes(n: int, blocksize: int, dtype: str, nested: bool = True, groupsize: int = 256) -> int:
    """The fewest bytes a dequantization must move: packed + absmax + group absmax + output."""
    nblocks = -(-n // blocksize)
    stats = nblocks * 1 + (-(-nblocks // groupsize)) * 4 + 256 * 4 + 4 if nested else nblocks * 4
    return (n + 1) // 2 + stats + n * _OUT_BYTES[dtype]


class _StreamHandle:
    """Wraps a raw CUDA stream handle (torch's) in the __cuda_stream__ protocol of cuda.core."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


@lru_cache(maxsize=64)
def _core_stream(handle: int):
    from cuda.core import Device

    return Device().create_stream(_StreamHandle(handle))


@lru_cache(maxsize=None)
def _sm_count() -> int:
    from .gpu import require_gpu

    return require_gpu().sm_count


@dataclass
class BoundLaunch:
    """A launch with its arguments checked and packed; calling it launches on the current stream."""

    kernel: "DequantKernel"
    grid: int
    args: tuple

    def __call__(self):
        from cuda.core import LaunchConfig, launch

        torch = _torch()
        stream = _core_stream(torch.cuda.current_stream().cuda_stream)
        try:
            launch(stream, LaunchConfig(grid=self.grid, block=self.kernel.config.threads), self.kernel.function,
                   *self.args)
        except Exception as e:
            raise LaunchError(f"launch of {self.kernel.config.short()} failed: {e}") from None


def raw_stream(device_index: int) -> int:
    """The raw handle of torch's current stream on ``device_index`` (bnb reads it the same way)."""
    return _torch()._C._cuda_getCurrentRawStream(device_index)


@lru_cache(maxsize=64)
def _cu_stream(handle: int):
    from cuda.bindings import driver

    return driver.CUstream(handle)


class PackedLaunch:
    """One launch geometry of a loaded variant with its kernel parameters packed once: per call
    only the six data pointers and the nested offset are written into the packed buffer, and
    ``cuLaunchKernel`` is called directly with it. This is the serving path of
    :mod:`tuner.runtime`, where host time per call matters; the buffer is guarded by a lock, so
    threads may share one instance.

    The caller has checked the tensors (the runtime does, per call); the constants (element
    count, block sizes, tile count, grid) are fixed here, with the register budget checked.
    """

    _N_ARGS = 13   # A, absmax u8, code, absmax2, absmax f32, offset, out, n, bs, log2 bs, g, log2 g, ntiles

    def __init__(self, kernel: "DequantKernel", n: int, blocksize: int, groupsize: int = 256):
        import threading

        from cuda.bindings import driver

        c = kernel.config
        if not 1 <= n <= MAX_ELEMENTS:
            raise LaunchError(f"element count {n} is outside this kernel's range 1..{MAX_ELEMENTS}")
        regs = kernel.compiled.registers
        if regs is not None and regs * c.threads > 65536:
            raise LaunchError(f"{c.short()}: {regs} registers x {c.threads} threads exceeds the 65536 "
                              "registers of an SM; the block cannot launch")
        self.kernel = kernel
        nsteps = -(-((n + 1) // 2) // c.bytes_per_thread)
        ntiles = -(-nsteps // (c.threads * c.unroll))
        self.grid = ntiles if c.grid == "oneshot" else min(ntiles, _sm_count() * c.ctas_per_sm)
        self.threads = c.threads
        self._vals = np.zeros(self._N_ARGS, dtype=np.uint64)      # one 8-byte slot per parameter
        u32 = self._vals.view(np.uint32)                            # little endian: low half at 2*i
        for slot, v in zip(range(7, 13), (n, blocksize, blocksize.bit_length() - 1, groupsize,
                                          groupsize.bit_length() - 1, ntiles)):
            u32[2 * slot] = v
        self._f32 = self._vals.view(np.float32)
        self._ptrs = np.array([self._vals.ctypes.data + 8 * i for i in range(self._N_ARGS)], dtype=np.uint64)
        self._params = int(self._ptrs.ctypes.data)
        self._function = kernel.function.handle      # a CUkernel: cuLaunchKernel takes it as it takes a CUfunction
        self._launch = driver.cuLaunchKernel
        self._ok = driver.CUresult.CUDA_SUCCESS
        self._lock = threading.Lock()

    def __call__(self, a: int, absmax_u8: int, code: int, absmax2: int, absmax_f32: int, offset: float, out: int,
                 stream: int) -> None:
        v = self._vals
        with self._lock:
            v[0] = a
            v[1] = absmax_u8
            v[2] = code
            v[3] = absmax2
            v[4] = absmax_f32
            self._f32[10] = offset
            v[6] = out
            err = self._launch(self._function, self.grid, 1, 1, self.threads, 1, 1, 0, _cu_stream(stream),
                               self._params, 0)[0]
        if err != self._ok:
            raise LaunchError(f"launch of {self.kernel.config.short()} failed: {err!r}")


class DequantKernel:
    """A loaded variant of the template."""

    def __init__(self, config: KernelConfig, arch: Optional[str] = None, source: Optional[str] = None):
        """``source`` overrides the rendered template (tests use it to plant a wrong kernel)."""
        from cuda.core import Device, ObjectCode

        from .compiler import compile_source
        from .gpu import require_gpu

        Device().set_current()
        self.config = config
        if source is None:
            self.compiled = compile_config(config, arch)
        else:
            self.compiled = compile_source(source, arch or require_gpu().arch)
        # configs that differ only in launch parameters share one source, hence one loaded module
        key = hashlib.sha256(self.compiled.cubin).hexdigest()
        loaded = _MODULES.get(key)
        if loaded is None:
            module = ObjectCode.from_cubin(self.compiled.cubin)
            loaded = _MODULES[key] = (module, module.get_kernel(KERNEL_NAME))
        self.module, self.function = loaded

    # -- checks ------------------------------------------------------------------------
    def _check(self, A, qs, out):
        torch = _torch()
        c = self.config
        if not isinstance(A, torch.Tensor) or not isinstance(out, torch.Tensor):
            raise LaunchError("A and out must be torch tensors")
        for name, t in (("A", A), ("out", out)):
            if t.device.type != "cuda":
                raise LaunchError(f"{name} must be on a CUDA device, got {t.device}")
            if not t.is_contiguous():
                raise LaunchError(f"{name} must be contiguous")
        if qs.quant_type != c.quant:
            raise LaunchError(f"quant_state.quant_type is {qs.quant_type!r}, this variant decodes {c.quant!r}")
        want = getattr(torch, _TORCH_DTYPES[c.dtype])
        if out.dtype != want:
            raise LaunchError(f"out has dtype {out.dtype}, this variant writes {want}")
        bs = int(qs.blocksize)
        if bs not in _BLOCKSIZES:
            raise LaunchError(f"invalid blocksize {bs}")
        n = math.prod(qs.shape)
        if out.numel() != n:
            raise LaunchError(f"out has {out.numel()} elements, quant_state.shape {tuple(qs.shape)} has {n}")
        if n < 1 or n > MAX_ELEMENTS:
            raise LaunchError(f"element count {n} is outside this kernel's range 1..{MAX_ELEMENTS}")
        nbytes = (n + 1) // 2
        if A.numel() * A.element_size() < nbytes:
            raise LaunchError(f"A holds {A.numel() * A.element_size()} bytes, {nbytes} needed for {n} values")
        load_align = c.bytes_per_thread
        store_align = min(16, 2 * c.bytes_per_thread * _OUT_BYTES[c.dtype])
        if A.data_ptr() % load_align:
            raise LaunchError(f"A's address is not {load_align}-byte aligned (this variant loads "
                              f"{c.bytes_per_thread} bytes at a time)")
        if out.data_ptr() % store_align:
            raise LaunchError(f"out's address is not {store_align}-byte aligned (this variant stores "
                              f"{store_align} bytes at a time)")
        nblocks = -(-n // bs)
        tensors = [A, out]
        if qs.state2 is not None:
            s2 = qs.state2
            g = int(s2.blocksize)
            if g <= 0 or g & (g - 1):
                raise LaunchError(f"state2.blocksize {g} is not a power of two")
            if qs.absmax.dtype != torch.uint8 or qs.absmax.numel() < nblocks:
                raise LaunchError(f"nested absmax must be uint8 with >= {nblocks} entries")
            if s2.absmax.dtype != torch.float32 or s2.absmax.numel() < -(-nblocks // g):
                raise LaunchError(f"state2.absmax must be float32 with >= {-(-nblocks // g)} entries")
            if s2.code.dtype != torch.float32 or s2.code.numel() != 256:
                raise LaunchError("state2.code must be 256 float32 values")
            tensors += [qs.absmax, s2.absmax, s2.code]
        else:
            if qs.absmax.dtype != torch.float32 or qs.absmax.numel() < nblocks:
                raise LaunchError(f"absmax must be float32 with >= {nblocks} entries")
            tensors.append(qs.absmax)
        devices = {t.device for t in tensors}
        if len(devices) != 1:
            raise LaunchError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
        for t in tensors[2:]:
            if not t.is_contiguous():
                raise LaunchError("quant_state tensors must be contiguous")
        return n, bs

    def bind(self, A, qs, out, offset: Optional[float] = None) -> BoundLaunch:
        """Check the inputs and pack the arguments. ``offset`` (the nested mean) may be given to
        avoid reading the 0-d device tensor back (a synchronisation)."""
        n, bs = self._check(A, qs, out)
        c = self.config
        regs = self.compiled.registers
        if regs is not None and regs * c.threads > 65536:
            raise LaunchError(f"{c.short()}: {regs} registers x {c.threads} threads exceeds the 65536 "
                              "registers of an SM; the block cannot launch")
        p = np.uint64  # a device pointer, passed as a 64-bit kernel argument
        if qs.state2 is not None:
            s2 = qs.state2
            g = int(s2.blocksize)
            off = float(qs.offset) if offset is None else float(offset)
            stats = (p(qs.absmax.data_ptr()), p(s2.code.data_ptr()), p(s2.absmax.data_ptr()), p(0), np.float32(off))
        else:
            g = 256
            stats = (p(0), p(0), p(0), p(qs.absmax.data_ptr()), np.float32(0.0))
        nsteps = -(-((n + 1) // 2) // c.bytes_per_thread)
        ntiles = -(-nsteps // (c.threads * c.unroll))
        grid = ntiles if c.grid == "oneshot" else min(ntiles, _sm_count() * c.ctas_per_sm)
        args = (p(A.data_ptr()),) + stats + (
            p(out.data_ptr()), np.uint32(n), np.uint32(bs), np.uint32(bs.bit_length() - 1),
            np.uint32(g), np.uint32(g.bit_length() - 1), np.uint32(ntiles))
        return BoundLaunch(self, grid, args)

    def __call__(self, A, qs, out, offset: Optional[float] = None):
        self.bind(A, qs, out, offset)()
        return out


_KERNELS: dict = {}


def load_kernel(config: KernelConfig, arch: Optional[str] = None) -> DequantKernel:
    """The loaded kernel for ``config`` (compiled through the disk cache, cached per process)."""
    key = (config, arch)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = DequantKernel(config, arch)
    return k


def run_config(config: KernelConfig, A, quant_state, out):
    """Dequantize bnb's packed ``A`` with ``quant_state`` into ``out`` with the variant ``config``."""
    return load_kernel(config)(A, quant_state, out)
