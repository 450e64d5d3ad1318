"""No command harms or misreads a database, and every command answers in bounded time: outputs
that would land on a database are refused; reads beside a live writer (rollback journal with
spilled pages, WAL in exclusive locking mode), after a writer that was killed (a hot journal)
and writers beside a lock end in a clean one-line error or a correct read; a search killed at
random points loses no finished trial. CPU only: the other processes are small Python scripts."""

import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nf4tune import cli
from nf4tune.db import Repository, connect

from conftest import example_db

SHAPE = "16384x16384"

# -------------------------------------------------------------------------- other processes
#: a rollback-journal writer in the middle of a big transaction: its cache holds 5 pages, so
#: changed pages are already written into the database file (spilled), the originals in -journal
ROLLBACK_WRITER = r"""
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
assert c.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
c.execute("PRAGMA cache_size=5")
c.execute("BEGIN")
c.execute("UPDATE measurements SET median_us = median_us / 2, reason = reason || ?", ("spilled " * 40,))
print("ready", flush=True)
if sys.stdin.readline().strip() == "commit":
    c.execute("COMMIT")
    print("committed", flush=True)
sys.stdin.readline()
"""

#: a WAL writer in exclusive locking mode that committed a change and holds on
EXCLUSIVE_WAL_WRITER = r"""
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA locking_mode=EXCLUSIVE")
assert c.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
c.execute("BEGIN")
c.execute("UPDATE measurements SET median_us = median_us / 2")
c.execute("COMMIT")
print("ready", flush=True)
sys.stdin.readline()
"""

#: a writer that holds SQLite's write lock (BEGIN IMMEDIATE) until told to let go
WRITE_LOCK_HOLDER = r"""
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
c.execute("INSERT INTO gpus (name, compute_capability, sm_count, memory_bytes, l2_bytes) VALUES ('uncommitted', '0', 1, 1, 1)")
print("ready", flush=True)
sys.stdin.readline()
c.execute("ROLLBACK")
print("released", flush=True)
sys.stdin.readline()
"""


