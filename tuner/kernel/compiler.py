"""NVRTC compilation of kernel variants to CUBIN, through cuda.core, with an on-disk cache.

Any real arch the installed NVRTC supports is a target (:mod:`nf4tune.kernel.arch`). The cache
key hashes everything that can change the binary: the rendered source, the NVRTC options, the
NVRTC version, the target arch and the kernel's name. Entries are written atomically (temp
file + rename), so parallel compiles and killed processes never leave a half-written CUBIN.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Optional

from .._files import atomic_write
from .arch import check_arch

__all__ = [
    "CompileError", "CompiledKernel", "CompileSummary", "compile_config", "compile_source", "compile_many",
    "nvrtc_version", "default_cache_dir", "visible_arch", "nvrtc_options",
]


class CompileError(RuntimeError):
    """NVRTC rejected a source; ``log`` holds NVRTC's compilation log."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message + (f"\n--- NVRTC log ---\n{log}" if log else ""))
        self.log = log


@dataclass(frozen=True)
class CompiledKernel:
    cubin: bytes
    arch: str
    key: str
    registers: Optional[int]
    spill_stores: Optional[int]
    spill_loads: Optional[int]
    log: str
    cached: bool = field(default=False, compare=False)
    kernel_name: str = ""


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"nvrtcVersion failed: {err}")
    return f"{major}.{minor}"


