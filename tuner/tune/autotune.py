"""Opt-in first-use autotuning of the matmul family, as Triton's autotuner serves shapes nobody tuned.

For a (GPU model, weight shape, dtype, quant type, blocksize, batch bucket) the serving table has no
entry for, :func:`autotune_call` takes the top few candidates (the configs of the nearest tuned
problems, :func:`candidates`), passes each through the family's gate on fresh random data, times the
valid ones on the real weight beside bnb's own ``matmul_4bit`` with the project's harness (L2 flushed,
CUDA events, interleaved), within :data:`BUDGET_S` seconds of gating and timing a shape, and writes the
winner (where it beats bnb) to the per-user table (:func:`nf4tune.serve.table.user_table_path`), in the
packaged table's format. The runtime reads that table; later processes reuse it.

Two ways in: ``NF4TUNE_AUTOTUNE=1`` (importing ``nf4tune`` installs :func:`enable_first_use`: the runtime
autotunes a shape on its first call), or :func:`autotune` on a model before serving it. Autotuning
measures, so it lives here, in the tuning layer, above the runtime, which only reads table files.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import threading
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

from ..families.matmul import MatmulInputs, check_matmul_inputs
from ..vocabulary import Problem, m_bucket, speedup

__all__ = ["BUDGET_S", "MAX_CANDIDATES", "AutotuneResult", "candidates", "autotune_call", "autotune",
           "enable_first_use", "disable_first_use", "write_user_entry"]

#: seconds of gating and timing one shape may take (a candidate is not started past it)
BUDGET_S = 2.0
#: candidates timed per shape at most
MAX_CANDIDATES = 4

_busy = threading.local()
#: the problems first-use autotuning has tried in this process (each once, whatever came of it)
_attempted: set = set()


@dataclass
class AutotuneResult:
    gpu: str
    problem: dict
    winner: Optional[dict]                  # the config written to the per-user table, or None (bnb serves)
    winner_us: Optional[float] = None
    bnb_us: Optional[float] = None
    speedup_vs_bnb: Optional[float] = None
    seconds: float = 0.0                    # gating and timing (compiles included)
    tried: list = field(default_factory=list)   # (label, status, median us or reason)
    table: str = ""

    def describe(self) -> str:
        p = Problem.from_dict(self.problem)
        if self.winner is None:
            return f"{p.label()}: no candidate beat bnb ({self.seconds:.1f} s): bnb serves it"
        return (f"{p.label()}: {self.winner_us:.1f} us against bnb's {self.bnb_us:.1f} ({self.speedup_vs_bnb:.2f}x) "
                f"in {self.seconds:.1f} s, written to {self.table}")


def candidates(table, gpu: str, problem: Problem, accepts, limit: int = MAX_CANDIDATES) -> list:
    """The configs worth timing for ``problem``: the tuned neighbours' configs (same GPU model, dtype and
    quant type, faster than bnb; the problem's batch bucket first, then the other buckets), carried over to
    the problem's problem knobs, that the family's constraints and ``accepts(config)`` (the launch plan)
    take; nearest first, each once, at most ``limit``."""
    out: list = []
    for _, config in table.fitting(gpu, problem, accepts, any_bucket=True):
        if config not in out:
            out.append(config)
            if len(out) == limit:
                break
    return out


def _user_entries(path) -> list:
    if not os.path.exists(path):
        return []
    from ..serve.table import read_table_entries

    return read_table_entries(path)             # a table the runtime can read, or ValueError


def write_user_entry(entry: dict, path=None) -> str:
    """Put ``entry`` into the per-user table (replacing the entry of the same GPU model and problem), under a
    file lock so that processes autotuning at once keep each other's entries; written atomically."""
    from .._files import atomic_write
    from ..serve.table import entry_key, table_document, user_table_path

    path = str(path or user_table_path())
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entries = _user_entries(path)
        except (ValueError, OSError, KeyError) as e:
            warnings.warn(f"nf4-tune autotune: {path} is not a readable table ({e}); it is started again",
                          RuntimeWarning, stacklevel=2)
            entries = []
        entries = [e for e in entries if entry_key(e) != entry_key(entry)]
        entries.append(entry)
        atomic_write(path, json.dumps(table_document(entries), indent=2))
    return path


