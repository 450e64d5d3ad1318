import json
import subprocess
import sys

import pytest

from tuner import cli
from tuner.gpu import gpu_available


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for sub in ("space", "compile", "bench"):
        assert sub in out


def test_console_script_is_installed():
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "space", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    from tuner.space import space_size
    assert data["size"] == space_size()
    assert set(data["presets"]) == {"blog", "bnb-like"}


def test_space_prints_knobs_and_count(capsys):
    assert cli.main(["space", "--dtype", "bf16", "--quant", "nf4"]) == 0
    out = capsys.readouterr().out
    from tuner.space import space_size
    assert f"configurations: {space_size(['bf16'], ['nf4'])}" in out
    assert "lut" in out and "constraints" in out


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 1


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU message")
def test_bench_without_gpu_says_so_and_exits_2(capsys):
    assert cli.main(["bench", "--shape", "64x64"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err


def test_bad_shape_and_bad_config_exit_1(capsys):
    assert cli.main(["bench", "--shape", "12xq"]) == 1
    assert "not ROWSxCOLS" in capsys.readouterr().err
    assert cli.main(["bench", "--shape", "64x64", "--config", '{"lut": "texture"}']) == 1
    assert "lut" in capsys.readouterr().err


def test_compile_refuses_unknown_arch():
    with pytest.raises(SystemExit) as e:
        cli.main(["compile", "--arch", "sm_75"])
    assert e.value.code == 2


def test_best_and_export_read_the_committed_h200_database(tmp_path, capsys):
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "examples" / "h200" / "search.db"
    db = tmp_path / "h200.db"
    shutil.copy(src, db)          # connect() may upgrade in place: work on a copy
    assert cli.main(["best", "--shape", "16384x16384", "--db", str(db)]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["gpu"] == "NVIDIA H200" and best["config"]["lut"] in ("shared", "register")
    assert 100 < best["median_us"] < 400 and best["speedup_vs_bnb"] > 1
    out = tmp_path / "configs.json"
    assert cli.main(["export", "--db", str(db), "-o", str(out)]) == 0
    entries = json.loads(out.read_text())["entries"]
    assert {tuple(e["shape"]) for e in entries} >= {(4096, 4096), (8192, 8192), (16384, 16384)}
    assert cli.main(["best", "--shape", "1234x5678", "--db", str(db)]) == 1
    assert "no valid measurement" in capsys.readouterr().err


def test_export_of_an_empty_database_fails_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert cli.main(["export", "--db", str(tmp_path / "empty.db"), "-o", str(out)]) == 1
    assert not out.exists()
