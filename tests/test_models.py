"""Whole models: the distinct 4-bit weight shapes of a Hugging Face config, per tensor-parallel
degree (nf4tune.tune.models), on the configs committed under examples/models/."""

import json
from pathlib import Path

import pytest

from nf4tune.tune.models import ModelError, load_config, model_shapes, shapes_from_config, shapes_of_models

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"


def shapes(name, tp=1):
    return model_shapes(MODELS / name, tp).shape_tuples()


def layers(name, tp=1):
    return {s.shape: s.layers for s in model_shapes(MODELS / name, tp).shapes}


def test_llama_3_8b():
    assert shapes("llama-3-8b.json") == [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]
    assert layers("llama-3-8b.json") == {(4096, 4096): ("q_proj", "o_proj"), (1024, 4096): ("k_proj", "v_proj"),
                                         (14336, 4096): ("gate_proj", "up_proj"), (4096, 14336): ("down_proj",)}


def test_mistral_7b_has_llama_3_8b_shapes():
    assert shapes("mistral-7b-v0.1.json") == shapes("llama-3-8b.json")


def test_qwen2_7b():
    assert shapes("qwen2-7b.json") == [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)]


def test_qwen3_takes_head_dim_from_the_config():
    # head_dim 128 while hidden_size / heads = 80: q is 32 x 128 = 4096 rows and o has 4096 columns
    assert shapes("qwen3-4b.json") == [(4096, 2560), (1024, 2560), (2560, 4096), (9728, 2560), (2560, 9728)]
    config = load_config(MODELS / "qwen3-4b.json")
    del config["head_dim"]
    assert shapes_from_config(config).shape_tuples()[0] == (2560, 2560)


def test_mixtral_8x7b_experts_and_router():
    m = model_shapes(MODELS / "mixtral-8x7b-v0.1.json")
    assert m.shape_tuples() == [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (8, 4096)]
    got = {s.shape: s.layers for s in m.shapes}
    assert got[(14336, 4096)] == ("experts.w1", "experts.w3") and got[(8, 4096)] == ("router gate",)
    assert any("8 experts" in n for n in m.notes)


def test_tensor_parallel_splits_columns_and_rows():
    assert shapes("llama-3-8b.json", tp=2) == [(2048, 4096), (512, 4096), (4096, 2048), (7168, 4096), (4096, 7168)]
    assert shapes("llama-3-8b.json", tp=4) == [(1024, 4096), (256, 4096), (4096, 1024), (3584, 4096), (4096, 3584)]
    assert layers("llama-3-8b.json", tp=4)[(1024, 4096)] == ("q_proj",)
    assert shapes("qwen2-7b.json", tp=2) == [(1792, 3584), (256, 3584), (3584, 1792), (9472, 3584), (3584, 9472)]
    assert shapes("qwen2-7b.json", tp=4) == [(896, 3584), (128, 3584), (3584, 896), (4736, 3584), (3584, 4736)]
    # the router is replicated, the experts split
    assert shapes("mixtral-8x7b-v0.1.json", tp=4)[-1] == (8, 4096)
    assert (3584, 4096) in shapes("mixtral-8x7b-v0.1.json", tp=4)


def test_more_gpus_than_key_value_heads_replicates_them():
    m = model_shapes(MODELS / "llama-3-8b.json", tp=16)       # 8 kv heads, 32 heads
    assert m.shape_tuples()[:2] == [(256, 4096), (128, 4096)]  # q: 2 heads; k, v: one head of 128
    assert any("replicated 2x" in n for n in m.notes)


def test_a_tensor_parallel_degree_that_does_not_divide_is_refused():
    with pytest.raises(ModelError, match="tensor parallel 8 does not divide num_attention_heads \\(28\\)"):
        model_shapes(MODELS / "qwen2-7b.json", tp=8)
    with pytest.raises(ModelError, match="tensor parallel 3"):
        model_shapes(MODELS / "llama-3-8b.json", tp=3)
    config = dict(load_config(MODELS / "llama-3-8b.json"), num_key_value_heads=6, num_attention_heads=24,
                  hidden_size=3072)
    with pytest.raises(ModelError, match="num_key_value_heads"):
        shapes_from_config(config, tp=4)
    with pytest.raises(ModelError, match="--tp 0"):
        shapes_from_config(config, tp=0)


def test_lm_head_is_excluded_and_said_so():
    m = model_shapes(MODELS / "llama-3-8b.json")
    assert (128256, 4096) not in m.shape_tuples()
    text = m.describe()
    assert "lm_head [128256 x 4096] stays unquantized in QLoRA" in text and "14336x4096" in text


