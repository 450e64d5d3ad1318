import json
import os
import subprocess
import sys

import pytest

from nf4tune import cli
from nf4tune.families import DEQUANT
from nf4tune.kernel.gpu import gpu_available


def test_help_lists_subcommands_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for sub in ("space", "compile", "bench", "search", "best", "export", "regress", "report"):
        assert sub in out
    assert "exit codes:" in out and "130" in out


@pytest.mark.parametrize("sub", ["space", "compile", "bench", "search", "best", "export", "regress", "report"])
def test_every_subcommand_help_renders_without_format_codes(sub, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([sub, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "%%" not in out and "exit codes:" in out


def test_version(capsys):
    from nf4tune import __version__

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"nf4-tune {__version__}"


def test_console_script_is_installed():
    r = subprocess.run([sys.executable, "-m", "nf4tune.cli", "space", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["size"] == DEQUANT.space_size()
    assert set(data["presets"]) == {"blog", "bnb-like"}


def test_space_prints_knobs_and_count(capsys):
    assert cli.main(["space", "--dtype", "bf16", "--quant", "nf4"]) == 0
    out = capsys.readouterr().out
    assert f"configurations: {DEQUANT.space_size(dtype=['bf16'], quant=['nf4'])}" in out
    assert "lut" in out and "constraints" in out


def test_space_counts_the_matmul_family_from_its_declaration(capsys):
    """`space --family matmul` prints counts computed from the declaration (not enumerated): the default
    space's and, for reference, the whole space's; experimental values are starred; --experimental counts the
    whole space; each constraint prints its own help; --json carries the same numbers."""
    from nf4tune.families import MATMUL

    assert cli.main(["space", "--family", "matmul"]) == 0
    out = capsys.readouterr().out
    default, whole = MATMUL.count(), MATMUL.count(experimental=True)
    assert f"configurations: {default.configs}\n" in out and f"distinct CUDA sources: {default.sources}\n" in out
    assert f"with --experimental: {whole.configs} configurations, {whole.sources} distinct CUDA sources" in out
    assert "mma*" in out and "bulk*" in out and "(mma, warps): warps 12, 14, 16: SIMT, mma-rows and mma-cols only" in out
    assert "matmul/mma_rows.cu" in out
    assert cli.main(["space", "--family", "matmul", "--experimental", "--dtype", "bf16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["experimental"] and d["count"]["exact"] and "whole_space" not in d
    assert (d["size"], d["distinct_sources"]) == (MATMUL.space_size(experimental=True, dtype=["bf16"]),
                                                 MATMUL.count(experimental=True, dtype=["bf16"]).sources)
    assert d["knobs"]["mma"]["experimental"] == ["mma"] and d["knobs"]["load_bytes"]["macro"] == "NF4T_LOAD_BYTES"
    assert {"knobs": ["mma", "warps"], "help": "warps 12, 14, 16: SIMT, mma-rows and mma-cols only."} in d["constraints"]


def test_compile_takes_experimental_values_when_asked(tmp_path, capsys):
    """The tensor-core path `mma` is experimental (so is its every-value scale): compile leaves it out of the
    default space and compiles it with --experimental."""
    argv = ["compile", "--family", "matmul", "--arch", "sm_90", "--dtype", "bf16", "--quant", "nf4", "--cache",
            str(tmp_path), "--quiet", "--sweep", "mma=mma", "--sweep", "rows_per_warp=16", "--sweep", "mtile=8",
            "--sweep", "m=8", "--sweep", "lut=shared", "--sweep", "astage=global", "--sweep", "pdl=0"]
    assert cli.main(argv) == 2
    assert "no valid config is left" in capsys.readouterr().err
    assert cli.main(argv + ["--experimental", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["space"]["experimental"] and out["space"]["exact"]
    assert out["sources"] == out["compiled"] == out["space"]["sources"] == 2 and out["failures"] == []   # wload


def test_no_command_prints_help_and_is_a_usage_error(capsys):
    assert cli.main([]) == 2


def test_pdl_is_an_option_of_generate_only(capsys):
    """bench --pdl without --generate would be ignored: it is a usage error that says so (before any GPU check)."""
    assert cli.main(["bench", "--pdl"]) == 2
    assert "--pdl is an option of --generate" in capsys.readouterr().err


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU message")
def test_bench_without_gpu_says_so_and_exits_2(capsys):
    assert cli.main(["bench", "--shape", "64x64"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err


def test_bad_input_is_one_line_and_exit_2_before_any_gpu_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:           # argparse: the shape type
        cli.main(["bench", "--shape", "12xq"])
    assert e.value.code == 2 and "not ROWSxCOLS" in capsys.readouterr().err
    cases = [
        (["bench", "--shape", "64x64", "--config", '{"lut": "texture"}'], "lut"),
        (["bench", "--shape", "64x64", "--config", "{"], "--config '{' is not valid JSON"),
        (["bench", "--shape", "64x64", "--config", "@" + str(tmp_path / "nope.json")], "cannot read"),
        (["bench", "--shape", "64x64", "--sweep", "threads=96"], "threads=96 is not one of"),
        (["bench", "--shape", "64x64", "--sweep", "warps=2"], "unknown knob"),
        (["bench", "--shape", "64x64", "--m", "8"], "--m is for the matmul family"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)


def test_config_from_a_file(tmp_path, capsys, monkeypatch):
    from nf4tune.cli.bench import candidates_from_args

    f = tmp_path / "c.json"
    f.write_text(json.dumps({"threads": 128, "unroll": 4}))
    args = cli.build_parser().parse_args(["bench", "--shape", "64x64", "--config", f"@{f}"])
    (label, c), = candidates_from_args(args, DEQUANT, dict(dtype="bf16", quant="nf4"))
    assert c.threads == 128 and c.unroll == 4


def test_argument_checks(tmp_path, capsys):
    for argv in (["compile", "--workers", "0"], ["compile", "--workers", "-3"], ["best", "--shape", "64x64",
                                                                              "--blocksize", "65"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    capsys.readouterr()
    f = tmp_path / "afile"
    f.write_text("x")
    assert cli.main(["compile", "--arch", "sm_90", "--cache", str(f)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert cli.main(["compile", "--arch", "sm_70"]) == 2
    assert "unsupported arch" in capsys.readouterr().err
    assert cli.main(["compile", "--arch", "sm_90", "--sweep", "bogus=1"]) == 2
    assert "no knob 'bogus'" in capsys.readouterr().err
    assert cli.main(["compile", "--family", "matmul", "--arch", "sm_90", "--sweep", "mma=mma-ks",
                     "--sweep", "mtile=1"]) == 2
    assert "no valid config is left" in capsys.readouterr().err


def test_compile_sweep_compiles_only_the_restricted_space(tmp_path, capsys):
    argv = ["compile", "--arch", "sm_90", "--dtype", "bf16", "--quant", "nf4", "--cache", str(tmp_path), "--quiet",
            "--sweep", "threads=128", "--sweep", "bytes_per_thread=4", "--sweep", "unroll=4",
            "--sweep", "lut=shared", "--sweep", "index=hoisted"]
    assert cli.main(argv) == 0
    n = DEQUANT.space_size(dtype=["bf16"], quant=["nf4"], threads=[128], bytes_per_thread=[4], unroll=[4],
                           lut=["shared"], index=["hoisted"])
    out = capsys.readouterr().out
    assert f"{n} configurations" in out and 0 < n < 100 and "failures 0" in out
    if not gpu_available():
        assert cli.main(["compile"]) == 2
        assert "pass --arch" in capsys.readouterr().err


def test_compile_cover_compiles_a_covering_sample_and_says_so(tmp_path, capsys):
    argv = ["compile", "--arch", "sm_90", "--dtype", "bf16", "--quant", "nf4", "--cache", str(tmp_path), "--quiet",
            "--sweep", "threads=128", "--sweep", "unroll=4", "--cover", "2", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    configs = list(DEQUANT.iter_space(dtype=["bf16"], quant=["nf4"], threads=[128], unroll=[4]))
    sources = len(DEQUANT.distinct_sources(configs))
    assert out["cover"] == dict(strength=2, space_configs=len(configs), space_sources=sources)
    assert out["sources"] == len(DEQUANT.covering_sources(configs, 2)) < sources
    assert out["compiled"] == out["sources"] and out["failures"] == []
    with pytest.raises(SystemExit) as e:
        cli.main(["compile", "--arch", "sm_90", "--cover", "0"])
    assert e.value.code == 2 and "--cover: 0 must be at least 1" in capsys.readouterr().err


def test_compile_served_prints_registers_spills_and_bytes_of_w_per_instruction(tmp_path, capsys):
    """`compile --served` compiles the serving table's configs (here a table of today's served H100 M = 1 config,
    mma-cols' M = 1 config and a dequant config) and prints each one's registers, spills and, for matmul, the
    bytes of W per warp-instruction of its steady-state loop; mma-cols' is the larger. --table goes with
    --served, which takes no space options."""
    from nf4tune.families import MATMUL

    served = MATMUL.config(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, ksplit=4, lut="pairx",
                           astage="shared", unroll=2, prefetch=1, span=2, m=1)
    cols = MATMUL.config(mma="mma-cols", lut="pairx", astage="shared", rows_per_warp=16, mtile=1, warps=8,
                         prefetch=1, m=1)
    entry = dict(gpu="NVIDIA H100 80GB HBM3", family="matmul", shape=[8192, 8192], dtype="bf16", quant="nf4",
                 blocksize=64, m=1, median_us=30.0, speedup_vs_bnb=1.5)
    table = tmp_path / "t.json"
    table.write_text(json.dumps(dict(format=2, entries=[
        dict(entry, config=served.to_dict()), dict(entry, gpu="GPU X", config=cols.to_dict()),
        dict(entry, family="dequant", m=None, shape=[4096, 4096], config=DEQUANT.preset("blog", dtype="bf16",
                                                                                         quant="nf4").to_dict())])))
    argv = ["compile", "--served", "--table", str(table), "--arch", "sm_90", "--cache", str(tmp_path / "c"), "--quiet"]
    assert cli.main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in out["configs"]}
    assert out["arch"] == "sm_90" and out["failures"] == 0 and len(rows) == 3
    s, c = rows[served.short()], rows[cols.short()]
    assert c["bytes_per_instruction"] >= 9 and c["bytes_per_instruction"] > s["bytes_per_instruction"] > 0
    assert s["served_for"] == "H100 80GB HBM3: 8192x8192" and s["registers"] > 0 and s["spill_stores"] == 0
    assert s["loop"]["w_bytes_per_lane"] == 64 and c["loop"]["hmma"] == 64
    assert [r.get("bytes_per_instruction") for r in out["configs"] if r["family"] == "dequant"] == [None]
    assert cli.main(argv + ["--family", "matmul"]) == 0
    text = capsys.readouterr().out
    assert "B/instr" in text and f"{c['bytes_per_instruction']:.2f}" in text and "dequant" not in text.split("\n", 2)[2]
    assert cli.main(argv + ["--cover", "2"]) == 2
    assert "--served compiles the serving table's configs: --cover" in capsys.readouterr().err
    assert cli.main(["compile", "--table", str(table), "--arch", "sm_90"]) == 2
    assert "--table goes with --served" in capsys.readouterr().err


def _h200_copy(tmp_path):
    from pathlib import Path

    from conftest import example_db

    return Path(example_db("h200-search", tmp_path))


def test_best_and_export_read_the_committed_h200_database_without_changing_it(tmp_path, capsys):
    db = _h200_copy(tmp_path)
    before = db.read_bytes()
    assert cli.main(["best", "--shape", "16384x16384", "--db", str(db)]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["gpu"] == "NVIDIA H200" and best["config"]["lut"] in ("shared", "register")
    assert 100 < best["median_us"] < 400 and best["speedup_vs_bnb"] > 1
    out = tmp_path / "configs.json"
    assert cli.main(["export", "--db", str(db), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["format"] == 2
    assert {tuple(e["shape"]) for e in data["entries"]} >= {(4096, 4096), (8192, 8192), (16384, 16384)}
    assert {e["family"] for e in data["entries"]} == {"dequant"}
    assert cli.main(["best", "--shape", "1234x5678", "--db", str(db)]) == 2
    assert "no valid measurement" in capsys.readouterr().err
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configs.json", "h200-search.db"]


def test_read_only_commands_never_create_a_database(tmp_path, capsys):
    missing = tmp_path / "serch.db"
    out = tmp_path / "c.json"
    for argv in (["best", "--shape", "64x64"], ["export", "-o", str(out)], ["report", "-o", str(tmp_path / "site")]):
        assert cli.main(argv + ["--db", str(missing)]) == 2
        err = capsys.readouterr().err
        assert "no database at" in err and str(missing) in err
    empty = tmp_path / "zero.db"
    empty.write_bytes(b"")
    assert cli.main(["best", "--shape", "64x64", "--db", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zero.db"] and empty.read_bytes() == b""


def test_export_refuses_what_is_not_a_regular_file(tmp_path, capsys):
    db = _h200_copy(tmp_path)
    (tmp_path / "adir").mkdir()
    afile = tmp_path / "afile"
    afile.write_text("keep")
    cases = [(str(tmp_path / "adir"), "folder"), (str(afile / "x.json"), "not a folder"),
             ("/dev/null", "not a regular file")]
    for target, message in cases:
        assert cli.main(["export", "--db", str(db), "-o", target]) == 2, target
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert afile.read_text() == "keep"
    # a symlink is followed to its regular file, and stays a symlink
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    os.symlink(target, link)
    assert cli.main(["export", "--db", str(db), "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(target.read_text())["format"] == 2
    dangling = tmp_path / "dangling.json"
    os.symlink(tmp_path / "adir", dangling)
    assert cli.main(["export", "--db", str(db), "-o", str(dangling)]) == 2
    assert cli.main(["report", "--db", str(db), "-o", str(afile)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_export_of_an_empty_database_fails_and_writes_nothing(tmp_path, capsys):
    from nf4tune.db import Repository, connect

    Repository(connect(str(tmp_path / "empty.db")))
    out = tmp_path / "c.json"
    assert cli.main(["export", "--db", str(tmp_path / "empty.db"), "-o", str(out)]) == 2
    assert not out.exists()


def test_export_over_a_table_replaces_only_the_problems_the_database_holds(tmp_path, capsys):
    from nf4tune.serve.table import PACKAGED_TABLE, ConfigTable, entry_key

    db = _h200_copy(tmp_path)
    base = json.loads(PACKAGED_TABLE.read_text())
    out = tmp_path / "table.json"
    assert cli.main(["export", "--db", str(db), "-o", str(out)]) == 0
    fresh = json.loads(out.read_text())["entries"]
    out.write_text(PACKAGED_TABLE.read_text())
    assert cli.main(["export", "--db", str(db), "--over", str(out), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    merged = json.loads(out.read_text())["entries"]

    key = entry_key

    replaced = {key(e) for e in fresh} & {key(e) for e in base["entries"]}
    assert replaced and f"{len(replaced)} of its {len(base['entries'])} entries replaced" in said
    assert len(merged) == len({key(e) for e in merged}) == len({key(e) for e in fresh} | {key(e) for e in base["entries"]})
    by_key = {key(e): e for e in merged}
    for e in fresh:                       # the database wins where both hold a problem
        assert by_key[key(e)]["config"] == e["config"] and by_key[key(e)]["median_us"] == e["median_us"]
    for e in base["entries"]:             # the rest of the table is kept as it was
        if key(e) not in replaced:
            assert by_key[key(e)] == e
    ConfigTable.from_file(out)            # the runtime reads it
    # a base that is no table is refused before anything is written
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert cli.main(["export", "--db", str(db), "--over", str(bad), "-o", str(tmp_path / "x.json")]) == 2
    assert "--over" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    assert cli.main(["export", "--db", str(db), "--over", str(db), "-o", str(tmp_path / "x.json")]) == 2
    assert "database" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_export_of_the_default_space_leaves_experimental_winners_out(tmp_path, capsys):
    """The H100 screens hold an mma-cols winner with wload=plain (experimental) 0.2% ahead of its wload=stream
    twin: --default-space exports the twin, every exported config is of the default space, and each is the
    fastest such config stored for its problem."""
    from conftest import example_db

    from nf4tune.db import Repository, connect
    from nf4tune.families import get

    db = example_db("h100-screens", tmp_path)
    before = open(db, "rb").read()
    out_all, out_default = tmp_path / "all.json", tmp_path / "default.json"
    assert cli.main(["export", "--db", db, "-o", str(out_all)]) == 0
    assert cli.main(["export", "--db", db, "--default-space", "-o", str(out_default)]) == 0
    every = {(tuple(e["shape"]), e["family"], e["dtype"], e["m"]): e for e in json.loads(out_all.read_text())["entries"]}
    default = {(tuple(e["shape"]), e["family"], e["dtype"], e["m"]): e
               for e in json.loads(out_default.read_text())["entries"]}
    assert any(get(e["family"]).from_dict(e["config"]).experimental() for e in every.values())
    assert not any(get(e["family"]).from_dict(e["config"]).experimental() for e in default.values())
    winner, twin = every[((4096, 14336), "matmul", "bf16", 8)], default[((4096, 14336), "matmul", "bf16", 8)]
    assert winner["config"]["wload"] == "plain" and twin["config"]["wload"] == "stream"
    assert twin["config"]["mma"] == "mma-cols" and winner["median_us"] <= twin["median_us"] <= 1.01 * winner["median_us"]
    repo = Repository(connect(db))
    for g, prob in repo.problems():
        key = (prob.shape, prob.family, prob.dtype, prob.m)
        family = get(prob.family)
        fastest = min((m.median_us for m, knobs in _stored(repo, g, prob)
                       if not family.from_dict(knobs).experimental()), default=None)
        assert (key in default) == (fastest is not None)
        if fastest is not None:
            assert default[key]["median_us"] == fastest
    assert open(db, "rb").read() == before


def _stored(repo, gpu, prob):
    """(measurement, knobs) of every valid config stored for a problem."""
    from sqlalchemy import select

    from nf4tune.db._models import GPU, KernelConfigRow, Measurement, Run
    from nf4tune.db._repository import _where_problem

    with repo.db.session() as s:
        stmt = (select(Measurement, KernelConfigRow.knobs).join(Run, Measurement.run_id == Run.id)
                .join(GPU, Run.gpu_id == GPU.id).join(KernelConfigRow, Measurement.config_id == KernelConfigRow.id)
                .where(Measurement.status == "ok", GPU.name == gpu))
        return [(m, json.loads(k)) for m, k in s.execute(_where_problem(stmt, Measurement, prob))]
