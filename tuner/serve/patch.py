"""The bitsandbytes patch: bnb's own entry points routed through nf4-tune's runtimes.

:func:`patch_bitsandbytes` swaps, for CUDA tensors:

- eager calls, above bnb's Python: ``bitsandbytes.matmul_4bit`` and ``Linear4bit.forward`` without
  autograd go straight to :func:`nf4tune.serve.matmul.fused_or_none` (a lookup of the weight's prepared
  launch), skipping bnb's checks, its torch.library dispatch and its per-call ``Params4bit`` accesses;
  where bnb serves (decided once per weight and batch) they call bnb's own function, and the decision
  is not asked again underneath. With autograd they are bnb's, its ``gemm_4bit`` op underneath
  included (the weight still dequantized by the bit-exact runtime); under ``torch.compile`` (tracing)
  they are bnb's and the op-level paths below serve;

- ``bitsandbytes.functional.dequantize_4bit`` (which ``Linear4bit`` and ``matmul_4bit`` call when
  autograd is on) for :func:`nf4tune.serve.runtime.dequantize_4bit`;
- the CUDA backend's ``_dequant_linear_fallback`` (the dequantize-then-matmul path of
  ``gemm_4bit``) likewise;
- bnb's grad-free ``gemm_4bit`` (``matmul_4bit`` / ``Linear4bit`` in inference, M = 1..64):
  both of its paths (the fused kernel and the dequantize-then-matmul fallback) first ask
  :func:`nf4tune.serve.matmul.served_gemm`, which runs the tuned matmul kernel wherever one was
  measured faster than bnb at that batch bucket; elsewhere bnb's own path runs (``matmul_bnb``).

Calls with CPU tensors keep bnb's own path (counted as ``cpu_handoffs`` in ``stats()``); CUDA
inputs the fused kernel cannot take run bnb's own kernel with a one-time ``RuntimeWarning``
(``bnb_handoffs``). As a context manager, or as a call whose result's ``undo()`` restores bnb (and
``reapply()`` patches again with the same caches).
"""

from __future__ import annotations

import warnings
import weakref

from ..vocabulary import UnsupportedInput
from . import runtime
from .matmul import declined as _declined

__all__ = ["patch_bitsandbytes", "BnbPatch"]


