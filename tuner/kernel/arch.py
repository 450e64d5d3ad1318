"""Target archs and their limits: from the installed NVRTC and the device, not a fixed list.

:func:`supported_archs` asks NVRTC which real archs it can compile for (NVRTC 13: sm_75 to
sm_121). A launch plan needs per-device limits (registers and resident threads per SM, threads
and shared memory per block): :func:`device_limits` reads them from the visible device's
properties; for a named arch on a machine without that GPU (``nf4-tune compile --arch``),
:func:`arch_limits` takes them from :data:`ARCH_TABLE`, the CUDA programming guide's table
of compute capabilities.
"""

from __future__ import annotations

from functools import lru_cache

from ..family import DeviceLimits

__all__ = ["ARCH_TABLE", "supported_archs", "check_arch", "arch_limits", "device_limits"]

#: arch -> (registers per SM, resident threads per SM, shared memory per block with opt-in) from
#: the CUDA C++ Programming Guide, "Technical Specifications per Compute Capability". sm_88,
#: sm_107 and sm_110 are not listed there yet: they take their family's numbers (sm_86, sm_100).
ARCH_TABLE = {
    "sm_75": (65536, 1024, 64 * 1024),
    "sm_80": (65536, 2048, 163 * 1024),
    "sm_86": (65536, 1536, 99 * 1024),
    "sm_87": (65536, 2048, 163 * 1024),
    "sm_88": (65536, 1536, 99 * 1024),
    "sm_89": (65536, 1536, 99 * 1024),
    "sm_90": (65536, 2048, 227 * 1024),
    "sm_100": (65536, 2048, 227 * 1024),
    "sm_103": (65536, 2048, 227 * 1024),
    "sm_107": (65536, 2048, 227 * 1024),
    "sm_110": (65536, 2048, 227 * 1024),
    "sm_120": (65536, 1536, 99 * 1024),
    "sm_121": (65536, 1536, 99 * 1024),
}


@lru_cache(maxsize=1)
def supported_archs() -> tuple:
    """The real archs the installed NVRTC compiles for, e.g. ``('sm_75', ..., 'sm_121')``."""
    from cuda.bindings import nvrtc

    err, archs = nvrtc.nvrtcGetSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:   # pragma: no cover - NVRTC always answers
        raise RuntimeError(f"nvrtcGetSupportedArchs failed: {err}")
    return tuple(f"sm_{a}" for a in archs)


def check_arch(arch: str) -> str:
    """``arch`` if NVRTC can compile for it, else ValueError listing what it can."""
    if arch not in supported_archs():
        raise ValueError(f"unsupported arch {arch!r}: the installed NVRTC compiles for "
                         f"{', '.join(supported_archs())}")
    return arch


def arch_limits(arch: str, sm_count: int = 1) -> DeviceLimits:
    """Limits of ``arch`` from :data:`ARCH_TABLE` (for planning without the device)."""
    check_arch(arch)
    regs, threads, smem = ARCH_TABLE.get(arch, (65536, 1024, 48 * 1024))
    return DeviceLimits(sm_count=sm_count, regs_per_sm=regs, max_threads_per_sm=threads, max_threads_per_block=1024,
                        smem_per_block=48 * 1024, smem_per_block_optin=smem)


@lru_cache(maxsize=8)
def device_limits(device_index: int = 0) -> DeviceLimits:
    """Limits read from the device's properties."""
    from cuda.core import Device

    p = Device(device_index).properties
    return DeviceLimits(sm_count=p.multiprocessor_count, regs_per_sm=p.max_registers_per_multiprocessor,
                        max_threads_per_sm=p.max_threads_per_multiprocessor,
                        max_threads_per_block=p.max_threads_per_block,
                        smem_per_block=p.max_shared_memory_per_block,
                        smem_per_block_optin=p.max_shared_memory_per_block_optin)