def test_missing_kv_heads_means_no_grouped_query_attention():
    config = load_config(MODELS / "llama-3-8b.json")
    del config["num_key_value_heads"]
    assert shapes_from_config(config).shape_tuples()[:2] == [(4096, 4096), (14336, 4096)]


def test_model_type_from_architectures_when_absent():
    config = load_config(MODELS / "mistral-7b-v0.1.json")
    del config["model_type"]
    assert shapes_from_config(config).model_type == "mistral"


def test_several_models_deduplicate():
    got, models = shapes_of_models([MODELS / "llama-3-8b.json", MODELS / "mistral-7b-v0.1.json",
                                    MODELS / "mixtral-8x7b-v0.1.json"])
    assert got == [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (8, 4096)] and len(models) == 3


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"model_type": "gpt2", "n_embd": 768}), "model_type 'gpt2' is not a supported architecture"),
    (json.dumps({"hidden_size": 4096}), "no model_type is not a supported"),
    (json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}),
     "missing field 'intermediate_size'"),
    (json.dumps({"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
                 "intermediate_size": 14336}), "missing field 'num_local_experts'"),
    (json.dumps({"model_type": "llama", "hidden_size": "4096", "num_attention_heads": 32,
                 "intermediate_size": 14336}), "hidden_size = '4096' is not a positive whole number"),
    (json.dumps({"model_type": "llama", "hidden_size": 4100, "num_attention_heads": 32,
                 "intermediate_size": 14336}), "not a multiple of num_attention_heads"),
])
def test_bad_configs_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ModelError, match=message) as e:
        model_shapes(path)
    assert "\n" not in str(e.value)
    assert str(path) in str(e.value) or "--model" in str(e.value)


# -- the command line ------------------------------------------------------------------------
def _problems(argv):
    from nf4tune import cli
    from nf4tune.cli._common import problems_from_args

    return problems_from_args(cli.build_parser().parse_args(argv))


def test_search_and_bench_take_models_and_shapes_together():
    llama = str(MODELS / "llama-3-8b.json")
    got = _problems(["search", "--model", llama, "--shape", "4096x4096", "--shape", "512x512", "--dtype", "bf16",
                     "--dtype", "fp16"])
    shapes = list(dict.fromkeys(p.shape for p in got))
    assert shapes == [(4096, 4096), (512, 512), (1024, 4096), (14336, 4096), (4096, 14336)]   # each once
    assert len(got) == 10 and {p.dtype for p in got} == {"bf16", "fp16"}
    got = _problems(["bench", "--model", llama, "--model", str(MODELS / "qwen2-7b.json"), "--tp", "2"])
    assert [p.shape for p in got] == [(2048, 4096), (512, 4096), (4096, 2048), (7168, 4096), (4096, 7168),
                                      (1792, 3584), (256, 3584), (3584, 1792), (9472, 3584), (3584, 9472)]


@pytest.mark.parametrize("sub", ["search", "bench"])
def test_bad_model_input_is_one_line_and_exit_2_before_any_work(sub, tmp_path, capsys):
    from nf4tune import cli

    notjson = tmp_path / "config.json"
    notjson.write_text("model_type: llama")
    unknown = tmp_path / "gpt2.json"
    unknown.write_text(json.dumps({"model_type": "gpt2"}))
    db = tmp_path / "never.db"
    cases = [
        (["--model", str(tmp_path / "missing.json")], "no such file"),
        (["--model", str(notjson)], "not JSON"),
        (["--model", str(unknown)], "not a supported architecture (supported: llama, mistral, qwen2, qwen3, mixtral)"),
        (["--model", str(MODELS / "qwen2-7b.json"), "--tp", "8"], "does not divide num_attention_heads (28)"),
        (["--shape", "64x64", "--tp", "2"], "--tp 2 splits the shapes of a --model"),
    ]
    for extra, message in cases:
        assert cli.main([sub, *extra, "--db", str(db)]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "error:" in err, (extra, err)
    with pytest.raises(SystemExit) as e:
        cli.main([sub, "--model", str(MODELS / "llama-3-8b.json"), "--tp", "0"])
    assert e.value.code == 2
    capsys.readouterr()
    assert not db.exists()


def test_search_needs_a_shape_or_a_model(capsys):
    from nf4tune import cli

    assert cli.main(["search"]) == 2
    assert "give at least one --shape or --model" in capsys.readouterr().err


def test_search_checks_the_heartbeat_settings_first(monkeypatch, capsys):
    from nf4tune import cli

    monkeypatch.setenv("NF4TUNE_GRACE_S", "1")
    monkeypatch.setenv("NF4TUNE_HEARTBEAT_S", "5")
    assert cli.main(["search", "--shape", "64x64"]) == 2
    assert "must be longer than the heartbeat interval" in capsys.readouterr().err