class BnbPatch:
    """Swaps bnb's entry points for the runtimes', and back."""

    def __init__(self):
        import bitsandbytes.functional as F

        self._undo = []
        self._swaps = []
        self._warned = False
        self._states = {}
        original = F.dequantize_4bit

        def patched_dequantize_4bit(A, quant_state=None, absmax=None, out=None, blocksize=None, quant_type="fp4"):
            if not getattr(A, "is_cuda", False):
                runtime.count("cpu_handoffs")
                return original(A, quant_state, absmax, out, blocksize, quant_type)
            try:
                return runtime.dequantize_4bit(A, quant_state, absmax, out, blocksize, quant_type)
            except UnsupportedInput as e:
                return self.hand_to_bnb(e, original, A, quant_state, absmax, out, blocksize, quant_type)

        patched_dequantize_4bit.__wrapped__ = original
        patched_dequantize_4bit.__doc__ = "nf4-tune runtime in place of bnb's dequantize_4bit (CUDA tensors)."
        self.swap(F, "dequantize_4bit", patched_dequantize_4bit)

        try:
            import bitsandbytes.backends.cuda.ops as cuda_ops
        except Exception:  # bnb without its CUDA backend (a CPU build of torch)
            cuda_ops = None
        fallback = getattr(cuda_ops, "_dequant_linear_fallback", None)
        if fallback is not None:
            self._patch_dequant_linear(cuda_ops, fallback)
        kernel_impl = getattr(cuda_ops, "_gemm_4bit_kernel_impl", None)
        if kernel_impl is not None:
            self._patch_gemm_kernel(cuda_ops, kernel_impl)
        self._patch_eager()

    def _patch_eager(self):
        """bnb.matmul_4bit and Linear4bit.forward: the fused kernel's prepared launch first, for CUDA calls
        without autograd outside torch.compile's tracing."""
        import torch
        import bitsandbytes as bnb

        from .matmul import fused_or_none, run_bnb as declined

        grad_enabled = torch.is_grad_enabled
        compiling = torch.compiler.is_compiling
        original_matmul = bnb.matmul_4bit

        def patched_matmul_4bit(A, B, quant_state, out=None, bias=None):
            if quant_state is not None and not getattr(_declined, "on", False) and A.is_cuda and not compiling():
                if grad_enabled() and (A.requires_grad or (bias is not None and bias.requires_grad)):
                    # autograd: bnb's own forward, and its gemm_4bit op underneath not asked either (the
                    # weight is still dequantized by the bit-exact runtime where bnb dequantizes)
                    return declined(original_matmul, A, B, quant_state, out, bias)
                shape = quant_state.shape
                if shape is not None and len(shape) == 2:
                    y = fused_or_none(A, B, quant_state, out, bias)
                    if y is not None:
                        return y
                    return declined(original_matmul, A, B, quant_state, out, bias)
            return original_matmul(A, B, quant_state, out, bias)

        patched_matmul_4bit.__wrapped__ = original_matmul
        patched_matmul_4bit.__doc__ = "nf4-tune's fused matmul in place of bnb's matmul_4bit (CUDA, no autograd)."
        self.swap(bnb, "matmul_4bit", patched_matmul_4bit)

        Linear4bit = bnb.nn.Linear4bit
        original_forward = Linear4bit.forward

        def patched_forward(module, x):
            params = module._parameters
            w = params.get("weight")
            qs = getattr(w, "quant_state", None)
            if qs is not None and module.compute_type_is_set and x.is_cuda and not compiling():
                cd = module.compute_dtype
                bias = params.get("bias")
                # autograd: bnb's, as in patched_matmul_4bit (the weight, a Params4bit, is frozen by bnb; reading
                # its requires_grad goes through its __torch_function__, about 4 us a call)
                if grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
                    return declined(original_forward, module, x)
                if (cd is None or cd == x.dtype) and (bias is None or bias.dtype == x.dtype):
                    y = fused_or_none(x, w, qs, None, bias)
                    if y is not None:
                        return y
                    return declined(original_forward, module, x)
            return original_forward(module, x)

        patched_forward.__wrapped__ = original_forward
        patched_forward.__doc__ = original_forward.__doc__
        self.swap(Linear4bit, "forward", patched_forward)

    def _served_gemm(self, A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code,
                     absmax_offset):
        from bitsandbytes.functional import QuantState

        from .matmul import served_gemm

        return served_gemm(A, B, shapeB, blocksize, quant_type, bias,
                           lambda: self.quant_state(QuantState, A.dtype, shapeB, absmax, blocksize, quant_type,
                                                    absmax_8bit, absmax_code, absmax_offset))

    def _patch_gemm_kernel(self, cuda_ops, kernel_impl):
        def patched_gemm_kernel(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None,
                                absmax_code=None, absmax_offset=None):
            if getattr(_declined, "on", False):
                return kernel_impl(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code,
                                   absmax_offset)
            y = self._served_gemm(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code,
                                  absmax_offset)
            if y is not None:
                return y
            return kernel_impl(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code,
                               absmax_offset)

        self.swap(cuda_ops, "_gemm_4bit_kernel_impl", patched_gemm_kernel)

    def _patch_dequant_linear(self, cuda_ops, fallback):
        from bitsandbytes.functional import QuantState

        def patched_dequant_linear(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None,
                                   absmax_code=None, absmax_offset=None):
            import torch

            if not A.is_cuda:
                runtime.count("cpu_handoffs")
                return fallback(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code,
                                absmax_offset)
            if not getattr(_declined, "on", False):
                y = self._served_gemm(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit, absmax_code,
                                      absmax_offset)
                if y is not None:
                    return y
            qs = self.quant_state(QuantState, A.dtype, shapeB, absmax, blocksize, quant_type, absmax_8bit,
                                  absmax_code, absmax_offset)
            try:
                B_dq = runtime.dequantize_4bit(B, qs)
            except UnsupportedInput as e:
                return self.hand_to_bnb(e, fallback, A, B, shapeB, absmax, blocksize, quant_type, bias,
                                        absmax_8bit, absmax_code, absmax_offset)
            if B_dq.shape != torch.Size(shapeB):   # B given in the [1, n] form
                B_dq = B_dq.t()
            return torch.nn.functional.linear(A, B_dq, bias)

        self.swap(cuda_ops, "_dequant_linear_fallback", patched_dequant_linear)

    def quant_state(self, QuantState, dtype, shapeB, absmax, blocksize, quant_type, absmax_8bit, absmax_code,
                    absmax_offset):
        """One QuantState per weight, kept while its tensors live: the runtimes then check it (and
        read the nested offset back) once, not on every forward."""
        import torch

        key = (id(absmax_8bit), id(absmax), id(absmax_code), id(absmax_offset), tuple(shapeB), blocksize, quant_type,
               dtype)
        hit = self._states.get(key)
        if hit is not None and all(r() is t for r, t in zip(hit[0], (absmax_8bit, absmax))):
            return hit[1]
        if absmax_8bit is not None:
            state2 = QuantState(absmax=absmax, code=absmax_code, blocksize=256, dtype=torch.float32)
            qs = QuantState(absmax=absmax_8bit, shape=torch.Size(shapeB), dtype=dtype, blocksize=blocksize,
                            quant_type=quant_type, offset=absmax_offset, state2=state2)
        else:
            qs = QuantState(absmax=absmax, shape=torch.Size(shapeB), dtype=dtype, blocksize=blocksize,
                            quant_type=quant_type)
        refs = tuple(weakref.ref(t) if t is not None else (lambda: None) for t in (absmax_8bit, absmax))
        self._states[key] = (refs, qs)
        return qs

    def swap(self, module, name, new):
        old = getattr(module, name)
        setattr(module, name, new)
        self._undo.append((module, name, old))
        self._swaps.append((module, name, new))

    def reapply(self) -> None:
        """After :meth:`undo`, swap bnb's functions for the runtimes' again: the same patch, its per-weight
        caches kept (cheaper than a new :func:`patch_bitsandbytes`). Nothing happens while it is active."""
        if self._undo:
            return
        for module, name, new in self._swaps:
            self._undo.append((module, name, getattr(module, name)))
            setattr(module, name, new)

    def hand_to_bnb(self, err, fn, *args):
        runtime.count("bnb_handoffs")
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


def patch_bitsandbytes() -> BnbPatch:
    """Route bnb's ``dequantize_4bit`` (and with it ``Linear4bit`` and ``matmul_4bit`` wherever they
    dequantize) through nf4-tune for CUDA tensors; other devices keep bnb's own path.
    Use as ``with patch_bitsandbytes(): ...`` or ``p = patch_bitsandbytes(); ...; p.undo()``."""
    return BnbPatch()
