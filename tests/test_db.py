"""db/: the schema, its migrations and the repository, on SQLite and PostgreSQL."""

import pytest
import sqlalchemy as sa

from nf4tune.db import Repository, connect, resolve_url
from nf4tune.db._engine import DatabaseError, current_revision, head_revision, make_engine, upgrade
from nf4tune.vocabulary import Problem

PROBLEM = Problem((4096, 4096), "bf16", "nf4", 64)
MATMUL = Problem((4096, 4096), "bf16", "nf4", 64, "matmul", 8)


def _fill(repo):
    gpu = repo.gpu("NVIDIA H200", "9.0", 132, 150_000_000_000, 60 << 20, 4200.0)
    env = repo.environment(project_version="0.1", git_commit="abc", nvrtc="13.0", driver="13.0",
                           cuda_python="1.2", bnb="0.50.2", torch="2.11")
    run = repo.start_run("bench", gpu, env, "nf4-tune bench")
    fast = repo.config({"lut": "shared", "threads": 128}, "h1")
    slow = repo.config({"lut": "global", "threads": 64}, "h1")
    repo.add_measurement(run, PROBLEM, dict(label="fast", status="ok", median_us=13.5, samples_us=[13.4, 13.6]), fast)
    repo.add_measurement(run, PROBLEM, dict(label="slow", status="ok", median_us=21.0, samples_us=[21.0]), slow)
    repo.add_measurement(run, PROBLEM, dict(label="bnb dequantize_4bit", status="reference", median_us=29.0,
                                            samples_us=[29.0]))
    repo.finish_run(run)
    return gpu, run


def test_repository_round_trip(db_url):
    url = db_url
    repo = Repository(connect(url))
    gpu, run = _fill(repo)
    knobs, m, gname = repo.best(None, PROBLEM)
    assert knobs == {"lut": "shared", "threads": 128} and m.median_us == 13.5 and gname == "NVIDIA H200"
    assert m.samples_us == [13.4, 13.6]
    assert repo.problems() == [("NVIDIA H200", PROBLEM)]
    # a problem of another family (same shape, dtype, quant, blocksize) is another problem
    assert repo.best(None, MATMUL) is None
    mm = repo.config({"warps": 4}, "h2", "matmul")
    repo.add_measurement(run, MATMUL, dict(label="mm", status="ok", median_us=9.0, samples_us=[9.0]), mm)
    assert repo.best(None, MATMUL)[0] == {"warps": 4} and repo.best(None, PROBLEM)[1].median_us == 13.5
    assert [p for _, p in repo.problems()] == [PROBLEM, MATMUL]
    assert repo.problems(family="matmul") == [("NVIDIA H200", MATMUL)]
    assert repo.measurement_of("NVIDIA H200", PROBLEM, {"threads": 64, "lut": "global"}, "h1").median_us == 21.0
    assert repo.measurement_of("Other GPU", PROBLEM, {"threads": 64, "lut": "global"}, "h1") is None
    assert repo.runs("bench")[0].ended_at is not None
    # get-or-create does not duplicate
    assert repo.gpu("NVIDIA H200", "9.0", 132, 150_000_000_000, 60 << 20).id == gpu.id
    assert len(repo.measurements(run.id)) == 4
    with pytest.raises(ValueError):
        repo.start_run("nightly", gpu, repo.environment(project_version="0.1", git_commit="abc", nvrtc="13.0",
                                                        driver="13.0", cuda_python="1.2", bnb="0.50.2", torch="2.11"))


