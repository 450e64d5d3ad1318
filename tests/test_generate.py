"""`nf4-tune bench --generate` on the CPU with a tiny Llama: the eager generate loop and its per-step times,
interleaved rounds with the first discarded, and the printed table (the CUDA-graph half needs a GPU)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from nf4tune.bench import generate as G  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=512)


def test_the_eager_loop_times_every_decode_step_after_the_first_few():
    cfg = dict(G.load_model_config(None, 2), **TINY)
    model = G.build_from_config(cfg, device="cpu")
    ids = G._prompt(model, 2, 8)
    steps = G.eager_step_times(model, ids, 12, skip=4)
    assert len(steps) == 12 - 4 - 1 and all(ms > 0 for ms in steps)


def test_the_model_config_is_read_or_refused_in_one_line(tmp_path):
    assert G.load_model_config(None)["hidden_size"] == 4096
    cfg = G.load_model_config("examples/models/qwen2-7b.json", layers=2)
    assert cfg["num_hidden_layers"] == 2 and cfg["model_type"] == "qwen2"
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a Hugging Face config.json"):
        G.load_model_config(str(bad))
    with pytest.raises(ValueError, match="cannot read the model config"):
        G.load_model_config(str(tmp_path / "missing.json"))


def test_rounds_are_interleaved_the_first_discarded_and_the_table_printed(monkeypatch):
    """Every variant runs once a round, in rotating order; round 0 is not kept; the patched variant runs under
    the patch (bnb's own path on the CPU); the graph half is a double here."""
    ran = []
    real = G.eager_step_times

    def steps(model, ids, new_tokens, skip=4):
        import bitsandbytes as bnb

        patched = hasattr(bnb.matmul_4bit, "__wrapped__")
        quantized = any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
        ran.append("patched" if patched else "bnb" if quantized else "bf16")
        return real(model, ids, 6, skip=1)

    monkeypatch.setattr(G, "eager_step_times", steps)
    d = G.generate_benchmark(None, layers=1, batches=(1,), rounds=2, graph=False, prompt_len=4, device="cpu", **TINY)
    assert ran == ["bf16", "bnb", "patched", "bnb", "patched", "bf16", "patched", "bf16", "bnb"]
    eager = [r for r in d["results"] if r["mode"] == "eager"]
    assert [r["variant"] for r in eager] == ["bf16", "bnb", "patched"]
    assert all(len(r["rounds_ms"]) == 2 and r["tokens_per_s"] > 0 for r in eager)
    text = G.format_generate(d)
    assert "median of 2 interleaved rounds after a discarded one" in text
    row = next(line for line in text.splitlines() if " patched " in line)
    assert row.split()[:3] == ["1", "eager", "patched"]


def test_pdl_adds_a_graph_variant_served_with_programmatic_dependent_launch(monkeypatch):
    """With pdl, the graph half runs a fourth variant, patched+pdl: under the patch with the runtime's programmatic
    dependent launch on (and off again after it, for every other variant); its row is printed beside the others.
    The graph step is a double here (it needs a GPU)."""
    import contextlib

    import bitsandbytes as bnb

    from nf4tune.bench import decode as D
    from nf4tune.serve import matmul as served

    seen = []

    def step_times(model, batch, **kw):
        seen.append((hasattr(bnb.matmul_4bit, "__wrapped__"), served._pdl_override[0]))
        return [2.0, 2.2, 2.1], "cuda graph", torch.zeros(batch, 8)

    monkeypatch.setattr(D, "decode_step_times", step_times)
    monkeypatch.setattr(D, "free_4bit_linears", contextlib.nullcontext)
    monkeypatch.setattr(D, "read_ceiling_gbps", lambda: 3000.0)
    monkeypatch.setattr(G, "eager_step_times", lambda model, ids, new_tokens, skip=4: [1.0, 1.0])
    d = G.generate_benchmark(None, layers=1, batches=(1,), rounds=1, prompt_len=4, device="cpu", pdl=True, **TINY)
    # bf16, bnb, patched, patched+pdl, then the no-4bit bound
    assert seen == [(False, None), (False, None), (True, None), (True, True), (False, None)]
    assert served._pdl_override[0] is None
    graph = [r["variant"] for r in d["results"] if r["mode"] == "graph"]
    assert graph == ["bf16", "bnb", "patched", "patched+pdl", "no-4bit"]
    row = next(line for line in G.format_generate(d).splitlines() if "patched+pdl" in line)
    assert row.split()[:3] == ["1", "graph", "patched+pdl"]
