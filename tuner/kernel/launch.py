"""Loading compiled variants and launching them on torch-owned device memory (cuda.core).

Together with :mod:`nf4tune.kernel.compiler` and :mod:`nf4tune.kernel.arch` this is where every
direct CUDA call lives. A variant runs on the current torch stream; loaded modules are cached
per process. Every launch goes through its family's launch plan (input checks, geometry,
kernel parameters), whether it is a bench launch (:func:`bind`) or the serving path
(:class:`PackedLaunch`): a kernel never touches memory out of bounds because of a bad pointer
or count, and what it cannot take is one exception, :class:`~nf4tune.vocabulary.UnsupportedInput`.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from ..vocabulary import UnsupportedInput
from .arch import device_limits
from .compiler import compile_config, compile_source

__all__ = ["LaunchError", "LoadedKernel", "BoundLaunch", "PackedLaunch", "load_kernel", "bind", "raw_stream"]

#: kept for readers of older code: what a kernel cannot take
LaunchError = UnsupportedInput

_MODULES: dict = {}   # sha256 of a CUBIN -> (ObjectCode, Kernel), per process


def _torch():
    import torch

    return torch


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


def raw_stream(device_index: int) -> int:
    """The raw handle of torch's current stream on ``device_index`` (bnb reads it the same way)."""
    return _torch()._C._cuda_getCurrentRawStream(device_index)


@lru_cache(maxsize=64)
def _cu_stream(handle: int):
    from cuda.bindings import driver

    return driver.CUstream(handle)


class LoadedKernel:
    """A compiled variant, loaded into the current context."""

    def __init__(self, config, arch: Optional[str] = None, source: Optional[str] = None):
        """``source`` overrides the rendered template (tests use it to plant a wrong kernel)."""
        from cuda.core import Device, ObjectCode

        from .gpu import require_gpu

        Device().set_current()
        self.config = config
        self.family = config.family
        if source is None:
            self.compiled = compile_config(config, arch)
        else:
            self.compiled = compile_source(source, arch or require_gpu().arch, self.family.kernel_name)
        # configs that differ only in launch parameters share one source, hence one loaded module
        key = hashlib.sha256(self.compiled.cubin).hexdigest()
        loaded = _MODULES.get(key)
        if loaded is None:
            module = ObjectCode.from_cubin(self.compiled.cubin)
            loaded = _MODULES[key] = (module, module.get_kernel(self.family.kernel_name))
        self.module, self.function = loaded

    def plan(self, inputs, device_index: int = 0):
        """This variant's launch plan for ``inputs`` on the device (checks and geometry)."""
        return self.family.plan_for(self.config, inputs, device_limits(device_index), self.compiled.registers)

    def __call__(self, inputs, out):
        """Check, then launch on ``inputs`` into ``out`` on the current stream."""
        bind(self, inputs, out)()
        return out


#: dynamic shared memory a kernel may take without opting in
_DEFAULT_DYNAMIC_SMEM = 48 * 1024
_SMEM_OPTED: dict = {}   # (kernel handle, device ordinal) -> bytes allowed