class Other:
    """A script in another process, ready once it printed its first line."""

    def __init__(self, script: str, *args):
        self.p = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().strip()
        assert line == "ready", (line, self.p.stderr.read() if self.p.poll() is not None else "")

    def say(self, word: str) -> str:
        self.p.stdin.write(word + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            f.close()


def _db(tmp_path) -> Path:
    return Path(example_db("h200-search", tmp_path))


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _files(folder) -> list:
    return sorted(p.name for p in Path(folder).iterdir())


def _best(db, capsys, *extra) -> tuple:
    rc = cli.main(["best", "--shape", SHAPE, "--db", str(db), *extra])
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out) if rc == 0 else None), cap.err


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if not ln.startswith("nf4-tune: waiting for")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -------------------------------------------------------------------------- outputs
def test_export_over_its_own_database_is_refused(tmp_path, capsys, monkeypatch):
    db = _db(tmp_path)
    before = _digest(db)
    assert cli.main(["export", "-o", str(db), "--db", str(db)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("nf4-tune: error: refusing to write") and "database" in line
    # the default database, named as a new user would in its folder
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NF4TUNE_DB", raising=False)
    os.rename(db, tmp_path / "nf4tune.db")
    for out in ("nf4tune.db", "./nf4tune.db", str(tmp_path / "nf4tune.db")):
        assert cli.main(["export", "-o", out]) == 2, out
        assert "the database this command uses" in _one_line(capsys.readouterr().err)
    assert _digest(tmp_path / "nf4tune.db") == before and _files(tmp_path) == ["nf4tune.db"]


def test_outputs_resolved_through_links_never_land_on_a_database(tmp_path, capsys):
    db = _db(tmp_path)
    other = tmp_path / "other.db"                       # a SQLite file the command does not use
    sqlite3.connect(other).execute("CREATE TABLE t(x)").connection.close()
    hard = tmp_path / "hard.json"
    os.link(other, hard)
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "link.json"
    os.symlink(db, link)
    chain = tmp_path / "chain.json"
    os.symlink(link, chain)
    keep = {p: _digest(p) for p in (db, other)}
    cases = [(link, "the database this command uses"), (chain, "the database this command uses"),
             (other, "it is a SQLite database"), (hard, "it is a SQLite database"),
             (tmp_path / "x.db-wal", "-wal"), (tmp_path / "x.db-shm", "-shm"), (tmp_path / "x.db-journal", "-journal"),
             (Path(str(db) + "-wal"), "-wal")]
    for out, message in cases:
        assert cli.main(["export", "--db", str(db), "-o", str(out)]) == 2, out
        line = _one_line(capsys.readouterr().err)
        assert message in line and "refusing to write" in line, (out, line)
    assert {p: _digest(p) for p in keep} == keep and link.is_symlink() and chain.is_symlink()
    assert not (tmp_path / "x.db-wal").exists() and not Path(str(db) + "-wal").exists()
    # the checks are in the writer itself, for every command that writes a file
    from nf4tune._files import OutputPathError, atomic_write, protect_databases

    new_db = tmp_path / "new.db"            # a database a command will create: protected before it exists
    with protect_databases([new_db]), pytest.raises(OutputPathError, match="the database this command uses"):
        atomic_write(tmp_path / "links" / ".." / "new.db", "{}")
    with pytest.raises(OutputPathError, match="SQLite database"):
        atomic_write(link, "{}")
    assert {p: _digest(p) for p in keep} == keep and not new_db.exists()


def test_report_into_a_folder_whose_index_links_to_a_database_is_refused(tmp_path, capsys):
    db = _db(tmp_path)
    victim = tmp_path / "victim.db"
    victim.write_bytes(db.read_bytes())
    before = _digest(victim)
    site = tmp_path / "site"
    site.mkdir()
    os.symlink(victim, site / "index.html")
    assert cli.main(["report", "--db", str(db), "-o", str(site)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "index.html there is a symlink" in line
    assert _digest(victim) == before and _files(site) == ["index.html"] and (site / "index.html").is_symlink()
    # a folder or a pipe under one of the report's names is refused the same way
    os.unlink(site / "index.html")
    (site / "flags.csv").mkdir()
    assert cli.main(["report", "--db", str(db), "-o", str(site)]) == 2
    assert "flags.csv there is a folder" in _one_line(capsys.readouterr().err)
    os.rmdir(site / "flags.csv")
    os.mkfifo(site / "plotly.min.js")
    assert cli.main(["report", "--db", str(db), "-o", str(site)]) == 2
    assert "plotly.min.js there is not a regular file" in _one_line(capsys.readouterr().err)
    os.unlink(site / "plotly.min.js")
    # a hard link to a database under the report's name: refused by the header
    os.link(victim, site / "history.json")
    assert cli.main(["report", "--db", str(db), "-o", str(site)]) == 2
    assert "it is a SQLite database" in _one_line(capsys.readouterr().err)
    os.unlink(site / "history.json")
    # regress --report checks the same before it looks for a GPU
    os.symlink(victim, site / "index.html")
    assert cli.main(["regress", "--db", str(db), "--report", str(site)]) == 2
    assert "index.html there is a symlink" in _one_line(capsys.readouterr().err)
    assert _digest(victim) == before and _files(tmp_path) == ["h200-search.db", "site", "victim.db"]


def test_a_report_replaces_only_its_own_files(tmp_path, capsys):
    from nf4tune.reports import report_files

    db = _db(tmp_path)
    site = tmp_path / "site"
    (site / "notes").mkdir(parents=True)
    (site / "notes" / "n.txt").write_text("mine")
    (site / "README.md").write_text("mine too")
    (site / "index.html").write_text("an old report")
    os.symlink(db, site / "db-link")                   # another file of the folder: never touched
    stamp = {p: (p.lstat().st_mtime_ns, p.lstat().st_ino) for p in site.rglob("*") if p.name != "index.html"}
    assert cli.main(["report", "--db", str(db), "-o", str(site)]) == 0
    capsys.readouterr()
    assert _files(site) == sorted(report_files() + ["README.md", "db-link", "notes"])
    assert {p: (p.lstat().st_mtime_ns, p.lstat().st_ino) for p in stamp} == stamp
    assert "nf4-tune report" in (site / "index.html").read_text()
    assert all((site / n).is_file() and not (site / n).is_symlink() for n in report_files())
    assert _files(tmp_path) == ["h200-search.db", "site"]            # the temporary folder is gone
    # a report into a symlinked folder goes into the folder it names
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "via")
    assert cli.main(["report", "--db", str(db), "-o", str(tmp_path / "via")]) == 0
    assert _files(real) == sorted(report_files()) and (tmp_path / "via").is_symlink()


def test_help_says_what_outputs_are_refused(capsys):
    for sub in (["report"], ["export"], ["db", "recover"]):
        with pytest.raises(SystemExit):
            cli.main(sub + ["--help"])
        out = capsys.readouterr().out
        assert "-wal/-shm/-journal" in out and "--lock-timeout" in out, sub
        assert "no other file in DIR is touched" in out, sub


# -------------------------------------------------------------------------- reads
def test_a_rollback_writer_with_spilled_pages_is_waited_for_never_misread(tmp_path, capsys, monkeypatch):
    from nf4tune.db import _engine

    monkeypatch.setattr(_engine, "PROGRESS_AFTER_S", 0.3)
    db = _db(tmp_path)
    rc, committed, _ = _best(db, capsys)
    assert rc == 0
    listing = _files(tmp_path)
    clean = _digest(db)
    writer = Other(ROLLBACK_WRITER, db)
    try:
        spilled = db.read_bytes()
        # the writer's uncommitted pages are in the file already (reading it as it lies is reading
        # a state no one committed), the originals in the journal
        assert hashlib.sha256(spilled).hexdigest() != clean and os.path.getsize(str(db) + "-journal") > 0
        for argv in (["best", "--shape", SHAPE], ["export", "-o", str(tmp_path / "c.json")],
                     ["report", "-o", str(tmp_path / "site")]):
            t0 = time.monotonic()
            assert cli.main(argv + ["--db", str(db), "--lock-timeout", "0.8"]) == 2, argv
            err = capsys.readouterr().err
            assert time.monotonic() - t0 < 5
            assert _one_line(err) == f"nf4-tune: cannot run: database {db} is locked by another process (waited 0.8 s)"
            assert "nf4-tune: waiting for" in err          # the progress line
        assert db.read_bytes() == spilled and _files(tmp_path) == sorted(listing + ["h200-search.db-journal"])
        # the writer commits while a read waits: the read gets the committed state
        import threading

        threading.Timer(0.5, writer.say, args=("commit",)).start()
        rc, after, err = _best(db, capsys, "--lock-timeout", "20")
        assert rc == 0 and after["median_us"] == pytest.approx(committed["median_us"] / 2), err
    finally:
        writer.close()
    assert _files(tmp_path) == listing


def test_a_hot_journal_is_reported_by_reads_and_rolled_back_by_a_writing_command(tmp_path, capsys):
    db = _db(tmp_path)
    rc, committed, _ = _best(db, capsys)
    exported = tmp_path / "before.json"
    assert cli.main(["export", "--db", str(db), "-o", str(exported)]) == 0
    capsys.readouterr()
    writer = Other(ROLLBACK_WRITER, db)
    writer.kill()                                       # dies mid-transaction: a hot journal is left
    writer.close()
    journal = Path(str(db) + "-journal")
    assert journal.stat().st_size > 0
    hot = (_digest(db), _digest(journal))
    for argv in (["best", "--shape", SHAPE], ["export", "-o", str(tmp_path / "c.json")],
                 ["report", "-o", str(tmp_path / "site")]):
        assert cli.main(argv + ["--db", str(db)]) == 2, argv
        assert _one_line(capsys.readouterr().err) == (
            f"nf4-tune: cannot run: {db} has an unfinished transaction from a writer that stopped ({db}-journal); "
            f"any writing command, e.g. nf4-tune db recover {db}, rolls it back")
    assert (_digest(db), _digest(journal)) == hot            # a read changed nothing
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "site").exists()
    assert cli.main(["db", "recover", str(db)]) == 0
    out = capsys.readouterr().out
    assert "rolled back the unfinished transaction" in out and "integrity check ok" in out
    assert not journal.exists()
    rc, after, _ = _best(db, capsys)
    assert rc == 0 and after == committed
    assert cli.main(["export", "--db", str(db), "-o", str(tmp_path / "after.json")]) == 0
    assert (tmp_path / "after.json").read_text() == exported.read_text()          # nothing lost
    assert cli.main(["db", "recover", str(db)]) == 0
    assert "no unfinished transaction" in capsys.readouterr().out
    assert _files(tmp_path) == ["after.json", "before.json", "h200-search.db"]


def test_a_writing_command_rolls_a_hot_journal_back(tmp_path, capsys):
    db = _db(tmp_path)
    writer = Other(ROLLBACK_WRITER, db)
    writer.kill()
    writer.close()
    notes = []
    repo = Repository(connect(str(db), note=notes.append))            # what search, bench and regress open
    assert notes == [f"rolled back the unfinished transaction of a writer that stopped ({db}-journal)"]
    assert len(repo.measurements(1)) > 0
    repo.db.dispose()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("SELECT count(*) FROM measurements WHERE reason LIKE '%spilled%'").fetchone()[0] == 0
    con.close()


def test_a_wal_writer_in_exclusive_locking_mode_is_waited_for_not_hung_on(tmp_path, capsys):
    db = _db(tmp_path)
    rc, committed, _ = _best(db, capsys)
    writer = Other(EXCLUSIVE_WAL_WRITER, db)
    try:
        t0 = time.monotonic()
        rc, _, err = _best(db, capsys, "--lock-timeout", "1")
        assert rc == 2 and time.monotonic() - t0 < 6
        assert _one_line(err) == f"nf4-tune: cannot run: database {db} is locked by another process (waited 1 s)"
        assert not Path(str(db) + "-shm").exists()          # the read made nothing
    finally:
        writer.kill()
        writer.close()
    # the writer died with its commit in the log: a read sees it, and leaves no file of its own
    rc, after, err = _best(db, capsys)
    assert rc == 0 and after["median_us"] == pytest.approx(committed["median_us"] / 2), err
    assert _files(tmp_path) == ["h200-search.db"]
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()


def test_a_read_beside_a_live_wal_writer_sees_the_last_commit_and_makes_no_file(tmp_path, capsys):
    db = _db(tmp_path)
    rc, committed, _ = _best(db, capsys)
    holder = Other(WRITE_LOCK_HOLDER, db)           # WAL: holds the write lock, an uncommitted row
    try:
        listing = _files(tmp_path)
        assert "h200-search.db-wal" in listing
        t0 = time.monotonic()
        rc, during, err = _best(db, capsys, "--lock-timeout", "10")
        assert rc == 0 and during == committed and time.monotonic() - t0 < 5, err
        import sqlalchemy as sa

        db_ro = connect(str(db), read_only=True)
        with db_ro.engine.connect() as c:
            assert "uncommitted" not in set(c.execute(sa.text("SELECT name FROM gpus")).scalars())
        db_ro.dispose()
        assert _files(tmp_path) == listing
    finally:
        holder.close()


def test_a_read_of_a_quiet_wal_database_leaves_no_file_and_changes_no_byte(tmp_path, capsys):
    db = _db(tmp_path)
    assert db.read_bytes()[18:20] == b"\x02\x02"             # WAL mode: a read-only connection makes -wal, -shm
    before, stat = _digest(db), db.stat().st_mtime_ns
    for argv in (["best", "--shape", SHAPE], ["export", "-o", str(tmp_path / "c.json")],
                 ["report", "-o", str(tmp_path / "site")]):
        assert cli.main(argv + ["--db", str(db)]) == 0, argv
        capsys.readouterr()
        assert not [f for f in _files(tmp_path) if f.endswith(("-wal", "-shm", "-journal"))], argv
    assert _files(tmp_path) == ["c.json", "h200-search.db", "site"]
    assert _digest(db) == before and db.stat().st_mtime_ns == stat


def test_immutable_only_on_a_read_only_medium_without_journal_or_log(tmp_path, monkeypatch):
    from nf4tune.db import _engine

    db = _db(tmp_path)
    uris = []
    real_connect = sqlite3.connect

    def spy(target, *a, **k):
        uris.append(str(target))
        return real_connect(target, *a, **k)

    monkeypatch.setattr(_engine.sqlite3, "connect", spy)
    connect(str(db), read_only=True).dispose()
    assert uris[0].endswith("?mode=ro")
    monkeypatch.setattr(_engine, "_read_only_medium", lambda path: True)
    uris.clear()
    connect(str(db), read_only=True).dispose()
    assert uris[0].endswith("mode=ro&immutable=1")
    Path(str(db) + "-journal").write_bytes(b"")              # a journal: never immutable
    uris.clear()
    connect(str(db), read_only=True).dispose()
    assert uris[0].endswith("?mode=ro")


# -------------------------------------------------------------------------- writers
def _fake_gpu(monkeypatch, *modules):
    from nf4tune.kernel.gpu import GPUInfo

    gpu = GPUInfo("NVIDIA H200", "sm_90", (9, 0), 132, 60 << 20, 141 << 30, "580.1")
    for module in modules:
        monkeypatch.setattr(module, "require_gpu", lambda: gpu)
    return gpu


class _ServerLock:
    """A PostgreSQL session that holds a SHARE lock on the runs table (writers wait, readers do not)."""

    def __init__(self, url):
        import sqlalchemy as sa

        self.engine = sa.create_engine(url)
        self.conn = self.engine.connect()
        self.tx = self.conn.begin()
        self.conn.execute(sa.text("LOCK TABLE runs IN SHARE MODE"))

    def close(self):
        self.tx.rollback()
        self.conn.close()
        self.engine.dispose()


def _hold_write_lock(url, tmp_path):
    from nf4tune.db._engine import sqlite_path

    path = sqlite_path(url)
    return Other(WRITE_LOCK_HOLDER, path) if path else _ServerLock(url)


def test_search_and_regress_beside_a_lock_wait_then_exit_2(db_url, tmp_path, capsys, monkeypatch):
    from nf4tune.cli import regress, search
    from nf4tune.db import _engine
    from nf4tune.measure.record import gpu_row

    monkeypatch.setattr(_engine, "PROGRESS_AFTER_S", 0.3)
    gpu = _fake_gpu(monkeypatch, search, regress)
    repo = Repository(connect(db_url))
    run = repo.start_run("search", gpu_row(repo, gpu), repo.environment(
        project_version="t", git_commit="t", nvrtc="t", driver="t", cuda_python="t", bnb="t", torch="t"))
    from nf4tune.vocabulary import Problem

    repo.add_measurement(run, Problem((4096, 4096)), dict(label="trial", status="ok", median_us=10.0),
                         repo.config({"threads": 128}, "th"))
    runs = len(repo.runs())
    repo.db.dispose()
    shown = _engine._shown(db_url)
    holder = _hold_write_lock(db_url, tmp_path)
    try:
        for argv in (["search", "--shape", "4096x4096", "--trials", "1"], ["regress"]):
            t0 = time.monotonic()
            assert cli.main(argv + ["--db", db_url, "--lock-timeout", "1"]) == 2, argv
            err = capsys.readouterr().err
            assert time.monotonic() - t0 < 8
            assert _one_line(err) == f"nf4-tune: cannot run: database {shown} is locked by another process (waited 1 s)"
            assert "nf4-tune: waiting for" in err, err
    finally:
        holder.close()
    import sqlalchemy as sa

    repo = Repository(connect(db_url))
    assert len(repo.runs()) == runs
    with repo.db.engine.connect() as c:
        assert "uncommitted" not in set(c.execute(sa.text("SELECT name FROM gpus")).scalars())
    repo.db.dispose()


def test_a_lock_taken_in_the_middle_of_the_work_is_bounded_and_one_line(db_url, tmp_path, capsys, monkeypatch):
    """The lock comes after the start-up wait (here: that wait is skipped): the statement that meets
    it waits up to --lock-timeout (SQLite's busy timeout, PostgreSQL's lock_timeout), then exit 2."""
    from nf4tune.cli import search
    from nf4tune.db import _engine

    _fake_gpu(monkeypatch, search)
    monkeypatch.setattr(_engine, "_wait_for_sqlite_write", lambda *a, **k: False)
    monkeypatch.setattr(_engine, "_wait_for_server_tables", lambda *a, **k: None)
    Repository(connect(db_url)).db.dispose()
    holder = _hold_write_lock(db_url, tmp_path)
    try:
        t0 = time.monotonic()
        assert cli.main(["search", "--shape", "4096x4096", "--trials", "1", "--db", db_url,
                         "--lock-timeout", "1"]) == 2
        err = capsys.readouterr().err
        assert time.monotonic() - t0 < 15
        assert _one_line(err) == (f"nf4-tune: cannot run: database {_engine._shown(db_url)} is locked by another "
                                  "process (waited 1 s)")
    finally:
        holder.close()


def test_a_writer_waits_for_a_lock_that_is_let_go_in_time(tmp_path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    Repository(connect(url)).db.dispose()
    holder = Other(WRITE_LOCK_HOLDER, tmp_path / "w.db")
    try:
        import threading

        threading.Timer(0.6, holder.say, args=("go",)).start()
        notes = []
        t0 = time.monotonic()
        from nf4tune.db import _engine

        repo = Repository(_engine.connect(url, timeout=20, note=notes.append))
        assert 0.5 < time.monotonic() - t0 < 10 and repo.problems() == []
        repo.db.dispose()
    finally:
        holder.close()


def test_db_recover_refuses_what_it_cannot_recover(tmp_path, capsys):
    missing = tmp_path / "nope.db"
    assert cli.main(["db", "recover", str(missing)]) == 2
    assert "no database at" in _one_line(capsys.readouterr().err) and not missing.exists()
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    assert cli.main(["db", "recover", str(text)]) == 2
    assert "not a SQLite database" in _one_line(capsys.readouterr().err)
    assert cli.main(["db", "recover", "postgresql://u:secret@h/d"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "not a SQLite file" in line and "secret" not in line
    damaged = tmp_path / "damaged.db"
    con = sqlite3.connect(damaged)
    con.execute("PRAGMA page_size=1024")
    con.execute("CREATE TABLE t(x)")
    con.execute("CREATE INDEX ti ON t(x)")
    con.executemany("INSERT INTO t VALUES (?)", [(os.urandom(40).hex(),) for _ in range(400)])
    con.commit()
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'ti'").fetchone()[0]
    con.close()
    with open(damaged, "r+b") as f:                       # scramble a page of the index
        f.seek((root - 1) * 1024 + 8)
        f.write(os.urandom(200))
    assert cli.main(["db", "recover", str(damaged)]) == 1
    assert "the integrity check found damage" in capsys.readouterr().out


# -------------------------------------------------------------------------- killed while writing
def _search_forever(url: str, log: str, seed: int) -> None:
    """A search that runs until it is killed, logging each finished trial's count after its commit."""
    os.environ["NF4TUNE_HEARTBEAT_S"] = "1"
    os.environ["NF4TUNE_GRACE_S"] = "2"
    from fakes import FakeMeasurer
    from nf4tune.tune.search import run_search
    from nf4tune.vocabulary import Problem

    repo = Repository(connect(url, note=lambda line: None))
    run = repo.runs()[0]
    with open(log, "a") as f:
        def progress(done, total, best, bnb):
            f.write(f"{done}\n")
            f.flush()

        run_search(Problem((2048, 2048)), repo=repo, storage_url=url, gpu_name="Fake GPU", run=run,
                   measurer=FakeMeasurer(), n_trials=100_000, seed=seed, progress=progress)


def _finished(url) -> dict:
    import optuna
    from optuna.trial import TrialState

    from nf4tune.tune.search import study_name
    from nf4tune.vocabulary import Problem

    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.load_study(study_name=study_name("Fake GPU", Problem((2048, 2048))), storage=storage)
    except KeyError:
        return {}
    out = {t.number: (t.value, t.user_attrs.get("config")) for t in study.get_trials(deepcopy=False)
           if t.state in (TrialState.COMPLETE, TrialState.FAIL)}
    storage.engine.dispose()
    return out


def _wait_for(predicate, timeout_s):
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout_s, "timed out"
        time.sleep(0.02)


def test_a_search_killed_at_random_points_while_writing_loses_nothing(db_url, tmp_path, seed, monkeypatch):
    from nf4tune.db._engine import sqlite_path
    from nf4tune.families import DEQUANT
    from nf4tune.vocabulary import Problem

    monkeypatch.setenv("NF4TUNE_HEARTBEAT_S", "1")
    monkeypatch.setenv("NF4TUNE_GRACE_S", "2")
    rng = random.Random(seed)
    repo = Repository(connect(db_url))
    gpu = repo.gpu("Fake GPU", "9.0", 132, 10**11, 60 << 20)
    repo.start_run("search", gpu, repo.environment(project_version="t", git_commit="t", nvrtc="t", driver="t",
                                                  cuda_python="t", bnb="t", torch="t"))
    repo.db.dispose()
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    path = sqlite_path(db_url)
    log = tmp_path / "finished.log"
    seen: dict = {}
    kills = 0
    for point in range(20):
        log.write_text("")
        p = ctx.Process(target=_search_forever, args=(db_url, str(log), rng.randrange(1 << 30)))
        p.start()
        if point % 2:       # among the trials: asking, storing the measurement, telling, beating
            _wait_for(lambda: log.read_text().strip() or not p.is_alive(), 20)
            time.sleep(rng.uniform(0.0, 0.25))
        else:               # anywhere from the start: opening, upgrading, making or loading the study
            time.sleep(rng.uniform(0.05, 0.7))
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL, p.exitcode
        kills += 1
        if path:
            con = sqlite3.connect(path)
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f"kill {point}"
            con.close()
        now = _finished(db_url)
        logged = [int(x) for x in log.read_text().split()]
        assert not logged or len(now) >= logged[-1], (point, len(now), logged[-1])
        lost = {n: v for n, v in seen.items() if now.get(n) != v}
        assert not lost, f"kill {point}: finished trials lost or changed: {lost}"
        seen = now
    assert kills == 20 and len(seen) >= 20
    # every finished trial's measurement is stored, and a resumed search goes on from there
    repo = Repository(connect(db_url))
    th = DEQUANT.template_hash()
    prob = Problem((2048, 2048))
    for number, (value, config) in seen.items():
        if value is not None:
            m = repo.measurement_of("Fake GPU", prob, json.loads(config), th)
            assert m is not None and m.median_us == pytest.approx(value), number
    time.sleep(2.2)                                          # past the grace period: killed trials are stale
    from fakes import FakeMeasurer
    from nf4tune.tune.search import run_search

    s = run_search(prob, repo=repo, storage_url=db_url, gpu_name="Fake GPU", run=repo.runs()[0],
                   measurer=FakeMeasurer(), n_trials=len(seen) + 3, seed=1)
    after = _finished(db_url)
    assert s.trials == len(after) >= len(seen) + 3 and all(after[n] == v for n, v in seen.items())
    repo.db.dispose()


# -------------------------------------------------------------------------- downloads
def test_csv_downloads_defuse_formulas_and_json_stays_exact(tmp_path, capsys):
    from nf4tune.vocabulary import Problem

    db = tmp_path / "f.db"
    repo = Repository(connect(str(db)))
    gpu = repo.gpu("=HYPERLINK(\"http://x\")", "9.0", 1, 1, 1)
    run = repo.start_run("bench", gpu, repo.environment(project_version="v", git_commit="c", nvrtc="n", driver="d",
                                                        cuda_python="p", bnb="b", torch="t"), command="@SUM(1)")
    labels = ["=1+1", "+cmd", "-2+3", "@x", "\tx", "\rx", "plain"]
    for i, label in enumerate(labels):
        repo.add_measurement(run, Problem((64 * (i + 1), 64)), dict(label=label, status="ok", median_us=-1.5 + i,
                                                                    samples_us=[1.0, 2.0, 3.0]),
                             repo.config({"threads": 64 * (i + 1)}, "th"))
    repo.finish_run(run)
    repo.db.dispose()
    out = tmp_path / "site"
    assert cli.main(["report", "--db", str(db), "-o", str(out)]) == 0
    import csv

    text_cells, numbers = [], []
    for name in ("overview", "flags", "history"):
        rows = list(csv.reader((out / f"{name}.csv").open(newline="")))
        for row in rows[1:]:
            for cell in row:
                if cell[:1] in ("=", "+", "@", "\t", "\r"):
                    pytest.fail(f"{name}.csv: a formula cell {cell!r}")
                if cell[:1] == "-":
                    float(cell)                       # a leading minus only on a number
                    numbers.append(cell)
                text_cells.append(cell)
    assert "'=HYPERLINK(\"http://x\")" in text_cells and "'=1+1" in text_cells and "'-2+3" in text_cells
    assert "-1.5" in numbers
    history = json.loads((out / "history.json").read_text())["rows"]
    assert {r["label"] for r in history} >= {"=1+1", "+cmd", "-2+3", "@x", "\tx", "\rx"}      # exact
    assert {r["gpu"] for r in history} == {"=HYPERLINK(\"http://x\")"}


# -------------------------------------------------------------------------- the nightly data branch
def test_nightly_keep_seeds_and_extends_the_data_branch_from_the_repository_root(tmp_path, capsys):
    """`ci/nightly.sh --keep DB` (the set-up's seed and the workflow's nightly commit) from the
    repository root with ./nf4tune.db, and from a subfolder: the committed rows in the log are in
    the kept file, the work tree, index and branch are untouched, each night is one commit."""
    script = Path(__file__).resolve().parent.parent / "ci" / "nightly.sh"
    env = dict(os.environ, NF4TUNE_CMD=f"{sys.executable} -m nf4tune.cli", GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    env.pop("NF4TUNE_DB", None)

    def git(*args, cwd):
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout

    remote, repo = tmp_path / "remote.git", tmp_path / "repo"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / ".gitignore").write_text("/nf4tune.db*\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "f.txt").write_text("x")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "main", cwd=repo)
    git("remote", "add", "origin", str(remote), cwd=repo)
    db = repo / "nf4tune.db"
    db.write_bytes(_db(tmp_path).read_bytes())
    rc, committed, _ = _best(db, capsys)
    writer = Other(EXCLUSIVE_WAL_WRITER, db)         # a commit that lies in nf4tune.db-wal only
    writer.kill()
    writer.close()
    assert os.path.getsize(str(db) + "-wal") > 0
    status = git("status", "--porcelain", "--ignored", cwd=repo)
    r = subprocess.run(["bash", str(script), "--keep", "nf4tune.db", "seed"], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kept nf4tune.db as nf4tune.db on origin nightly-data" in r.stdout
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=repo).strip() == "main"
    def listed(text):
        return {ln for ln in text.splitlines() if "nf4tune.db-" not in ln}      # db recover folded the log in

    assert listed(git("status", "--porcelain", "--ignored", cwd=repo)) == listed(status)
    assert not (repo / "nf4tune.db-wal").exists() and git("stash", "list", cwd=repo) == ""
    kept = tmp_path / "kept.db"
    kept.write_bytes(subprocess.run(["git", "--git-dir", str(remote), "show", "nightly-data:nf4tune.db"],
                                    capture_output=True, check=True).stdout)
    rc, got, err = _best(kept, capsys)
    assert rc == 0 and got["median_us"] == pytest.approx(committed["median_us"] / 2), err
    # the next night, from a subfolder: one more commit on top
    r = subprocess.run(["bash", str(script), "--keep", "../nf4tune.db", "night 2"], cwd=repo / "sub", env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    log = git("--git-dir", str(remote), "log", "--format=%s", "nightly-data", cwd=tmp_path).split("\n")
    assert log[:2] == ["night 2", "seed"]
    r = subprocess.run(["bash", str(script), "--keep", "missing.db"], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "no database file at missing.db" in r.stderr
