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
