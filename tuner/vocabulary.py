"""The words every layer shares: what a problem is, the dtypes and blocksizes, the reference
labels, the nightly flags, the errors, and the speedup over a peer.

This module imports nothing of the project, so every layer (the kernel families, the kernel,
measure, tune, track and serve layers, the store ``db/`` and the ``reports/``) can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

__all__ = [
    "BLOCKSIZES", "DTYPES", "QUANTS", "M_BUCKETS", "TORCH_DTYPE", "OUT_BYTES", "FAMILIES_DEFAULT",
    "REF_COPY", "REF_FILL", "REF_READ", "FLAGS", "FAILING_FLAGS", "NOISY_REFERENCE",
    "Problem", "InvalidConfig", "UnsupportedInput", "speedup", "m_bucket",
]

#: the quantization blocksizes bnb accepts
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
#: output / activation dtypes, by their short names
DTYPES = ("bf16", "fp16", "fp32")
#: 4-bit codes
QUANTS = ("nf4", "fp4")
#: the batch buckets of the matmul family (a problem of M rows is tuned at the bucket >= M)
M_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: short dtype name -> torch dtype attribute name
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: bytes per element of each dtype
OUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
#: the family of a problem that names none (every database before the second family)
FAMILIES_DEFAULT = "dequant"

#: ceilings measured beside every benchmark
REF_COPY = "device copy (ceiling)"
REF_FILL = "write-only fill (floor)"
REF_READ = "read-only reduction (ceiling)"

#: the nightly verdicts (see nf4tune.track.regression.judge), mildest first
FLAGS = ("ok", "noisy-reference", "invalid-environment", "suspicious", "regression", "regression-vs-bnb", "broken")
#: the verdicts that fail a night (exit 1)
FAILING_FLAGS = ("regression", "regression-vs-bnb", "broken")
NOISY_REFERENCE = "noisy-reference"


class InvalidConfig(ValueError):
    """A configuration outside a family's space, with the constraint it breaks."""


class UnsupportedInput(ValueError):
    """Inputs a kernel cannot take (a size past its index range, a misaligned view, a launch the
    device cannot hold). Nothing was launched; the bnb patch hands such calls to bnb."""


def _shape_tuple(shape) -> tuple:
    return tuple(int(d) for d in shape)


@dataclass(frozen=True)
class Problem:
    """What a kernel is tuned for.

    ``shape`` is the weight's shape (rows x columns; for the matmul family N x K, bnb's
    ``[out_features, in_features]``), ``dtype`` the output (dequant) or activation (matmul)
    dtype, ``quant`` the 4-bit code, ``blocksize`` the quantization block. ``m`` is the
    matmul family's batch bucket (rows of A); None for families without a batch."""

    shape: tuple
    dtype: str = "bf16"
    quant: str = "nf4"
    blocksize: int = 64
    family: str = FAMILIES_DEFAULT
    m: Optional[int] = None

    def __post_init__(self):
        object.__setattr__(self, "shape", _shape_tuple(self.shape))
        object.__setattr__(self, "blocksize", int(self.blocksize))
        if self.m is not None:
            object.__setattr__(self, "m", int(self.m))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    def label(self) -> str:
        """``4096x4096 bf16 nf4 bs64`` (dequant); ``matmul 4096x4096 bf16 nf4 bs64 m1``."""
        text = f"{self.shape_text} {self.dtype} {self.quant} bs{self.blocksize}"
        if self.family != FAMILIES_DEFAULT:
            text = f"{self.family} {text}"
        if self.m is not None:
            text += f" m{self.m}"
        return text

    def sort_key(self) -> tuple:
        """Numeric order: family, then element count and shape, dtype, quant, blocksize, m."""
        return (self.family, self.numel, self.shape, self.dtype, self.quant, self.blocksize, self.m or 0)

    def to_dict(self) -> dict:
        return dict(family=self.family, shape=list(self.shape), dtype=self.dtype, quant=self.quant,
                    blocksize=self.blocksize, m=self.m)

    @classmethod
    def from_dict(cls, d: dict) -> "Problem":
        return cls(tuple(d["shape"]), d.get("dtype", "bf16"), d.get("quant", "nf4"), int(d.get("blocksize", 64)),
                   d.get("family") or FAMILIES_DEFAULT, d.get("m"))

    def replace(self, **changes) -> "Problem":
        return Problem(**{**dict(shape=self.shape, dtype=self.dtype, quant=self.quant, blocksize=self.blocksize,
                                 family=self.family, m=self.m), **changes})

    def distance(self, other: "Problem") -> tuple:
        """How far ``other`` is from this problem, as a sort key: another family, dtype, quant,
        batch bucket or blocksize first, then element count on a log scale, then blocksize
        on a log scale. The search seeds a new study from the nearest tuned problem and the
        runtime serves an untuned problem from it; both use this order."""
        return (other.family != self.family, other.dtype != self.dtype, other.quant != self.quant,
                (other.m or 0) != (self.m or 0), other.blocksize != self.blocksize,
                abs(math.log(max(1, other.numel)) - math.log(max(1, self.numel))),
                abs(math.log2(other.blocksize) - math.log2(self.blocksize)),
                abs(math.log2(other.m or 1) - math.log2(self.m or 1)), other.shape)

    @staticmethod
    def parse_shape(text: str) -> tuple:
        try:
            dims = tuple(int(d) for d in str(text).lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {text!r} is not ROWSxCOLS (e.g. 4096x4096)") from None
        if not dims or any(d <= 0 for d in dims) or len(dims) > 2:
            raise ValueError(f"shape {text!r} must be one or two positive sizes, e.g. 4096x4096")
        return dims


def speedup(peer_us: Optional[float], tuned_us: Optional[float]) -> Optional[float]:
    """How many times faster than the peer (bnb) a kernel is: ``peer / tuned`` (None when either
    is missing). The one place this ratio is computed."""
    if not peer_us or not tuned_us:
        return None
    return peer_us / tuned_us


def m_bucket(m: int) -> int:
    """The batch bucket that serves ``m`` rows: the smallest of :data:`M_BUCKETS` >= m (the
    largest bucket past it)."""
    for b in M_BUCKETS:
        if m <= b:
            return b
    return M_BUCKETS[-1]