def test_an_older_schema_is_upgraded_in_place(db_url):
    url = db_url
    engine = make_engine(resolve_url(url))
    upgrade(engine, "0001")
    assert current_revision(engine) == "0001"
    with engine.begin() as c:
        c.execute(sa.text("INSERT INTO gpus (name, compute_capability, sm_count, memory_bytes, l2_bytes) "
                          "VALUES ('Old GPU', '8.0', 108, 1, 1)"))
    engine.dispose()
    db = connect(url)                      # upgrades to head, keeps the row
    assert current_revision(db.engine) == head_revision() == "0004"
    with db.engine.connect() as c:
        assert c.execute(sa.text("SELECT name FROM gpus")).scalar_one() == "Old GPU"
        cols = {col["name"] for col in sa.inspect(c).get_columns("measurements")}
        tables = set(sa.inspect(c).get_table_names())
    assert {"registers", "family", "m"} <= cols and "flags" in tables
    repo = Repository(db)
    assert repo.problems() == []


def test_default_url_and_env_override(monkeypatch, tmp_path):
    monkeypatch.delenv("NF4TUNE_DB", raising=False)
    assert resolve_url() == "sqlite:///nf4tune.db"
    monkeypatch.setenv("NF4TUNE_DB", str(tmp_path / "e.db"))
    assert resolve_url() == f"sqlite:///{tmp_path / 'e.db'}"
    assert resolve_url("postgresql://h/db") == "postgresql://h/db"


def test_sqlite_runs_in_wal_mode(tmp_path):
    db = connect(str(tmp_path / "w.db"))
    with db.engine.connect() as c:
        assert c.execute(sa.text("PRAGMA journal_mode")).scalar_one().lower() == "wal"


def test_unreadable_database_is_a_clear_error(tmp_path):
    with pytest.raises(DatabaseError, match="does not exist"):
        connect(str(tmp_path / "missing" / "x.db"))
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DatabaseError, match="cannot open"):
        connect(str(bad))


def test_read_only_never_creates_or_alters_a_database(tmp_path):
    missing = tmp_path / "serch.db"
    with pytest.raises(DatabaseError, match="no database at"):
        connect(str(missing), read_only=True)
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(DatabaseError, match="empty"):
        connect(str(empty), read_only=True)
    assert empty.read_bytes() == b""
    # an older schema is read through an upgraded in-memory copy; the file is untouched
    old = tmp_path / "old.db"
    engine = make_engine(resolve_url(str(old)))
    upgrade(engine, "0003")
    engine.dispose()
    before = old.read_bytes()
    listing = sorted(p.name for p in tmp_path.iterdir())
    repo = Repository(connect(str(old), read_only=True))
    assert repo.problems() == [] and repo.report_rows()["runs"] == []
    repo.db.dispose()
    assert old.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == listing


def test_a_missing_driver_is_one_line_naming_the_package():
    with pytest.raises(DatabaseError, match="pip install mysqlclient"):
        connect("mysql://u@h/d")


def test_report_rows_set_aside_a_row_whose_problem_cannot_be_read(tmp_path):
    import sqlite3

    path = tmp_path / "r.db"
    repo = Repository(connect(str(path)))
    run = repo.start_run("bench", repo.gpu("G", "9.0", 1, 1, 1), repo.environment(
        project_version="v", git_commit="c", nvrtc="n", driver="d", cuda_python="p", bnb="b", torch="t"))
    for shape in ((64, 64), (128, 128)):
        repo.add_measurement(run, Problem(shape), dict(label="x", status="ok", median_us=1.0))
    repo.db.dispose()
    con = sqlite3.connect(path)
    con.execute("UPDATE measurements SET shape = '64x<b>' WHERE shape = '64x64'")
    con.commit()
    con.close()
    rows = Repository(connect(str(path), read_only=True)).report_rows()
    assert [m["problem"].shape for m in rows["measurements"]] == [(128, 128)]
    assert rows["unreadable"] == [dict(table="measurements", id=1, shape="64x<b>", dtype="bf16")]


def test_the_url_a_report_prints_hides_the_password():
    from nf4tune.db._engine import Database

    repo = Repository(Database("postgresql+psycopg://tuner:s3cret@dbhost/nf4tune", engine=None))
    assert repo.display_url == "postgresql+psycopg://tuner:***@dbhost/nf4tune"
