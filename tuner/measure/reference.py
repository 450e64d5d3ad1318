"""bitsandbytes' 4-bit format on the CPU, in numpy: a bit-exact reference.

:func:`quantize_4bit` reproduces ``bitsandbytes.functional.quantize_4bit`` on the CPU (the
packed bytes and every statistic), so tests and benchmarks can make data without bnb.
:func:`dequantize_4bit` reproduces bnb's CUDA ``dequantize_4bit``: the recipe in docs/kernels.md ("The recipe both families follow") and the
header of ``kernel_templates/dequant.cu`` (float32 throughout, the nested absmax as two separately rounded
operations, subnormal products flushed to zero as bnb's ``--use_fast_math`` build does,
round-to-nearest-even to the output dtype).

Where bnb's CPU path differs from its CUDA path (and so from this reference):
- fp4 code ``0b1000``: CUDA computes ``lut[0] * -1.0 = -0.0``; the CPU table holds ``+0.0``.
  Outputs at elements whose nibble is 8 have the other sign of zero; the values compare equal.
- subnormal float32 products: CUDA flushes them to zero, the CPU keeps them. They need a
  block absmax below ~1.2e-38, which real weights never have.
- the shape of a 1-D weight's output: ``(n,)`` on CUDA (and here); bnb 0.50's native CPU
  kernel (even n, not blocksize >= 2048 on AVX-512) returns ``(1, n)``, which its legacy-form
  shim transposes to ``(n, 1)`` when ``A`` is ``[1, m]``. The values are the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = [
    "NF4_CODE", "FP4_CODE", "FP4_CODE_CPU", "BLOCKSIZES", "QuantState", "dynamic_map",
    "quantize_4bit", "dequantize_4bit", "dequantize_4bit_numpy", "nibbles", "block_scales",
    "to_output_bits",
]

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)

#: bnb's CUDA NF4 table (index 0..15)
NF4_CODE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)

_FP4_POS = np.array([0.0, 0.005208333333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25],
                    dtype=np.float32)
#: bnb's CUDA FP4 values: bit 3 is the sign, lut[v & 7]; code 0b1000 is -0.0
FP4_CODE = np.concatenate([_FP4_POS, -_FP4_POS]).astype(np.float32)
#: the table bnb's CPU path uses (``get_4bit_type('fp4')``): +0.0 at code 0b1000
FP4_CODE_CPU = np.where(np.arange(16) == 8, np.float32(0.0), FP4_CODE).astype(np.float32)

_CODES = {"nf4": NF4_CODE, "fp4": FP4_CODE}
_CODES_CPU = {"nf4": NF4_CODE, "fp4": FP4_CODE_CPU}
_DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class QuantState:
    """The fields of ``bitsandbytes.functional.QuantState`` that the 4-bit format needs.

    Tensors are torch tensors, as bnb's are, so either kind of state can be passed to either
    library's ``dequantize_4bit``-style functions by attribute access."""

    absmax: Any
    shape: Any
    code: Any
    dtype: Any
    blocksize: int
    quant_type: str
    offset: Any = None
    state2: Optional["QuantState"] = None

    @property
    def nested(self) -> bool:
        return self.state2 is not None


# ---------------------------------------------------------------------------- helpers
def _f32(x) -> np.float32:
    return np.float32(x)


def _torch_linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32. torch's vectorised CPU kernel rounds in
    its own order (a chunk base plus multiples of the step), which is what bnb's code is made
    of, so the reference asks torch itself rather than imitating it."""
    return _torch().linspace(start, end, steps, dtype=_torch().float32).numpy()


def dynamic_map(signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8) -> np.ndarray:
    """bnb's ``create_dynamic_map()`` (the 256-entry code of the nested absmax), in float32."""
    data: list[float] = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = _torch_linspace_f32(0.1, 1, fraction_items)
        means = ((boundaries[:-1] + boundaries[1:]) / _f32(2.0)).astype(np.float32)
        scale = _f32(10 ** (-(max_exponent_bits - 1) + i))
        data += (scale * means).astype(np.float32).tolist()
        if signed:
            data += (-scale * means).astype(np.float32).tolist()
    if additional_items > 0:  # pragma: no cover - not reached by the default map
        boundaries = _torch_linspace_f32(0.1, 1, additional_items + 1)
        means = ((boundaries[:-1] + boundaries[1:]) / _f32(2.0)).astype(np.float32)
        scale = _f32(10 ** (-(max_exponent_bits - 1) + i))
        data += (scale * means).astype(np.float32).tolist()
        if signed:
            data += (-scale * means).astype(np.float32).tolist()
    data.append(0)
    data.append(1.0)
    data += [0] * (256 - len(data))
    data.sort()
    return np.array(data, dtype=np.float32)


def _torch():
    import torch

    return torch


