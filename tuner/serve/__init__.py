"""Serving tuned kernels to bitsandbytes users: the drop-in runtime, the config table it
serves from, and the patch that routes bnb's own entry points through it."""

from .matmul import explain_matmul, matmul_4bit
from .patch import BnbPatch, patch_bitsandbytes
from .runtime import dequantize_4bit, explain, stats
from .table import Choice, ConfigTable, choose_config, use_configs

__all__ = ["dequantize_4bit", "matmul_4bit", "explain_matmul", "patch_bitsandbytes", "BnbPatch", "use_configs", "choose_config", "explain", "stats",
           "Choice", "ConfigTable"]