def default_cache_dir() -> Path:
    env = os.environ.get("NF4TUNE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nf4-tune" / "cubin"


@lru_cache(maxsize=1)
def _include_paths() -> tuple[str, ...]:
    """CUDA headers located by cuda.pathfinder (no CUDA install needed). The template includes
    nothing, so these only serve a rendered source that does; none found is not an error."""
    paths = []
    try:
        from cuda import pathfinder
    except ImportError:  # pragma: no cover - cuda-pathfinder is a dependency
        return ()
    for lib in ("nvrtc", "cudart"):
        try:
            p = pathfinder.find_nvidia_header_directory(lib)
        except Exception:
            p = None
        if p and p not in paths:
            paths.append(p)
    return tuple(paths)


def nvrtc_options(arch: str) -> dict:
    """The ProgramOptions every variant is compiled with (part of the cache key)."""
    return dict(arch=arch, std="c++17", ftz=True, fma=False, prec_div=True, prec_sqrt=True,
                ptxas_options="-v", include_path=list(_include_paths()))


def visible_arch() -> str:
    """The arch of the visible GPU (device 0); raises RuntimeError when there is none."""
    from .gpu import require_gpu

    return require_gpu().arch


def _cache_key(source: str, arch: str, kernel_name: str) -> str:
    opts = nvrtc_options(arch)
    opts = {k: v for k, v in opts.items() if k != "include_path"}
    h = hashlib.sha256()
    for part in (source, json.dumps(opts, sort_keys=True), nvrtc_version(), arch, kernel_name):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


_RES = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _parse_resources(log: str):
    regs = _RES.search(log)
    spill = _SPILL.search(log)
    return (int(regs.group(1)) if regs else None,
            int(spill.group(1)) if spill else None,
            int(spill.group(2)) if spill else None)


_EIATTR_REGCOUNT = 0x2F   # an .nv.info attribute: (function symbol, registers per thread)


def cubin_registers(cubin: bytes) -> Optional[int]:
    """The registers per thread that the CUBIN's ``.nv.info`` section records for its kernel (the most, if it
    holds several), or None: the count when the compile log does not carry ptxas's ``Used N registers`` line.
    Attributes are 4-byte headers (format, attribute, a 16-bit value or size); format 4 carries ``size`` bytes."""
    import struct

    try:
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        heads = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
        names = heads[shstrndx][4]
        found = []
        for name_off, _type, _flags, _addr, off, size in heads:
            name = cubin[names + name_off:cubin.index(b"\0", names + name_off)]
            if not name.startswith(b".nv.info"):
                continue
            p = off
            while p + 4 <= off + size:
                fmt, attr, value = struct.unpack_from("<BBH", cubin, p)
                if fmt == 0x04 and attr == _EIATTR_REGCOUNT and value >= 8:
                    found.append(struct.unpack_from("<I", cubin, p + 8)[0])
                p += 4 + (value if fmt == 0x04 else 0)
        return max(found) if found else None
    except (struct.error, ValueError, IndexError):
        return None


def _read_cache(cache_dir: Path, key: str, arch: str, kernel_name: str) -> Optional[CompiledKernel]:
    cubin_path = cache_dir / key[:2] / f"{key}.cubin"
    meta_path = cache_dir / key[:2] / f"{key}.json"
    try:
        meta = json.loads(meta_path.read_text())
        cubin = cubin_path.read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        return None  # torn or corrupted entry: recompile
    registers = meta.get("registers")
    if registers is None:
        registers = cubin_registers(cubin)
    return CompiledKernel(cubin=cubin, arch=arch, key=key, registers=registers,
                          spill_stores=meta.get("spill_stores"), spill_loads=meta.get("spill_loads"),
                          log=meta.get("log", ""), cached=True, kernel_name=kernel_name)


def compile_source(source: str, arch: str, kernel_name: str, cache_dir: Optional[os.PathLike] = None,
                   use_cache: bool = True) -> CompiledKernel:
    """Compile one rendered source (holding ``kernel_name``) to CUBIN for ``arch`` (cache first)."""
    from cuda.core import Program, ProgramOptions

    check_arch(arch)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = _cache_key(source, arch, kernel_name)
    if use_cache:
        hit = _read_cache(cache, key, arch, kernel_name)
        if hit is not None:
            return hit
    logbuf = io.StringIO()
    try:
        program = Program(source, "c++", ProgramOptions(**nvrtc_options(arch)))
        obj = program.compile("cubin", logs=logbuf)
    except Exception as e:  # cuda.core raises NVRTCError with the log in its message
        raise CompileError(f"NVRTC failed to compile {kernel_name} for {arch}", log=str(e)) from None
    log = logbuf.getvalue()
    cubin = bytes(obj.code)
    regs, ss, sl = _parse_resources(log)
    if regs is None:              # a log without ptxas's resource line (seen on a GPU machine): the CUBIN's own count
        regs = cubin_registers(cubin)
    if use_cache:
        meta = dict(registers=regs, spill_stores=ss, spill_loads=sl, log=log, arch=arch,
                    nvrtc=nvrtc_version(), cubin_sha256=hashlib.sha256(cubin).hexdigest())
        # cubin first, meta last: an entry is only valid once its meta names the cubin's hash
        atomic_write(cache / key[:2] / f"{key}.cubin", cubin)
        atomic_write(cache / key[:2] / f"{key}.json", json.dumps(meta).encode())
    return CompiledKernel(cubin=cubin, arch=arch, key=key, registers=regs, spill_stores=ss,
                          spill_loads=sl, log=log, cached=False, kernel_name=kernel_name)


def compile_config(config, arch: Optional[str] = None, cache_dir: Optional[os.PathLike] = None,
                   use_cache: bool = True) -> CompiledKernel:
    """Compile ``config`` (a :class:`nf4tune.family.Config`) for ``arch`` (default: the visible GPU's)."""
    arch = arch or visible_arch()
    return compile_source(config.render(), arch, config.family.kernel_name, cache_dir, use_cache)


@dataclass
class CompileSummary:
    arch: str
    configs: int
    sources: int
    compiled: int = 0
    cache_hits: int = 0
    failures: list = field(default_factory=list)  # (config, error message)
    seconds: float = 0.0
    max_registers: Optional[int] = None
    spilling: int = 0

    def to_dict(self) -> dict:
        return dict(arch=self.arch, configs=self.configs, sources=self.sources, compiled=self.compiled,
                    cache_hits=self.cache_hits, seconds=round(self.seconds, 2),
                    max_registers=self.max_registers, spilling=self.spilling,
                    failures=[dict(config=c.to_dict(), error=e) for c, e in self.failures])


def _compile_one(config, arch, cache_dir):
    try:
        k = compile_config(config, arch, cache_dir)
        return config, None, k.cached, k.registers, k.spill_stores
    except Exception as e:  # a failing variant is data, not a crash
        return config, f"{type(e).__name__}: {e}", False, None, None


def _compile_worker(args):
    from ..families import get

    family, knobs_json, arch, cache_dir = args
    config, err, cached, regs, spills = _compile_one(get(family).from_json(knobs_json), arch, cache_dir)
    return knobs_json, err, cached, regs, spills


def compile_many(configs: Iterable, arch: str, workers: Optional[int] = None,
                 cache_dir: Optional[os.PathLike] = None,
                 progress: Optional[Callable[[int, int], None]] = None) -> CompileSummary:
    """Compile every distinct source among ``configs`` (of one family) for ``arch``, in parallel
    processes (``workers=1``: in this process)."""
    check_arch(arch)
    configs = list(configs)
    if not configs:
        return CompileSummary(arch=arch, configs=0, sources=0)
    family = configs[0].family
    reps = list(family.distinct_sources(configs).values())
    summary = CompileSummary(arch=arch, configs=len(configs), sources=len(reps))
    cache = str(cache_dir) if cache_dir is not None else str(default_cache_dir())
    workers = workers or max(1, os.cpu_count() or 1)
    t0 = time.perf_counter()
    done = 0
    regs_seen = []
    by_json = {c.to_json(): c for c in reps}
    if workers == 1:
        iterator = ((c.to_json(),) + _compile_one(c, arch, cache)[1:] for c in reps)
    else:
        pool = ProcessPoolExecutor(max_workers=workers)
        futures = [pool.submit(_compile_worker, (family.name, c.to_json(), arch, cache)) for c in reps]
        iterator = (f.result() for f in as_completed(futures))
    try:
        for knobs_json, err, cached, regs, spills in iterator:
            done += 1
            if err:
                summary.failures.append((by_json[knobs_json], err))
            else:
                summary.compiled += 1
                summary.cache_hits += int(bool(cached))
                if regs is not None:
                    regs_seen.append(regs)
                if spills:
                    summary.spilling += 1
            if progress:
                progress(done, len(reps))
    finally:
        if workers != 1:
            pool.shutdown(cancel_futures=True)
    summary.seconds = time.perf_counter() - t0
    summary.max_registers = max(regs_seen) if regs_seen else None
    return summary
