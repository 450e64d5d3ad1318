"""Finding the visible GPU (through cuda.core) and saying plainly when there is none."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["NoGPUError", "GPUInfo", "require_gpu", "gpu_available", "visible_gpu_count"]


class NoGPUError(RuntimeError):
    """No usable CUDA GPU (no driver, no device, or the driver refused to start)."""


@dataclass(frozen=True)
class GPUInfo:
    name: str
    arch: str            # e.g. "sm_90"
    compute_capability: tuple
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    driver_version: str

    @property
    def compute_capability_text(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@lru_cache(maxsize=1)
def require_gpu() -> GPUInfo:
    """The visible GPU (device 0), or NoGPUError with the reason."""
    try:
        from cuda.core import Device
        from cuda.bindings import driver

        dev = Device(0)
        dev.set_current()
        cc = dev.compute_capability
        props = dev.properties
        err, total = driver.cuDeviceTotalMem(dev.device_id)
        err2, drv = driver.cuDriverGetVersion()
    except Exception as e:  # no libcuda, no device, driver error
        raise NoGPUError(f"no CUDA GPU is visible ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e})."
                         " nf4-tune measures kernels on a GPU; run this on a machine with an NVIDIA GPU"
                         " and driver.") from None
    return GPUInfo(name=dev.name, arch=f"sm_{cc.major}{cc.minor}", compute_capability=(cc.major, cc.minor),
                   sm_count=props.multiprocessor_count, l2_bytes=props.l2_cache_size,
                   memory_bytes=int(total), driver_version=f"{drv // 1000}.{(drv % 1000) // 10}")


def gpu_available() -> bool:
    try:
        require_gpu()
        return True
    except NoGPUError:
        return False


def visible_gpu_count() -> int:
    """How many CUDA GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 0 without a driver
    or device. Asks the driver without making a context on any of them."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
        return int(count) if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:       # no cuda-python bindings or no libcuda
        return 0
