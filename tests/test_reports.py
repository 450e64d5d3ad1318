"""The static report, built from the committed H200 database."""

import re
import shutil
from pathlib import Path

from tuner import cli

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200" / "search.db"


def test_report_is_static_offline_and_shows_every_problem(tmp_path, capsys):
    db = tmp_path / "h200.db"
    shutil.copy(EXAMPLE, db)
    before = db.read_bytes()
    out = tmp_path / "site"
    assert cli.main(["report", "--db", str(db), "-o", str(out)]) == 0
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["h200.db", "site"]
    page = (out / "index.html").read_text()
    assert (out / "plotly.min.js").stat().st_size > 1_000_000
    # offline: the only script is the local plotly.min.js
    assert re.findall(r"<script src='([^']+)'", page) == ["plotly.min.js"]
    assert "https://cdn" not in page
    for shape in ("4096x4096", "4096x14336", "14336x4096", "8192x8192", "8192x28672", "16384x16384"):
        for dtype in ("bf16", "fp16"):
            assert f"{shape} {dtype} nf4 bs64" in page
    assert page.count("class='flag-ok'") == 12
    for div in ("history-0", "study-0", "study-11", "parcoords-0", "importance-0", "knob-heatmap"):
        assert f'id="{div}"' in page
    assert "NVIDIA H200" in page and "0.50.2" in page     # environment table


def test_report_of_an_empty_database_still_renders(tmp_path):
    from db import Repository, connect

    Repository(connect(str(tmp_path / "e.db")))
    assert cli.main(["report", "--db", str(tmp_path / "e.db"), "-o", str(tmp_path / "s")]) == 0
    assert "nf4-tune report" in (tmp_path / "s" / "index.html").read_text()
