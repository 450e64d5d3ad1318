"""End-to-end decode: a Llama-3-8B-shaped ``LlamaForCausalLM`` (random weights from a config),
its linear layers as bnb ``Linear4bit`` (nf4, nested statistics, blocksize 64; the lm_head stays
bf16), decoding with a static KV cache under CUDA graphs (eager decode is host-bound).

:func:`decode_benchmark` measures tokens/s of the same model three ways: in bf16, quantized with
bnb's own kernels, and quantized with nf4-tune's patch (the tuned matmul where it beat bnb).
Each way captures one decode step (batch B, one token) in a CUDA graph after warm-up and times
the replays with CUDA events; the outputs of the patched and unpatched quantized models are
compared on the same step (their logits agree within bnb's own error).

A fourth way bounds what any 4-bit matmul can give: ``no-4bit`` replays the quantized model with
every ``Linear4bit`` returning a ready zero tensor (no kernel at all), so its step is the rest of the
model (attention, norms, the bf16 lm_head, the KV cache). bnb's step over that step is the most any
kernel for the quantized linears can speed the decode up (Amdahl); ``format_decode`` prints it.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Optional

__all__ = ["LLAMA3_8B", "build_model", "quantize_linears", "linear4bit_bytes", "read_ceiling_gbps", "free_4bit_linears",
           "DecodeResult", "decode_step_times", "decode_benchmark", "format_decode"]

#: Llama-3-8B's shape (config.json of meta-llama/Meta-Llama-3-8B)
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 num_hidden_layers=32, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                 rms_norm_eps=1e-5)


def build_model(layers: int = 32, device: str = "cuda", seed: int = 0, **overrides):
    """A Llama-3-8B-shaped model in bf16 with random weights (``layers`` of them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**dict(LLAMA3_8B, num_hidden_layers=layers, **overrides))
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def quantize_linears(model, blocksize: int = 64, quant_type: str = "nf4") -> int:
    """Replace every ``nn.Linear`` of the decoder layers by a bnb ``Linear4bit`` holding the same
    weight quantized (nested statistics); the lm_head stays as it is. Returns how many."""
    import torch
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    count = 0
    for layer in model.model.layers:
        for parent in layer.modules():
            for name, child in list(parent.named_children()):
                if type(child) is not torch.nn.Linear:
                    continue
                w = child.weight.data
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=w.dtype, quant_type=quant_type, compress_statistics=True,
                                      device="meta")
                packed, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=True, quant_type=quant_type)
                q.weight = bnb.nn.Params4bit(packed, requires_grad=False, quant_state=qs, blocksize=blocksize,
                                             compress_statistics=True, quant_type=quant_type, bnb_quantized=True,
                                             module=q)
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, name, q)
                count += 1
                del child, w
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return count


def linear4bit_bytes(model) -> int:
    """The bytes a decode step must read for the model's ``Linear4bit`` layers: packed weights, the
    absmax (and, nested, its second-level absmax and code) and the biases."""
    import bitsandbytes as bnb

    total = 0
    for mod in model.modules():
        if not isinstance(mod, bnb.nn.Linear4bit):
            continue
        w, qs = mod.weight, mod.weight.quant_state
        total += w.numel() * w.element_size() + qs.absmax.numel() * qs.absmax.element_size()
        if qs.state2 is not None:
            total += qs.state2.absmax.numel() * qs.state2.absmax.element_size()
            total += qs.state2.code.numel() * qs.state2.code.element_size()
        if mod.bias is not None:
            total += mod.bias.numel() * mod.bias.element_size()
    return total


def read_ceiling_gbps(device=None) -> float:
    """GB/s of a read-only reduction of 512 MiB (the matmul family's ceiling), median of the one timing
    harness's repetitions."""
    from ..families.matmul import READ_BYTES, read_reduction
    from ..measure.timing import measure_interleaved

    us = measure_interleaved({"read": read_reduction(device or "cuda")}, time_cap_s=1.0)["read"].median
    return READ_BYTES / us / 1e3


