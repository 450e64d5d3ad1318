"""The static report without a browser: what it says of the H200 fixture databases, how it
escapes, what it writes beside index.html, and what it refuses."""

import csv
import json
import re
import shutil
from pathlib import Path

from nf4tune import cli

from conftest import example_db

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ("4096x4096", "4096x14336", "14336x4096", "8192x8192", "8192x28672", "16384x16384")


def _nightly(nightly_db):
    from nf4tune.db import Repository, connect
    from nf4tune.reports import collect

    return collect(Repository(connect(str(nightly_db), read_only=True)))


def test_report_is_static_offline_and_shows_every_problem(tmp_path):
    db = Path(example_db("h200-search", tmp_path))
    before = db.read_bytes()
    out = tmp_path / "site"
    assert cli.main(["report", "--db", str(db), "-o", str(out)]) == 0
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["h200-search.db", "site"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["index.html", "plotly.min.js"] + [f"{n}.{e}" for n in ("overview", "flags", "history") for e in ("csv", "json")])
    page = (out / "index.html").read_text()
    assert (out / "plotly.min.js").stat().st_size > 1_000_000
    # offline: no script from elsewhere; the page loads the plotly.min.js beside it
    assert "<script src" not in page and "https://" not in page and "s.src='plotly.min.js'" in page
    labels = [f"{shape} {dtype} nf4 bs64" for shape in SHAPES for dtype in ("bf16", "fp16")]
    rows = re.findall(r"<tr data-key='([^']+)' data-status='([^']+)'>", page)
    assert len(rows) == 12 and {s for _, s in rows} == {"not judged"}         # a search judges nothing
    # numeric order: 4096x4096 before 4096x14336 before 14336x4096 ...
    order = [next(lab for lab in labels if k.endswith(lab.replace(" ", "-").lower())) for k, _ in rows]
    assert [lab.split()[0] for lab in order[::2]] == list(SHAPES)
    assert "No nightly verdict in this database" in page
    # one search run per problem: single points are table rows, never one-point charts
    assert page.count("<tr class='problem'") == 12 and "id='hist-" not in page
    for div in ("study-trials", "study-parcoords", "study-importance", "knob-heatmap"):
        assert f"id='{div}'" in page
    assert "NVIDIA H200" in page and "0.50.2" in page     # environment table


def test_nightly_status_is_the_latest_night_and_a_noisy_reference_is_not_ok(nightly_db):
    data = _nightly(nightly_db)
    first = data.overview[0]
    assert (first["problem"], first["status"], first["night_run"]) == ("8192x8192 bf16 nf4 bs64", "regression", 17)
    # the best ever is the planted fake, in its own column and marked, never the status
    assert first["best_us"] < 23 and not first["best_is_measured"] and first["best_measured_us"] > 44
    assert "PLANTED" in first["best_label"] and first["best_samples"] == 1
    noisy = next(r for r in data.overview if r["problem"] == "4096x4096 bf16 nf4 bs64")
    assert noisy["flag"] == "ok" and noisy["status"] == "noisy-reference" and noisy["peer_iqr_us"] > 40
    assert data.counts["regression"] == 1 and list(data.counts)[0] == "regression"
    assert data.meta["gpus"] == [dict(name="NVIDIA H200", compute_capability="9.0")]
    run17 = next(r for r in data.runs if r["run"] == 17)
    assert run17["baseline"] == 15 and run17["config_diff"][0]["knobs"]["threads"] == [64, 256]
    # the heatmap reads measured medians only (the planted value has one sample)
    assert all(us > 44 for key, problem, *_, us in data.knob_speed if problem == "8192x8192 bf16 nf4 bs64")


def test_every_value_in_a_script_is_escaped_for_it():
    from nf4tune.reports._html import script_json

    value = {"a</script>": ["<!--", "&amp;", "\u2028\u2029", "x>y"]}
    text = script_json(value)
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(text) == value


def test_csv_cells_cannot_become_formulas(tmp_path, nightly_db):
    from nf4tune.reports._tables import csv_cell

    assert [csv_cell(v) for v in ("=1+1", "+1", "-x", "@SUM(A1)", "\tx", "ok", -1.5, 3, None)] == [
        "'=1+1", "'+1", "'-x", "'@SUM(A1)", "'\tx", "ok", "-1.5", "3", ""]
    out = tmp_path / "site"
    assert cli.main(["report", "--db", str(nightly_db), "-o", str(out)]) == 0
    flags = list(csv.DictReader((out / "flags.csv").open()))
    assert any(f["drop"].startswith("-1.81") for f in flags)          # numbers stay numbers
    assert len(json.loads((out / "history.json").read_text())["rows"]) == len(list(csv.DictReader(
        (out / "history.csv").open())))
    assert (out / "index.html").stat().st_size <= 150_000


def test_report_refuses_a_database_that_does_not_exist(tmp_path, capsys):
    missing, out = tmp_path / "nightyl.db", tmp_path / "site"
    assert cli.main(["report", "--db", str(missing), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no database at" in err and str(missing) in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_report_of_an_empty_database_still_renders(tmp_path):
    from nf4tune.db import Repository, connect

    Repository(connect(str(tmp_path / "e.db")))
    assert cli.main(["report", "--db", str(tmp_path / "e.db"), "-o", str(tmp_path / "s")]) == 0
    page = (tmp_path / "s" / "index.html").read_text()
    assert "nf4-tune report" in page and "holds no measurement yet" in page
