"""Serving tuned kernels to bitsandbytes users: the drop-in runtime, the config table it
serves from, and the patch that routes bnb's own entry points through it."""

from .patch import BnbPatch, patch_bitsandbytes
from .runtime import dequantize_4bit, explain, stats
from .table import Choice, ConfigTable, choose_config, use_configs

__all__ = ["dequantize_4bit", "patch_bitsandbytes", "BnbPatch", "use_configs", "choose_config", "explain", "stats",
           "Choice", "ConfigTable"]