@contextmanager
def free_4bit_linears():
    """Every bnb ``Linear4bit`` returns a zero tensor of its output's shape, made once per shape and
    dtype and shared (no kernel runs for it): the decode step without its 4-bit matmuls, a bound,
    never a result. Nothing may write into those tensors in place; a decoder's layers do not."""
    import torch
    import bitsandbytes as bnb

    zeros = {}
    cls = bnb.nn.Linear4bit
    forward = cls.forward

    def free(self, x):
        key = (*x.shape[:-1], self.out_features, x.dtype, x.device)
        y = zeros.get(key)
        if y is None:
            y = zeros[key] = torch.zeros(*x.shape[:-1], self.out_features, dtype=x.dtype, device=x.device)
        return y

    cls.forward = free
    try:
        yield
    finally:
        cls.forward = forward


@dataclass
class DecodeResult:
    variant: str
    batch: int
    step_ms: float
    step_ms_iqr: float
    tokens_per_s: float
    mode: str                    # "cuda graph" or what it fell back to
    matmul_calls: Optional[int] = None
    samples_ms: list = field(default_factory=list)


class _Decoder:
    """One decode step of ``model`` at ``batch`` with a static KV cache, replayable."""

    def __init__(self, model, batch: int, prompt_len: int, steps: int, seed: int = 0):
        import torch
        from transformers import StaticCache

        dev = next(model.parameters()).device
        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=prompt_len + steps + 16)
        g = torch.Generator(device=dev).manual_seed(seed)
        ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=g, device=dev)
        with torch.no_grad():
            out = model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                        cache_position=torch.arange(prompt_len, device=dev))
        self.tok = out.logits[:, -1:].argmax(-1)
        self.pos = torch.tensor([prompt_len], device=dev)
        self.prompt_len = prompt_len

    def step(self):
        import torch

        with torch.no_grad():
            return self.model(input_ids=self.tok, past_key_values=self.cache, use_cache=True,
                              cache_position=self.pos).logits


def decode_step_times(model, batch: int, prompt_len: int = 128, steps: int = 48, reps: int = 5,
                      seed: int = 0) -> tuple[list, str, object]:
    """Milliseconds per decode step (median of ``steps`` replays, ``reps`` times), the mode, and
    the logits of the first step (for comparisons)."""
    import torch

    dec = _Decoder(model, batch, prompt_len, steps * reps + 8, seed)
    first = dec.step().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):                       # warm-up: plans built, lazy inits done
            dec.step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = dec.step()
        mode = "cuda graph"
        run = graph.replay
    except Exception as e:     # said in the result, never silent: eager decode is host-bound
        torch.cuda.synchronize()
        mode = f"eager (CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:160]})"
        holder = {}

        def run():
            holder["logits"] = dec.step()

        run()
        logits = None
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(steps):
            run()
            out = logits if logits is not None else holder["logits"]
            dec.tok.copy_(out[:, -1:].argmax(-1))
            dec.pos.add_(1)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / steps)
    return times, mode, first


def _iqr(xs):
    if len(xs) < 4:
        return max(xs) - min(xs) if xs else 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