def allow_dynamic_smem(kernel: "LoadedKernel", nbytes: int, device_index: int) -> None:
    """Let ``kernel`` take ``nbytes`` of dynamic shared memory on the device: a kernel whose
    static and dynamic shared memory together pass 48 KiB has to opt in
    (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). Once per kernel, device and size; a
    refusal is :class:`UnsupportedInput`."""
    if nbytes <= 0:
        return
    handle = kernel.function.handle
    key = (int(handle), device_index)
    if _SMEM_OPTED.get(key, 0) >= nbytes:
        return
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
    err, static = driver.cuKernelGetAttribute(attr, handle, device_index)
    if err == driver.CUresult.CUDA_SUCCESS and nbytes + static <= _DEFAULT_DYNAMIC_SMEM:
        _SMEM_OPTED[key] = nbytes
        return

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    err = driver.cuKernelSetAttribute(attr, nbytes, handle, device_index)[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise UnsupportedInput(f"{kernel.config.short()}: {nbytes} bytes of dynamic shared memory refused "
                               f"by the driver ({err!r})")
    _SMEM_OPTED[key] = nbytes


@dataclass
class BoundLaunch:
    """A launch with its arguments checked and laid out; calling it launches on the current stream."""

    kernel: LoadedKernel
    plan: object
    args: tuple

    def __call__(self):
        from cuda.core import LaunchConfig, launch

        torch = _torch()
        stream = _core_stream(torch.cuda.current_stream().cuda_stream)
        p = self.plan
        try:
            launch(stream, LaunchConfig(grid=p.grid, block=p.block, shmem_size=p.smem), self.kernel.function,
                   *self.args)
        except Exception as e:
            raise UnsupportedInput(f"launch of {self.kernel.config.short()} failed: {e}") from None


def bind(kernel: LoadedKernel, inputs, out, plan=None) -> BoundLaunch:
    """Check ``inputs`` and ``out`` through the family's launch plan and lay out the arguments."""
    plan = plan or kernel.plan(inputs, inputs_device_index(inputs))
    allow_dynamic_smem(kernel, plan.smem, inputs_device_index(inputs))
    return BoundLaunch(kernel, plan, kernel.family.launch_args(plan, inputs, out))


def inputs_device_index(inputs) -> int:
    t = getattr(inputs, "A", None)
    return t.get_device() if t is not None and getattr(t, "is_cuda", False) else 0


class PackedLaunch:
    """One launch plan of a loaded variant with its kernel parameters packed once: per call only
    the plan's dynamic parameters (pointers, the nested offset) are written into the packed
    buffer, and ``cuLaunchKernel`` is called directly with it. The serving path of
    :mod:`nf4tune.serve.runtime`, where host time per call matters; the buffer is guarded by a
    lock, so threads may share one instance. The caller has checked the call's tensors through
    the plan (the runtime does, per call)."""

    def __init__(self, kernel: LoadedKernel, plan, via: Optional[str] = None):
        from cuda.bindings import driver

        kinds = plan.PARAM_KINDS
        allow_dynamic_smem(kernel, plan.smem, _torch().cuda.current_device())
        self.kernel = kernel
        self.plan = plan
        self._vals = np.zeros(len(kinds), dtype=np.uint64)          # one 8-byte slot per parameter
        u32 = self._vals.view(np.uint32)                              # little endian: low half at 2*i
        f32 = self._vals.view(np.float32)
        for slot, v in plan.constants().items():
            if kinds[slot] == "f32":
                f32[2 * slot] = v
            elif kinds[slot] == "u32":
                u32[2 * slot] = v
            else:
                self._vals[slot] = v
        self._dynamic = tuple((slot, kinds[slot] == "f32") for slot in plan.DYNAMIC)
        self._ptrs = np.array([self._vals.ctypes.data + 8 * i for i in range(len(kinds))], dtype=np.uint64)
        self._params = int(self._ptrs.ctypes.data)
        # the dynamic parameters are written by one struct.pack_into over the slots they span (a float slot
        # takes its low 4 bytes: little endian); slots between them that are not dynamic keep their value
        self._buffer = memoryview(self._vals).cast("B")
        first, last = min(plan.DYNAMIC), max(plan.DYNAMIC)
        if tuple(plan.DYNAMIC) != tuple(range(first, last + 1)):
            raise ValueError(f"{type(plan).__name__}.DYNAMIC must be consecutive slots, not {plan.DYNAMIC}")
        self._format = "<" + "".join("f4x" if is_float else "Q" for _, is_float in self._dynamic)
        self._offset = 8 * first
        self._pack = struct.pack_into
        grid = tuple(plan.grid) + (1, 1) if isinstance(plan.grid, tuple) else (plan.grid, 1, 1)
        block = tuple(plan.block) + (1, 1) if isinstance(plan.block, tuple) else (plan.block, 1, 1)
        self._geometry = (*grid[:3], *block[:3], plan.smem)
        self._lock = threading.Lock()
        self._acquire, self._release = self._lock.acquire, self._lock.release
        # the driver's cuLaunchKernel through cuda.bindings (its argument conversion costs a few us a call), or
        # through ctypes (``via="ctypes"`` or NF4TUNE_LAUNCH=ctypes: the same function and context, fewer
        # conversions; where libcuda does not load, cuda.bindings). A CUkernel (cuda.core's handle) is taken by
        # cuLaunchKernel as a CUfunction.
        via = via or os.environ.get("NF4TUNE_LAUNCH") or "bindings"
        if via not in ("ctypes", "bindings"):
            raise ValueError(f"launch via {via!r}: ctypes or bindings")
        #: a variant built for programmatic dependent launch (the matmul family's ``pdl`` knob) is launched by
        #: cuLaunchKernelEx with programmatic stream serialization: it may start while the kernel before it in the
        #: stream finishes, and waits for it (griddepcontrol.wait) before it reads its activations
        self.pdl = bool(getattr(getattr(plan, "config", None), "pdl", 0))
        self._c_launch = _libcuda_launch() if via == "ctypes" and not self.pdl else None
        if self._c_launch is not None:
            self._function = int(kernel.function.handle)
            self._call = self._call_ctypes
            return
        self._function = kernel.function.handle
        self._ok = driver.CUresult.CUDA_SUCCESS
        if not self.pdl:
            self._launch = driver.cuLaunchKernel
            self._call = self._call_bindings
            return
        config = driver.CUlaunchConfig()
        (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY, config.blockDimZ,
         config.sharedMemBytes) = self._geometry
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attr]
        config.numAttrs = 1
        self._config = config
        self._launch = driver.cuLaunchKernelEx
        self._call = self._call_pdl

    def _call_ctypes(self, stream: int) -> int:
        return self._c_launch(self._function, *self._geometry, stream, self._params, None)

    def _call_bindings(self, stream: int) -> int:
        err = self._launch(self._function, *self._geometry, _cu_stream(stream), self._params, 0)[0]
        return 0 if err == self._ok else int(err)

    def _call_pdl(self, stream: int) -> int:
        self._config.hStream = _cu_stream(stream)        # under the caller's lock, as the packed buffer
        err = self._launch(self._config, self._function, self._params, 0)[0]
        return 0 if err == self._ok else int(err)

    @property
    def via(self) -> str:
        """How the launch reaches the driver: ``ctypes``, ``cuda.bindings`` or, for a programmatic dependent
        launch, ``cuda.bindings cuLaunchKernelEx``."""
        if self.pdl:
            return "cuda.bindings cuLaunchKernelEx"
        return "ctypes" if self._c_launch is not None else "cuda.bindings"

    def __call__(self, values, stream: int) -> None:
        """Launch with the dynamic parameters ``values`` (in the plan's DYNAMIC order) on ``stream``."""
        self._acquire()                # not ``with``: acquire/release cost a third of it (about 0.2 us a call)
        try:
            self._pack(self._format, self._buffer, self._offset, *values)
            err = self._call(stream)
        finally:
            self._release()
        if err:
            raise UnsupportedInput(f"launch of {self.kernel.config.short()} failed: CUresult {err}")


@lru_cache(maxsize=1)
def _libcuda_launch():
    """``cuLaunchKernel`` of the driver library as a ctypes function, or None where it cannot be loaded."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernel
    except (OSError, AttributeError):
        return None
    u = ctypes.c_uint
    fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_KERNELS: dict = {}


def load_kernel(config, arch: Optional[str] = None) -> LoadedKernel:
    """The loaded kernel for ``config`` (compiled through the disk cache, cached per process)."""
    key = (config, arch)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = LoadedKernel(config, arch)
    return k