def autotune_call(A, qs, bias=None, *, budget_s: float = BUDGET_S, table=None, write: bool = True,
                  seed: Optional[int] = None) -> AutotuneResult:
    """Autotune the problem of the call ``matmul_4bit(A, B, qs, bias=bias)`` on its real weight (``qs`` with
    the packed weight at ``qs.__dict__['_nf4tune_B']`` or given through :func:`autotune`): gate the
    candidates, time them against bnb, and write the winner to the per-user table (``write``)."""
    import torch

    from ..kernel.arch import device_limits
    from ..kernel.launch import bind, load_kernel
    from ..measure.gate import check_config
    from ..measure.timing import l2_flush_buffer, measure_interleaved
    from ..serve import table as serve_table
    from ..serve.matmul import declined, gpu_name, plan_verdict

    t0 = time.perf_counter()
    B = qs.__dict__.get("_nf4tune_B")
    if B is None:
        raise ValueError("autotune_call needs the packed weight: call autotune(model) or autotune_weight(A, B, qs)")
    N, K, dtype = check_matmul_inputs(A, qs, bias)
    M = A.numel() // K
    index = A.get_device()
    gpu = gpu_name(index)
    problem = Problem((N, K), dtype, qs.quant_type, int(qs.blocksize), "matmul", m_bucket(M))
    limits = device_limits(index)
    groupsize = int(qs.state2.blocksize) if qs.state2 is not None else 256

    def accepts(config):
        return plan_verdict(config, problem.m, N, K, int(qs.blocksize), groupsize, limits)

    table = table or serve_table.current_table()
    result = AutotuneResult(gpu, problem.to_dict(), None)
    seed = secrets.randbits(31) if seed is None else seed
    inputs = MatmulInputs(A.reshape(M, K).contiguous(), B, qs, bias, M, N, K)
    out = torch.empty((M, N), dtype=A.dtype, device=A.device)
    fns = {}
    for i, config in enumerate(candidates(table, gpu, problem, accepts)):
        if time.perf_counter() - t0 > budget_s:
            result.tried.append((config.short(), "skipped", "over the time budget"))
            continue
        gate = check_config(config, problem, seed=seed + i)
        if not gate.ok:
            result.tried.append((config.short(), "invalid", gate.reason))
            continue
        try:
            fns[config] = bind(load_kernel(config), inputs, out)
        except Exception as e:      # a plan the device refuses after all: recorded, not raised
            result.tried.append((config.short(), "invalid", f"{type(e).__name__}: {e}"))
    if fns:
        import bitsandbytes as bnb

        def bnb_call():
            declined.on = True      # bnb's own path even under patch_bitsandbytes()
            try:
                with torch.no_grad():
                    bnb.matmul_4bit(inputs.A, B, qs, bias=bias)
            finally:
                declined.on = False

        timed = {"bnb": bnb_call, **{c.short(): f for c, f in fns.items()}}
        left = max(0.25, budget_s - (time.perf_counter() - t0))
        samples = measure_interleaved(timed, warmup=2, min_reps=7, max_reps=200, time_cap_s=left,
                                      flush=l2_flush_buffer())
        result.bnb_us = samples["bnb"].median
        best = min(fns, key=lambda c: samples[c.short()].median)
        for c in fns:
            result.tried.append((c.short(), "ok", samples[c.short()].median))
        best_us = samples[best.short()].median
        if best_us < result.bnb_us:
            result.winner, result.winner_us = best.to_dict(), best_us
            result.speedup_vs_bnb = speedup(result.bnb_us, best_us)
    result.seconds = time.perf_counter() - t0
    if write and result.winner is not None:
        entry = dict(gpu=gpu, family="matmul", shape=[N, K], dtype=dtype, quant=problem.quant,
                     blocksize=problem.blocksize, m=problem.m, config=result.winner, median_us=result.winner_us,
                     peer_median_us=result.bnb_us, speedup_vs_bnb=result.speedup_vs_bnb,
                     autotuned=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        result.table = write_user_entry(entry)
        serve_table.reload_user_table()
    return result


def autotune_weight(A, B, qs, bias=None, **kw) -> AutotuneResult:
    """:func:`autotune_call` for ``matmul_4bit(A, B, qs, bias=bias)`` with its packed weight ``B``."""
    qs.__dict__["_nf4tune_B"] = B
    try:
        return autotune_call(A, qs, bias, **kw)
    finally:
        qs.__dict__.pop("_nf4tune_B", None)


def autotune(model, batches=(1,), dtype=None, budget_s: float = BUDGET_S, progress=None) -> list:
    """Autotune every distinct ``Linear4bit`` weight shape of ``model`` (on the GPU) that the serving table
    does not hold, at each batch size in ``batches``, on the model's own weights; the winners go to the
    per-user table, which this process and later ones serve from. Returns the :class:`AutotuneResult`s."""
    import torch
    import bitsandbytes as bnb

    from ..serve.matmul import gpu_name
    from ..serve import table as serve_table

    say = progress or (lambda msg: None)
    results, seen = [], set()
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        w = module.weight
        qs = getattr(w, "quant_state", None)
        if qs is None or not w.is_cuda:
            continue
        act = dtype or module.compute_dtype or torch.bfloat16
        for M in batches:
            key = (tuple(qs.shape), qs.quant_type, qs.blocksize, act, m_bucket(M))
            if key in seen:
                continue
            seen.add(key)
            dname = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[act]
            problem = Problem(tuple(int(d) for d in qs.shape), dname, qs.quant_type, int(qs.blocksize), "matmul",
                              m_bucket(M))
            if serve_table.current_table().entry(gpu_name(w.get_device()), problem) is not None:
                continue
            A = torch.randn(M, int(qs.shape[1]), dtype=act, device=w.device)
            bias = module.bias.to(act) if module.bias is not None else None
            r = autotune_weight(A, w, qs, bias, budget_s=budget_s)
            say(f"autotune {name}: {r.describe()}")
            results.append(r)
    return results


def _first_use(A, qs, bias, B) -> bool:
    """The runtime's hook for a problem the serving table has no entry for: autotune it now (once per
    process and problem). True when the per-user table gained an entry."""
    if getattr(_busy, "on", False):
        return False
    key = (A.get_device(), tuple(qs.shape), A.dtype, qs.quant_type, int(qs.blocksize), m_bucket(A.numel() // qs.shape[1]))
    if key in _attempted:
        return False
    _attempted.add(key)
    _busy.on = True
    try:
        r = autotune_weight(A, B, qs, bias)
        return r.winner is not None
    except Exception as e:       # autotuning must never break the call it serves: bnb or a transfer serves
        warnings.warn(f"nf4-tune autotune failed ({type(e).__name__}: {e}); the runtime serves without it",
                      RuntimeWarning, stacklevel=3)
        return False
    finally:
        _busy.on = False


def enable_first_use() -> None:
    """Autotune each untuned shape on its first call (what ``NF4TUNE_AUTOTUNE=1`` turns on)."""
    from ..serve import matmul

    matmul.set_first_use_hook(_first_use)


def disable_first_use() -> None:
    from ..serve import matmul

    matmul.set_first_use_hook(None)