def _np_dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    name = aliases.get(name, name)
    if name not in _DTYPES:
        raise ValueError(f"4-bit dequantization supports bfloat16, float16 and float32, not {dtype}")
    return name


def _as_float32(w) -> tuple[np.ndarray, Any, Any]:
    """(flat float32 numpy array, original shape, torch dtype) of a torch tensor or array."""
    torch = _torch()
    if isinstance(w, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(w))
    else:
        t = w
    if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"Blockwise 4bit quantization only supports 16/32-bit floats, but got {t.dtype}")
    if t.device.type != "cpu":
        t = t.cpu()
    flat = t.detach().reshape(-1).to(torch.float32).numpy()
    return flat, t.shape, t.dtype


# ---------------------------------------------------------------------------- quantize
def _quantize_blockwise_8bit(x: np.ndarray, code: np.ndarray, blocksize: int):
    """bnb's CPU ``quantize_blockwise`` (dynamic 8-bit code): a 65536-bin nearest-code table."""
    n = x.size
    nb = -(-n // blocksize)
    padded = np.zeros(nb * blocksize, np.float32)
    padded[:n] = x
    blocks = padded.reshape(nb, blocksize)
    absmax = np.abs(blocks).max(axis=1).astype(np.float32)
    mids = (_f32(0.5) * (code[:-1] + code[1:])).astype(np.float32)
    bins = np.arange(65536, dtype=np.float32)
    vals = (_f32(-1.0) + (_f32(2.0) * bins) / _f32(65535)).astype(np.float32)
    table = np.searchsorted(mids, vals, side="left").astype(np.uint8)  # count of mids < val
    safe = np.where(absmax == 0, _f32(1.0), absmax)
    inv = (_f32(1.0) / safe).astype(np.float32)
    norm = np.clip((blocks * inv[:, None]).astype(np.float32), -1.0, 1.0).astype(np.float32)
    idx = ((norm + _f32(1.0)) * _f32(0.5) * _f32(65535) + _f32(0.5)).astype(np.float32).astype(np.uint16)
    q = table[idx]
    q[absmax == 0] = 0
    return q.reshape(-1)[:n], absmax


def quantize_4bit(w, blocksize: int = 64, quant_type: str = "nf4", compress_statistics: bool = True):
    """Pack ``w`` (a torch tensor or numpy array of bf16/fp16/fp32) like bnb's CPU
    ``quantize_4bit``. Returns ``(packed, QuantState)``: ``packed`` is a uint8 torch tensor of
    shape ``[(n + 1) // 2, 1]``."""
    torch = _torch()
    if blocksize not in BLOCKSIZES:
        raise ValueError(f"invalid blocksize {blocksize}")
    if quant_type not in _CODES:
        raise ValueError(f"quant_type must be 'nf4' or 'fp4', got {quant_type!r}")
    x, shape, dtype = _as_float32(w)
    n = x.size
    if n == 0:
        raise ValueError("cannot quantize an empty tensor")
    code_cpu = _CODES_CPU[quant_type]
    order = np.argsort(code_cpu, kind="stable")
    bounds = ((code_cpu[order[:-1]] + code_cpu[order[1:]]) / _f32(2)).astype(np.float32)

    rem = n % blocksize
    full = n - rem
    nblocks = full // blocksize
    com = x[:full].reshape(nblocks, blocksize)
    absmax = np.abs(com).max(axis=1).astype(np.float32) if nblocks else np.zeros(0, np.float32)
    inv = (_f32(1.0) / np.maximum(absmax, _f32(1e-38))).astype(np.float32)
    scaled = np.clip((com * inv[:, None]).astype(np.float32), -1, 1).reshape(-1)
    if rem:
        am = np.maximum(np.abs(x[full:]).max(), _f32(1e-38)).astype(np.float32)
        absmax = np.concatenate([absmax, [am]]).astype(np.float32)
        scaled = np.concatenate([scaled, np.clip((x[full:] / am).astype(np.float32), -1, 1)])
    if scaled.size % 2:
        scaled = np.concatenate([scaled, np.zeros(1, np.float32)])
    q = np.searchsorted(bounds, scaled.astype(np.float32), side="left")
    if quant_type != "nf4":
        q = order[q]
    q = q.astype(np.uint8)
    packed = ((q[0::2] << 4) | q[1::2]).astype(np.uint8).reshape(-1, 1)

    code4 = torch.from_numpy(code_cpu.copy())
    if compress_statistics:
        # torch's float32 mean (its summation order), exactly as bnb computes the offset
        offset = torch.from_numpy(absmax).mean()
        centred = (absmax - offset.numpy()).astype(np.float32)
        code2 = dynamic_map()
        qabs, absmax2 = _quantize_blockwise_8bit(centred, code2, 256)
        state2 = QuantState(absmax=torch.from_numpy(absmax2), shape=None, code=torch.from_numpy(code2),
                            dtype=torch.float32, blocksize=256, quant_type="dynamic")
        state = QuantState(absmax=torch.from_numpy(qabs), shape=shape, code=code4, dtype=dtype,
                           blocksize=blocksize, quant_type=quant_type, offset=offset, state2=state2)
    else:
        state = QuantState(absmax=torch.from_numpy(absmax), shape=shape, code=code4, dtype=dtype,
                           blocksize=blocksize, quant_type=quant_type)
    return torch.from_numpy(packed), state


# ---------------------------------------------------------------------------- dequantize
def _np(t) -> np.ndarray:
    if isinstance(t, np.ndarray):
        return t
    if t.device.type != "cpu":
        t = t.cpu()
    return t.detach().contiguous().numpy()


def nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    """The n 4-bit indices of a packed byte array: the first value of a byte is its high nibble."""
    b = packed.reshape(-1).view(np.uint8)
    if b.size < (n + 1) // 2:
        raise ValueError(f"packed tensor holds {b.size} bytes, {(n + 1) // 2} needed for {n} values")
    q = np.empty(b.size * 2, np.uint8)
    q[0::2] = b >> 4
    q[1::2] = b & 15
    return q[:n]


def _ftz(x: np.ndarray) -> np.ndarray:
    tiny = np.finfo(np.float32).tiny
    return np.where(np.abs(x) < tiny, np.copysign(np.float32(0), x), x).astype(np.float32)


def block_scales(quant_state) -> np.ndarray:
    """float32 scale of every quantization block: the absmax, decoded from its 8-bit code when
    the statistics are nested (two roundings: multiply, then add the offset)."""
    if getattr(quant_state, "state2", None) is not None:
        q = _np(quant_state.absmax).reshape(-1)
        if q.dtype != np.uint8:
            raise ValueError(f"nested absmax must be uint8, got {q.dtype}")
        s2 = quant_state.state2
        code2 = _np(s2.code).astype(np.float32).reshape(-1)
        absmax2 = _np(s2.absmax).astype(np.float32).reshape(-1)
        groups = np.arange(q.size) // int(s2.blocksize)
        prod = _ftz((code2[q] * absmax2[groups]).astype(np.float32))
        offset = np.float32(_np(quant_state.offset).reshape(-1)[0]) if not isinstance(
            quant_state.offset, (float, int)) else np.float32(quant_state.offset)
        return _ftz((prod + offset).astype(np.float32))
    return _np(quant_state.absmax).astype(np.float32).reshape(-1)


def to_output_bits(values: np.ndarray, dtype_name: str) -> np.ndarray:
    """Round float32 values to the output dtype (nearest even); bf16/fp16 as uint16 bits."""
    if dtype_name == "float32":
        return values.astype(np.float32)
    if dtype_name == "float16":
        return values.astype(np.float16).view(np.uint16)
    u = values.astype(np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return rounded


def dequantize_4bit_numpy(packed, quant_state) -> np.ndarray:
    """Flat float32 values (before rounding to the output dtype) of bnb's CUDA recipe."""
    qt = quant_state.quant_type
    if qt not in _CODES:
        raise ValueError(f"quant_type must be 'nf4' or 'fp4', got {qt!r}")
    bs = int(quant_state.blocksize)
    if bs not in BLOCKSIZES:
        raise ValueError(f"invalid blocksize {bs}")
    n = math.prod(quant_state.shape)
    q = nibbles(_np(packed), n)
    scales = block_scales(quant_state)
    need = -(-n // bs)
    if scales.size < need:
        raise ValueError(f"quant_state holds {scales.size} block scales, {need} needed for {n} values")
    per_elem = np.repeat(scales[:need], bs)[:n]
    return _ftz((_CODES[qt][q] * per_elem).astype(np.float32))


def dequantize_4bit(A, quant_state):
    """bnb's CUDA ``dequantize_4bit(A, quant_state)``, computed on the CPU: a torch tensor of
    ``quant_state.dtype`` and ``quant_state.shape`` (transposed back, as bnb does, when ``A`` is
    in the legacy ``[1, n]`` packed form; a 1-D weight stays ``(n,)`` in either form, as on
    CUDA, where bnb's native CPU kernel returns ``(1, n)`` for an even n)."""
    torch = _torch()
    name = _np_dtype_name(quant_state.dtype)
    values = dequantize_4bit_numpy(A, quant_state)
    bits = to_output_bits(values, name)
    if name == "float32":
        out = torch.from_numpy(bits)
    else:
        out = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16 if name == "bfloat16" else torch.float16)
    out = out.reshape(tuple(quant_state.shape))
    if tuple(A.shape)[0] == 1 and out.dim() == 2:
        out = out.t()
    return out
