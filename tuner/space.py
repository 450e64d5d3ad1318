"""The tuning space: kernel configurations, the constraints that rule points out, presets.

A :class:`KernelConfig` is a frozen, hashable value that serialises to JSON and back. The
space is the cartesian product of :data:`KNOBS` minus the points a constraint rules out;
:func:`iter_space` walks it and :func:`space_size` counts it without building it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import Iterator, Optional

from kernel_templates import SOURCE_KNOBS

__all__ = [
    "KNOBS", "KNOB_HELP", "PRESETS", "DTYPES", "QUANTS", "KernelConfig", "InvalidConfig",
    "iter_space", "space_size", "distinct_sources", "preset", "MAX_INFLIGHT_BYTES",
    "MAX_RESIDENT_THREADS",
]

DTYPES = ("bf16", "fp16", "fp32")
QUANTS = ("nf4", "fp4")

#: every knob and its allowed values, in the order the space is walked
KNOBS: dict[str, tuple] = {
    "bytes_per_thread": (1, 2, 4, 8, 16),
    "threads": (64, 128, 256, 512, 1024),
    "unroll": (1, 2, 4, 8),
    "lut": ("branch", "global", "constant", "shared", "register"),
    "index": ("div", "shift", "hoisted"),
    "store": ("plain", "streaming"),
    "grid": ("oneshot", "persistent"),
    "ctas_per_sm": (None, 1, 2, 4, 8),
    "dtype": DTYPES,
    "quant": QUANTS,
}

KNOB_HELP = {
    "bytes_per_thread": "packed bytes one thread loads per step (one load of that width)",
    "threads": "threads per block",
    "unroll": "independent steps in flight per thread (all loads issued before first use)",
    "lut": "where the 16-entry code lives: if-tree, global, __constant__, shared, or selects",
    "index": "scale lookup: integer division, shift, or one scale hoisted per step",
    "store": "plain or streaming (evict-first) stores",
    "grid": "oneshot: one tile per CTA; persistent: grid-stride loop over SMs x ctas_per_sm",
    "ctas_per_sm": "persistent grid only: CTAs per SM (None for oneshot)",
    "dtype": "output dtype",
    "quant": "4-bit code: nf4 or fp4",
}

#: packed bytes in flight per thread (bytes_per_thread * unroll) above which the outputs held
#: in registers (up to 8 KiB per warp of fp32) only cost occupancy and spill
MAX_INFLIGHT_BYTES = 16
#: resident threads per SM on sm_80 / sm_90; a persistent grid larger than that is a oneshot grid
MAX_RESIDENT_THREADS = 2048


class InvalidConfig(ValueError):
    """A configuration outside the space, with the constraint it breaks."""


@dataclass(frozen=True)
class KernelConfig:
    """One point of the tuning space (a frozen, hashable value)."""

    bytes_per_thread: int = 4
    threads: int = 256
    unroll: int = 1
    lut: str = "shared"
    index: str = "shift"
    store: str = "plain"
    grid: str = "oneshot"
    ctas_per_sm: Optional[int] = None
    dtype: str = "bf16"
    quant: str = "nf4"

    def __post_init__(self):
        for knob, allowed in KNOBS.items():
            value = getattr(self, knob)
            if value not in allowed or (value is not None and type(value) is bool):
                raise InvalidConfig(f"{knob}={value!r} is not one of {list(allowed)}")
        reason = _violation(self)
        if reason:
            raise InvalidConfig(reason)

    # -- serialisation -------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelConfig":
        unknown = set(d) - set(KNOBS)
        if unknown:
            raise InvalidConfig(f"unknown knob(s): {sorted(unknown)}; known: {list(KNOBS)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "KernelConfig":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidConfig(f"config is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise InvalidConfig("config JSON must be an object of knob: value")
        return cls.from_dict(d)

    # -- derived -------------------------------------------------------------------
    def source_knobs(self) -> dict:
        """The knobs that change the CUDA source (the rest change only the launch)."""
        return {k: getattr(self, k) for k in SOURCE_KNOBS}

    def replace(self, **changes) -> "KernelConfig":
        return dataclasses.replace(self, **changes)

    def short(self) -> str:
        grid = "oneshot" if self.grid == "oneshot" else f"persistent x{self.ctas_per_sm}"
        return (f"{self.bytes_per_thread}B x{self.unroll} t{self.threads} {self.lut} {self.index} "
                f"{self.store} {grid} {self.dtype} {self.quant}")


def _violation(c: KernelConfig) -> Optional[str]:
    """The constraint ``c`` breaks, or None."""
    if c.bytes_per_thread * c.unroll > MAX_INFLIGHT_BYTES:
        return (f"bytes_per_thread*unroll = {c.bytes_per_thread * c.unroll} packed bytes in flight "
                f"per thread exceeds {MAX_INFLIGHT_BYTES}")
    if c.grid == "oneshot" and c.ctas_per_sm is not None:
        return "ctas_per_sm applies to the persistent grid only (use None with oneshot)"
    if c.grid == "persistent":
        if c.ctas_per_sm is None:
            return "the persistent grid needs ctas_per_sm (1, 2, 4 or 8)"
        if c.threads * c.ctas_per_sm > MAX_RESIDENT_THREADS:
            return (f"threads*ctas_per_sm = {c.threads * c.ctas_per_sm} exceeds the "
                    f"{MAX_RESIDENT_THREADS} resident threads of an SM")
    return None


def _valid_points(dtypes, quants) -> Iterator[KernelConfig]:
    names = list(KNOBS)
    values = [KNOBS[k] for k in names]
    values[names.index("dtype")] = tuple(dtypes)
    values[names.index("quant")] = tuple(quants)
    for combo in itertools.product(*values):
        d = dict(zip(names, combo))
        probe = _Probe(**d)
        if _violation(probe) is None:
            yield KernelConfig(**d)


@dataclass(frozen=True)
class _Probe:
    """Same fields as KernelConfig, without validation, to test constraints cheaply."""
    bytes_per_thread: int
    threads: int
    unroll: int
    lut: str
    index: str
    store: str
    grid: str
    ctas_per_sm: Optional[int]
    dtype: str
    quant: str


def _check_filter(name, given, allowed):
    bad = [v for v in given if v not in allowed]
    if bad:
        raise InvalidConfig(f"{name} {bad} not in {list(allowed)}")


def iter_space(dtypes=DTYPES, quants=QUANTS) -> Iterator[KernelConfig]:
    """Every valid configuration for the given output dtypes and quant types."""
    _check_filter("dtype", dtypes, DTYPES)
    _check_filter("quant", quants, QUANTS)
    return _valid_points(dtypes, quants)


def space_size(dtypes=DTYPES, quants=QUANTS) -> int:
    """How many valid configurations there are (counted from the constraint structure)."""
    _check_filter("dtype", dtypes, DTYPES)
    _check_filter("quant", quants, QUANTS)
    per = 0
    for b, t, u, g, cps in itertools.product(KNOBS["bytes_per_thread"], KNOBS["threads"], KNOBS["unroll"],
                                              KNOBS["grid"], KNOBS["ctas_per_sm"]):
        probe = _Probe(b, t, u, "shared", "shift", "plain", g, cps, "bf16", "nf4")
        if _violation(probe) is None:
            per += 1
    return per * len(KNOBS["lut"]) * len(KNOBS["index"]) * len(KNOBS["store"]) * len(dtypes) * len(quants)


def distinct_sources(configs) -> dict[tuple, KernelConfig]:
    """One representative config per distinct rendered source, keyed by its source knobs."""
    out: dict[tuple, KernelConfig] = {}
    for c in configs:
        out.setdefault(tuple(sorted(c.source_knobs().items())), c)
    return out


#: named points of the space
PRESETS = {
    # the blog post's final kernel: 4 packed bytes, 256 threads, shared table, shift indexing
    "blog": dict(bytes_per_thread=4, threads=256, unroll=1, lut="shared", index="shift",
                 store="plain", grid="oneshot", ctas_per_sm=None),
    # bitsandbytes' kDequantizeBlockwise<T, 512, 64, 8, NF4>: 8 bytes, 64 threads, global table,
    # integer division, one 512-byte tile per CTA
    "bnb-like": dict(bytes_per_thread=8, threads=64, unroll=1, lut="global", index="div",
                     store="plain", grid="oneshot", ctas_per_sm=None),
}


def preset(name: str, dtype: str = "bf16", quant: str = "nf4") -> KernelConfig:
    """The named preset for an output dtype and quant type."""
    if name not in PRESETS:
        raise InvalidConfig(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return KernelConfig(**PRESETS[name], dtype=dtype, quant=quant)
