"""nf4-tune: fused NF4/FP4 dequantization kernels, tuned per GPU and bit-identical to bitsandbytes."""

from .space import DTYPES, PRESETS, QUANTS, InvalidConfig, KernelConfig, iter_space, preset, space_size
from .compiler import CompileError, CompiledKernel, compile_config, compile_many
from .gpu import NoGPUError, require_gpu

__version__ = "0.1.0"

__all__ = [
    "__version__", "DTYPES", "QUANTS", "PRESETS", "InvalidConfig", "KernelConfig", "iter_space",
    "preset", "space_size", "CompileError", "CompiledKernel", "compile_config", "compile_many",
    "NoGPUError", "require_gpu",
]