def decode_benchmark(batches=(1, 8), layers: int = 32, prompt_len: int = 128,
                     steps: int = 48, reps: int = 5, progress=None) -> dict:
    """tokens/s of a Llama-3-8B-shaped model in bf16, with bnb's 4-bit kernels and patched."""
    import torch

    from ..serve import stats
    from ..serve.patch import patch_bitsandbytes
    from ..serve.table import current_table

    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    model = build_model(layers)
    say(f"built a {layers}-layer Llama-3-8B-shaped model in {time.perf_counter() - t0:.0f} s")
    results = []

    def record(variant, b, times, mode, calls=None, why=""):
        m = statistics.median(times)
        results.append(DecodeResult(variant, b, m, _iqr(times), b * 1000.0 / m, mode, calls, samples_ms=times))
        say(f"{variant} batch {b}{why}: {m:.3f} ms/step"
            + (f" ({calls} fused matmul calls outside the graph replays)" if calls is not None else ""))

    for b in batches:
        times, mode, _ = decode_step_times(model, b, prompt_len, steps, reps)
        record("bf16", b, times, mode)
    n = quantize_linears(model)
    w4 = linear4bit_bytes(model)
    ceiling = read_ceiling_gbps()
    say(f"quantized {n} linear layers (nf4, nested, blocksize 64; lm_head bf16): {w4 / 1e9:.3f} GB; "
        f"read ceiling {ceiling:.0f} GB/s")
    agreement = {}
    for b in batches:
        times, mode, bnb_first = decode_step_times(model, b, prompt_len, steps, reps)
        record("bnb", b, times, mode)
        with patch_bitsandbytes():
            c0 = stats()["matmul_calls"]
            times, mode, ours_first = decode_step_times(model, b, prompt_len, steps, reps)
            calls = stats()["matmul_calls"] - c0
        record("patched", b, times, mode, calls)
        diff = (ours_first.float() - bnb_first.float()).abs()
        agreement[b] = dict(max_abs_logit_diff=float(diff.max()), mean_abs_logit_diff=float(diff.mean()),
                            same_argmax=float((ours_first.argmax(-1) == bnb_first.argmax(-1)).float().mean()))
        with free_4bit_linears():
            times, mode, _ = decode_step_times(model, b, prompt_len, steps, reps)
        record("no-4bit", b, times, mode, why=" (every Linear4bit free: a bound)")
    del model
    torch.cuda.empty_cache()
    return dict(layers=layers, prompt_len=prompt_len, results=[asdict(r) for r in results], agreement=agreement,
                table=current_table().origin, linear4bit_bytes=w4, read_ceiling_gbps=ceiling)


def format_decode(d: dict) -> str:
    by = {(r["variant"], r["batch"]): r for r in d["results"]}
    lines = [f"Llama-3-8B-shaped decode, {d['layers']} layers, prompt {d['prompt_len']}, static KV cache, CUDA graphs",
             f"{'batch':>5} {'variant':<8} {'ms/step':>9} {'IQR':>7} {'tokens/s':>9} {'x bnb':>6} {'x bf16':>6}  mode"]
    for (variant, b), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        xb = by[("bnb", b)]["step_ms"] / r["step_ms"] if ("bnb", b) in by else float("nan")
        xf = by[("bf16", b)]["step_ms"] / r["step_ms"] if ("bf16", b) in by else float("nan")
        lines.append(f"{b:>5} {variant:<8} {r['step_ms']:>9.3f} {r['step_ms_iqr']:>7.3f} {r['tokens_per_s']:>9.1f} "
                     f"{xb:>6.2f} {xf:>6.2f}  {r['mode']}")
    for b in sorted({b for _, b in by}):
        if ("bnb", b) in by and ("no-4bit", b) in by:
            rest, bnb_ms = by[("no-4bit", b)]["step_ms"], by[("bnb", b)]["step_ms"]
            line = (f"batch {b}: the step without its 4-bit matmuls takes {rest:.3f} ms, so no kernel for them can "
                    f"make the decode more than {bnb_ms / rest:.2f}x bnb")
            if ("patched", b) in by:
                ours = by[("patched", b)]["step_ms"] - rest
                line += (f"; their time: bnb {bnb_ms - rest:.3f} ms, patched {ours:.3f} ms "
                         f"({(bnb_ms - rest) / ours:.2f}x)" if ours > 0 else "")
            if d.get("linear4bit_bytes") and d.get("read_ceiling_gbps"):
                floor = d["linear4bit_bytes"] / d["read_ceiling_gbps"] / 1e6       # ms
                line += (f"; their {d['linear4bit_bytes'] / 1e9:.2f} GB at the read ceiling "
                         f"({d['read_ceiling_gbps']:.0f} GB/s) take {floor:.3f} ms, so at most "
                         f"{bnb_ms / (rest + floor):.2f}x bnb")
            lines.append(line)
    for b, a in d["agreement"].items():
        lines.append(f"batch {b}: patched vs bnb logits: max |diff| {a['max_abs_logit_diff']:.4g}, "
                     f"mean {a['mean_abs_logit_diff']:.3g}, same argmax {100 * a['same_argmax']:.1f}%")
    return "\n".join(lines)
