"""Hugging Face ``generate`` as bnb users run it: eager with a dynamic cache, and as a CUDA-graph step.

:func:`generate_benchmark` builds a model from a Hugging Face ``config.json`` (random weights; Llama-3-8B's
shape by default) in bf16, and a copy with every decoder ``nn.Linear`` as a bnb ``Linear4bit`` (nf4, nested
statistics, blocksize 64; the lm_head stays bf16). Three variants, each run two ways:

- variants: ``bf16`` (the unquantized model), ``bnb`` (bnb's own kernels), ``patched`` (under
  :func:`nf4tune.patch_bitsandbytes`); with ``pdl`` a fourth for the graph step, ``patched+pdl`` (patched,
  the kernels launched with programmatic dependent launch: experimental);
- eager: ``model.generate`` with greedy decoding and the dynamic cache, the way most bnb users decode; the
  time of each new token is read between generation steps (a logits processor stamps them: eager decode
  synchronises every step), and the median step after the first few is the ms/token;
- graph: one decode step with a static KV cache captured in a CUDA graph and replayed
  (:func:`nf4tune.bench.decode.decode_step_times`), with the ``no-4bit`` bound (every ``Linear4bit`` free).

Rounds are interleaved (every variant once per round, the order rotating), the first round is discarded
(warm-up: plans, compiles, allocator), and the spread over the rest is reported beside the median.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

__all__ = ["VARIANTS", "GenerateResult", "load_model_config", "build_from_config", "eager_step_times",
           "generate_benchmark", "format_generate"]

VARIANTS = ("bf16", "bnb", "patched")
#: the graph step patched and launched with programmatic dependent launch (``pdl=True``; experimental)
PDL_VARIANT = "patched+pdl"


@dataclass
class GenerateResult:
    variant: str
    batch: int
    mode: str                        # "eager" or "graph"
    ms_per_token: float              # per decode step (batch tokens)
    spread_ms: float                 # max - min over the kept rounds
    tokens_per_s: float
    rounds_ms: list = field(default_factory=list)
    note: str = ""


def load_model_config(path: Optional[str] = None, layers: Optional[int] = None) -> dict:
    """The fields of a Hugging Face ``config.json`` (default: Llama-3-8B's), with ``num_hidden_layers`` set
    to ``layers`` when given."""
    from .decode import LLAMA3_8B

    if path:
        try:
            cfg = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the model config {path}: {e}") from None
        if not isinstance(cfg, dict) or "hidden_size" not in cfg:
            raise ValueError(f"{path} is not a Hugging Face config.json (no hidden_size)")
    else:
        cfg = dict(LLAMA3_8B, model_type="llama")
    if layers:
        cfg = dict(cfg, num_hidden_layers=layers)
    return cfg


def build_from_config(cfg: dict, device: str = "cuda", seed: int = 0):
    """A causal LM of ``cfg`` in bf16 with random weights (transformers' AutoModelForCausalLM)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    config = AutoConfig.for_model(fields.pop("model_type", "llama"), **fields)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def _prompt(model, batch: int, prompt_len: int, seed: int = 0):
    import torch

    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (batch, prompt_len), generator=g, device=dev)


def eager_step_times(model, ids, new_tokens: int, skip: int = 4) -> list:
    """Milliseconds of each decode step of ``model.generate(ids)`` (greedy, dynamic cache, exactly
    ``new_tokens`` new tokens), read between steps; the first ``skip`` steps (prefill and warm-up) left out."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, use_cache=True, pad_token_id=0, logits_processor=LogitsProcessorList([Stamp()]))
    sync()
    return [1e3 * (b - a) for a, b in zip(stamps[skip:], stamps[skip + 1:])]


def _summary(variant, batch, mode, rounds, note=""):
    m = statistics.median(rounds)
    return GenerateResult(variant, batch, mode, m, max(rounds) - min(rounds), batch * 1000.0 / m, rounds, note)


def generate_benchmark(config_path: Optional[str] = None, layers: Optional[int] = None, batches=(1, 8),
                       rounds: int = 3, new_tokens: int = 48, prompt_len: int = 64, graph: bool = True,
                       progress=None, device: str = "cuda", pdl: bool = False, **overrides) -> dict:
    """tokens/s of HF ``generate`` in bf16, with bnb's kernels and patched, eager and as a CUDA-graph step;
    ``rounds`` kept rounds after a discarded first one, interleaved. ``pdl``: the graph step patched with
    programmatic dependent launch too (variant ``patched+pdl``)."""
    import torch

    from ..serve import stats
    from ..serve.matmul import use_pdl
    from ..serve.patch import patch_bitsandbytes
    from ..serve.table import current_table
    from .decode import decode_step_times, free_4bit_linears, linear4bit_bytes, quantize_linears, read_ceiling_gbps

    say = progress or (lambda msg: None)
    cfg = dict(load_model_config(config_path, layers), **overrides)
    t0 = time.perf_counter()
    dense = build_from_config(cfg, device)
    quant = build_from_config(cfg, device)
    n = quantize_linears(quant)
    w4 = linear4bit_bytes(quant)
    say(f"built the {cfg.get('model_type', 'llama')} model ({cfg['num_hidden_layers']} layers) twice in "
        f"{time.perf_counter() - t0:.0f} s; {n} linear layers quantized ({w4 / 1e9:.2f} GB)")
    patch = {"on": None}

    def enter(variant):
        if variant in ("patched", PDL_VARIANT):
            patch["on"] = patch_bitsandbytes()
        if variant == PDL_VARIANT:
            use_pdl(True)

    def leave(variant):
        if variant == PDL_VARIANT:
            use_pdl(None)
        if patch["on"] is not None:
            patch["on"].undo()
            patch["on"] = None

    model_of = {"bf16": dense, "bnb": quant, "patched": quant, PDL_VARIANT: quant}
    results, agreement, calls = [], {}, {}
    for b in batches:
        ids = _prompt(dense, b, prompt_len)
        per = {v: [] for v in VARIANTS}
        for r in range(rounds + 1):
            order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
            for v in order:
                enter(v)
                try:
                    c0 = stats()["matmul_calls"]
                    steps = eager_step_times(model_of[v], ids, new_tokens)
                    if v == "patched":
                        calls[b] = stats()["matmul_calls"] - c0
                finally:
                    leave(v)
                if r:
                    per[v].append(statistics.median(steps))
            if r:
                say(f"batch {b} eager round {r}: " + ", ".join(f"{v} {per[v][-1]:.2f} ms/token" for v in VARIANTS))
        for v in VARIANTS:
            note = f"{calls.get(b, 0)} fused matmul calls in the last round" if v == "patched" else ""
            results.append(_summary(v, b, "eager", per[v], note))
        if graph:
            for v in VARIANTS + ((PDL_VARIANT,) if pdl else ()):
                enter(v)
                try:
                    times, mode, first = decode_step_times(model_of[v], b)
                finally:
                    leave(v)
                results.append(_summary(v, b, "graph", times, "" if mode == "cuda graph" else mode))
                if v == "bnb":
                    bnb_first = first
                elif v == "patched":
                    diff = (first.float() - bnb_first.float()).abs()
                    agreement[b] = dict(max_abs_logit_diff=float(diff.max()), mean_abs_logit_diff=float(diff.mean()),
                                        same_argmax=float((first.argmax(-1) == bnb_first.argmax(-1)).float().mean()))
                say(f"batch {b} graph {v}: {results[-1].ms_per_token:.3f} ms/step")
            with free_4bit_linears():
                times, mode, _ = decode_step_times(quant, b)
            results.append(_summary("no-4bit", b, "graph", times, "every Linear4bit free: a bound"))
    ceiling = read_ceiling_gbps() if graph else None
    del dense, quant
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return dict(model=cfg.get("model_type", "llama"), config=config_path or "Llama-3-8B shape",
                layers=cfg["num_hidden_layers"], prompt_len=prompt_len, new_tokens=new_tokens, rounds=rounds,
                results=[asdict(r) for r in results], agreement=agreement, table=current_table().origin,
                linear4bit_bytes=w4, read_ceiling_gbps=ceiling)


def format_generate(d: dict) -> str:
    by = {(r["variant"], r["batch"], r["mode"]): r for r in d["results"]}
    lines = [f"HF generate, {d['config']} ({d['model']}, {d['layers']} layers), prompt {d['prompt_len']}, "
             f"{d['new_tokens']} new tokens, greedy; median of {d['rounds']} interleaved rounds after a discarded one "
             f"(spread: max - min); table {d['table']}",
             f"{'batch':>5} {'mode':<6} {'variant':<11} {'ms/token':>9} {'spread':>7} {'tokens/s':>9} {'x bnb':>6} "
             f"{'x bf16':>6}  note"]
    for (variant, b, mode), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2] != "eager", kv[0][2],
                                                                      (VARIANTS + (PDL_VARIANT, "no-4bit")).index(kv[0][0]))):
        xb = by[("bnb", b, mode)]["ms_per_token"] / r["ms_per_token"] if ("bnb", b, mode) in by else float("nan")
        xf = by[("bf16", b, mode)]["ms_per_token"] / r["ms_per_token"] if ("bf16", b, mode) in by else float("nan")
        lines.append(f"{b:>5} {mode:<6} {variant:<11} {r['ms_per_token']:>9.3f} {r['spread_ms']:>7.3f} "
                     f"{r['tokens_per_s']:>9.1f} {xb:>6.2f} {xf:>6.2f}  {r['note']}")
    for b in sorted({b for _, b, _ in by}):
        if ("no-4bit", b, "graph") in by and ("bnb", b, "graph") in by:
            rest, bnb_ms = by[("no-4bit", b, "graph")]["ms_per_token"], by[("bnb", b, "graph")]["ms_per_token"]
            line = f"batch {b} graph: without its 4-bit matmuls the step takes {rest:.3f} ms (at most {bnb_ms / rest:.2f}x bnb)"
            if ("patched", b, "graph") in by:
                ours = by[("patched", b, "graph")]["ms_per_token"] - rest
                if ours > 0:
                    line += f"; the 4-bit matmuls take bnb {bnb_ms - rest:.3f} ms, patched {ours:.3f} ms"
            if d.get("linear4bit_bytes") and d.get("read_ceiling_gbps"):
                floor = d["linear4bit_bytes"] / d["read_ceiling_gbps"] / 1e6
                line += f"; their {d['linear4bit_bytes'] / 1e9:.2f} GB at the read ceiling take {floor:.3f} ms"
            lines.append(line)
    for b, a in d.get("agreement", {}).items():
        lines.append(f"batch {b}: patched vs bnb logits of a step: max |diff| {a['max_abs_logit_diff']:.4g}, mean "
                     f"{a['mean_abs_logit_diff']:.3g}, same argmax {100 * a['same_argmax']:.1f}%")
    return "\n".join(lines)
