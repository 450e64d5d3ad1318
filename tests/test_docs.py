"""The docs are tested: the set-up blocks run as a user copies them, the links resolve, the sizes hold.

A runnable block is a fenced ``bash`` block right after an HTML comment naming it::

    <!-- test: nightly-seed -->
    ```bash
    ...
    ```

Each marked block is run by ``bash -e -o pipefail`` in a temporary folder, as written. The only
changes are the ones a user makes too, listed where they happen: the placeholder host, port and
names of the PostgreSQL fleet (``dbhost:5432``, ``nf4tune_fleet``, ``nf4tune_worker``) become
CI's server and names unique to the run, and ``sudo -u postgres`` is a shim that runs the command
as the test (CI's server trusts the user that ``PGUSER`` names). What a machine without a GPU or a
second host cannot do is left out and said so: a block that needs a GPU is expected to stop with
the documented exit 2 there, and is skipped where a GPU is visible.

- The nightly blocks (docs/nightly.md) run against a local bare git remote, together with the
  data-branch steps of ``.github/workflows/nightly.yml`` read from the workflow file itself.
- The fleet blocks run against the PostgreSQL server of ``NF4TUNE_TEST_POSTGRES_URL`` (``.ci/run``
  starts one with ``.ci/postgres.sh``); skipped without it.
- Every relative link of README.md, docs/*.md, ci/README.md and examples/models/README.md names a
  file of the repository (and a heading, where it names an anchor); README.md is at most 25 KB; no
  doc speaks of development sessions or passes 1,000 lines; every ``nf4-tune`` command the docs show
  names a subcommand and options the command line has (options that work in flight adds are listed
  in ``PENDING`` until they land).
"""

from __future__ import annotations

import gzip
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: the docs this project writes by hand (the checks of language and length cover these)
OWN_DOCS = DOCS + [ROOT / "ci" / "README.md", ROOT / "examples" / "models" / "README.md"]
MARKER = re.compile(r"<!-- test: ([a-z0-9-]+) -->")
BLOCK = re.compile(r"<!-- test: ([a-z0-9-]+) -->\n```bash\n(.*?)\n```", re.S)

#: every marked block and the test that runs it
RUN_BY = {
    "nightly-seed": "test_the_nightly_set_up_against_a_bare_remote",
    "nightly-rehearse": "test_the_nightly_set_up_against_a_bare_remote",
    "nightly-history": "test_the_nightly_set_up_against_a_bare_remote",
    "fleet-database": "test_the_fleet_set_up_against_postgresql",
    "fleet-schema": "test_the_fleet_set_up_against_postgresql",
    "fleet-worker": "test_the_fleet_set_up_against_postgresql",
    "fleet-collect": "test_the_fleet_set_up_against_postgresql",
    "fleet-backup": "test_the_fleet_set_up_against_postgresql",
}


def marked_blocks() -> dict:
    """name -> (file, the block's text) of every marked block of the docs."""
    found = {}
    for path in DOCS:
        text = path.read_text()
        for name in MARKER.findall(text):
            assert name not in found, f"block {name} is marked twice ({found.get(name, ('',))[0]}, {path.name})"
            found[name] = (path.name, None)
        for name, body in BLOCK.findall(text):
            found[name] = (path.name, body + "\n")
    return found


def block(name: str) -> str:
    where, body = marked_blocks()[name]
    assert body is not None, f"{where}: the marker of {name} is not followed by a ```bash block"
    return body


def gpu_visible() -> bool:
    from nf4tune.kernel.gpu import gpu_available

    return gpu_available()


def shell_env(tmp_path: Path, **extra) -> dict:
    """The environment of a block: the test's shims, then this Python's folder first on PATH
    (``python3`` and ``nf4-tune`` of the install under test), git isolated from the user's
    configuration, a fixed identity."""
    gitconfig = tmp_path / "gitconfig"
    gitconfig.touch()
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("GIT_", "NF4TUNE_")) and key != "NF4TUNE_CACHE":
            del env[key]
    bindir = tmp_path / "bin"          # the test's shims (sudo), if any
    bindir.mkdir(exist_ok=True)
    env.update(GIT_CONFIG_GLOBAL=str(gitconfig), GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="docs test",
               GIT_AUTHOR_EMAIL="docs@example.invalid", GIT_COMMITTER_NAME="docs test",
               GIT_COMMITTER_EMAIL="docs@example.invalid",
               PATH=os.pathsep.join([str(bindir), os.path.dirname(sys.executable), env.get("PATH", "")]))
    env.update(extra)
    return env


def run_bash(script: str, cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """A script as GitHub's runners and a careful user run it: bash, stop at the first failure."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{what} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def git(*args, cwd: Path, env: dict) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, timeout=60)
    assert r.returncode == 0, f"git {' '.join(args)}: {r.stderr.decode(errors='replace')}"
    return r.stdout.decode(errors="replace")


def git_bytes(*args, cwd: Path, env: dict) -> bytes:
    r = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, timeout=60)
    assert r.returncode == 0, f"git {' '.join(args)}: {r.stderr.decode(errors='replace')}"
    return r.stdout


def dump(path: Path) -> list:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(con.iterdump())
    finally:
        con.close()


# --- which blocks exist ---------------------------------------------------------------------------

def test_every_marked_block_is_run_by_a_test():
    found = marked_blocks()
    for name, (where, body) in found.items():
        assert body is not None, f"{where}: <!-- test: {name} --> must be followed by a ```bash block"
    assert set(found) == set(RUN_BY), (f"marked in the docs but run by no test: {sorted(set(found) - set(RUN_BY))}; "
                                       f"run by a test but not in the docs: {sorted(set(RUN_BY) - set(found))}")


# --- the nightly workflow -------------------------------------------------------------------------

def workflow_steps() -> tuple[dict, dict]:
    """The workflow-level env and the ``run`` scripts of the data-branch steps of nightly.yml."""
    import yaml

    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    steps = wf["jobs"]["regress"]["steps"]

    def step(prefix):
        hits = [s for s in steps if s.get("name", "").startswith(prefix)]
        assert len(hits) == 1, f"nightly.yml: no single step named {prefix!r} (steps: {[s.get('name') for s in steps]})"
        return hits[0]["run"]

    return wf.get("env", {}), dict(fetch=step("Fetch the database"), keep=step("Keep the database"))


def expand(text: str, values: dict) -> str:
    """GitHub's ``${{ expr }}`` with the values a night would give; an unknown expression fails the
    test (the workflow changed: teach the test what the new expression is)."""
    def sub(m):
        expr = m.group(1).strip()
        assert expr in values, f"nightly.yml uses ${{{{ {expr} }}}}, which this test does not know"
        return values[expr]
    return re.sub(r"\$\{\{(.*?)\}\}", sub, text)


def checkout(bare: Path, dest: Path, env: dict) -> None:
    """What actions/checkout@v4 leaves: origin with git's default refspec, main fetched at depth 1."""
    dest.mkdir()
    git("init", "-q", "-b", "main", cwd=dest, env=env)
    git("remote", "add", "origin", bare.as_uri(), cwd=dest, env=env)
    git("fetch", "-q", "--no-tags", "--depth=1", "origin", "+refs/heads/main:refs/remotes/origin/main", cwd=dest,
        env=env)
    git("checkout", "-q", "--force", "-B", "main", "refs/remotes/origin/main", cwd=dest, env=env)


def night(bare: Path, ws: Path, env: dict, rc: str, wf_env: dict, scripts: dict) -> Path:
    """One night of the workflow's data-branch steps in a fresh checkout; the night itself (regress)
    is a change of the database's user_version."""
    checkout(bare, ws, env)
    values = {"github.workspace": str(ws), "steps.nightly.outputs.rc": rc}
    step_env = dict(env, **{k: expand(str(v), values) for k, v in wf_env.items()})
    ok(run_bash(expand(scripts["fetch"], values), ws, step_env), "the workflow's fetch step")
    db = Path(step_env["NF4TUNE_DB"])
    assert db.read_bytes() == git_bytes("show", "origin/nightly-data:nf4tune.db", cwd=ws, env=env)
    con = sqlite3.connect(db)
    version = con.execute("PRAGMA user_version").fetchone()[0]
    con.execute(f"PRAGMA user_version = {version + 1}")
    con.commit()
    con.close()
    # the workflow's Install step made .venv with nf4-tune in it: here, this test's Python
    activate = ws / ".venv" / "bin" / "activate"
    activate.parent.mkdir(parents=True, exist_ok=True)
    activate.write_text(f'export NF4TUNE_CMD="{sys.executable} -m nf4tune.cli" NF4TUNE_PYTHON="{sys.executable}"\n')
    ok(run_bash(expand(scripts["keep"], values), ws, step_env), "the workflow's keep step")
    return db


def test_the_nightly_set_up_against_a_bare_remote(tmp_path):
    env = shell_env(tmp_path)
    wf_env, scripts = workflow_steps()
    bare = tmp_path / "remote.git"
    bare.mkdir()
    git("init", "-q", "--bare", "-b", "main", cwd=bare, env=env)

    # the repository: what the workflow and the night need from it
    repo = tmp_path / "repo"
    for rel in ("ci/nightly.sh", "ci/machine_check.py", ".github/workflows/nightly.yml"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    git("init", "-q", "-b", "main", cwd=repo, env=env)
    git("add", "-A", cwd=repo, env=env)
    git("commit", "-q", "-m", "the project", cwd=repo, env=env)
    git("remote", "add", "origin", bare.as_uri(), cwd=repo, env=env)
    git("push", "-q", "origin", "main", cwd=repo, env=env)

    # before the branch is seeded, the night stops at the fetch with exit 2 and says what to do
    ws0 = tmp_path / "ws0"
    checkout(bare, ws0, env)
    values = {"github.workspace": str(ws0)}
    step_env = dict(env, **{k: expand(str(v), values) for k, v in wf_env.items()})
    r = run_bash(expand(scripts["fetch"], values), ws0, step_env)
    assert r.returncode == 2 and "seed it" in r.stdout, (r.returncode, r.stdout, r.stderr)

    # a search database at the repository root (the H200 nightly fixture), and a write-ahead log
    # holding a write that the database file does not have yet
    with gzip.open(ROOT / "tests" / "data" / "h200-nightly.db.gz", "rb") as src:
        (repo / "nf4tune.db").write_bytes(src.read())
    writer = sqlite3.connect(repo / "nf4tune.db")
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE docs_test_wal(x)")
    writer.execute("INSERT INTO docs_test_wal VALUES (42)")
    writer.commit()
    assert (repo / "nf4tune.db-wal").stat().st_size > 0
    want = dump(repo / "nf4tune.db")
    status_before = git("status", "--porcelain", "--ignored", cwd=repo, env=env)

    # docs/nightly.md, "Seed the data branch", from the repository root
    ok(run_bash(block("nightly-seed"), repo, env), "the seed block")
    seeded = tmp_path / "seeded.db"
    seeded.write_bytes(git_bytes("show", "nightly-data:nf4tune.db", cwd=bare, env=env))
    assert dump(seeded) == want, "the seeded database is not the search database (with its write-ahead log)"
    assert git("ls-tree", "--name-only", "nightly-data", cwd=bare, env=env).split() == ["nf4tune.db"]
    assert git("rev-list", "--count", "nightly-data", cwd=bare, env=env).strip() == "1"
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=repo, env=env).strip() == "main"
    status_after = git("status", "--porcelain", "--ignored", cwd=repo, env=env)
    assert status_after == status_before, "the seed block changed the checkout"
    writer.close()

    # two nights of the workflow: one commit each, each holding the database its night left
    for i, rc in enumerate(("0", "1"), start=1):
        db = night(bare, tmp_path / f"night{i}", env, rc, wf_env, scripts)
        assert git_bytes("show", "nightly-data:nf4tune.db", cwd=bare, env=env) == db.read_bytes()
        assert git("rev-list", "--count", "nightly-data", cwd=bare, env=env).strip() == str(1 + i)
        subject = git("log", "-1", "--format=%s", "nightly-data", cwd=bare, env=env)
        assert re.fullmatch(rf"nightly \d{{4}}-\d\d-\d\d: regress exit {rc}\n", subject), subject

    # seeding again is refused and leaves the nights as they were
    tip = git("rev-parse", "nightly-data", cwd=bare, env=env)
    r = run_bash(block("nightly-seed"), repo, env)
    assert r.returncode != 0 and git("rev-parse", "nightly-data", cwd=bare, env=env) == tip

    # "Rehearse a night on the runner", in a runner's checkout
    runner = tmp_path / "runner"
    checkout(bare, runner, env)
    if gpu_visible():
        pytest.skip("a GPU is visible: the rehearsal would run a real night (the GPU suite covers regress)")
    r = run_bash(block("nightly-rehearse"), runner, env, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "failed its check" in r.stdout and "exit 2" in r.stdout, r.stdout
    assert (runner / "data" / "nf4tune.db").read_bytes() == git_bytes("show", "nightly-data:nf4tune.db", cwd=bare,
                                                                      env=env)
    assert not (runner / "nightly-report").exists()

    # "Look back": the night before the last, rebuilt into a report (in the same shallow checkout)
    ok(run_bash(block("nightly-history"), runner, env, timeout=300), "the history block")
    con = sqlite3.connect(f"file:{runner / 'night-before.db'}?mode=ro", uri=True)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 1       # night 1 of 2
    con.close()
    assert (runner / "report-night-before" / "index.html").is_file()


# --- the PostgreSQL fleet -------------------------------------------------------------------------

def test_the_fleet_set_up_against_postgresql(tmp_path):
    pg = os.environ.get("NF4TUNE_TEST_POSTGRES_URL")
    if not pg:
        pytest.skip("no PostgreSQL server (set NF4TUNE_TEST_POSTGRES_URL; .ci/run starts one)")
    if not shutil.which("psql"):
        pytest.skip("no psql on PATH (PostgreSQL's client; .ci/postgres.sh installs it with the server)")
    import sqlalchemy as sa

    admin = sa.engine.make_url(pg)
    host, port = admin.host or "127.0.0.1", str(admin.port or 5432)
    tag = uuid.uuid4().hex[:10]
    dbname, role = f"nf4tune_fleet_{tag}", f"nf4tune_worker_{tag}"

    def as_here(text: str) -> str:
        """The user's edits: their database host, and names unique to this run."""
        text = text.replace("-h dbhost -p 5432", f"-h {host} -p {port}").replace("dbhost:5432", f"{host}:{port}")
        assert "dbhost" not in text, "a fleet block names the database host in a form this test does not edit"
        return text.replace("nf4tune_fleet", dbname).replace("nf4tune_worker", role)

    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sudo").write_text('#!/bin/sh\n# test shim: "sudo -u USER CMD ..." runs CMD; PGUSER names the admin\n'
                               'while [ "$1" = -u ]; do shift 2; done\nexec "$@"\n')
    (shim / "sudo").chmod(0o755)
    env = shell_env(tmp_path, PGHOST=host, PGPORT=port, PGUSER=admin.username or "postgres")
    if admin.password:
        env["PGPASSWORD"] = admin.password
    url = f"postgresql+psycopg://{role}:change-me@{host}:{port}/{dbname}"
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples" / "models").mkdir(parents=True)
    shutil.copy2(ROOT / "examples" / "models" / "llama-3-8b.json", work / "examples" / "models")
    eng = sa.create_engine(pg, isolation_level="AUTOCOMMIT")
    try:
        # 1. the role and the database
        ok(run_bash(as_here(block("fleet-database")), work, env), "the fleet's database block")
        # 2. the schema: nf4-tune's tables at the newest revision, and optuna's
        ok(run_bash(as_here(block("fleet-schema")), work, env), "the fleet's schema block")
        from nf4tune.db import Repository, connect
        from nf4tune.db._engine import current_revision, head_revision

        db = connect(url, upgrade_schema=False)
        assert current_revision(db.engine) == head_revision()
        assert "studies" in sa.inspect(db.engine).get_table_names()
        # 3. a worker: without a GPU it says so, exits 2 and writes nothing
        if not gpu_visible():
            r = run_bash(as_here(block("fleet-worker")), work, env, timeout=300)
            assert r.returncode == 2 and "no CUDA GPU" in r.stderr, (r.returncode, r.stdout, r.stderr)
            with db.engine.connect() as c:
                assert c.execute(sa.text("SELECT count(*) FROM runs")).scalar() == 0
                assert c.execute(sa.text("SELECT count(*) FROM studies")).scalar() == 0
        # what a worker's search leaves: one measured best config
        repo = Repository(db)
        _a_finished_search(repo)
        db.dispose()
        # 4. the table and the report, from any host
        ok(run_bash(as_here(block("fleet-collect")), work, env, timeout=300), "the fleet's collect block")
        import json

        table = json.loads((work / "fleet-configs.json").read_text())
        assert [(e["gpu"], e["shape"], e["m"]) for e in table["entries"]] == [("NVIDIA H200", [4096, 4096], None)]
        assert (work / "fleet-report" / "index.html").is_file()
        # 5. the backup
        if shutil.which("pg_dump"):
            ok(run_bash(as_here(block("fleet-backup")), work, env), "the fleet's backup block")
            dumps = list(work.glob("nf4tune-fleet-*.dump"))
            assert len(dumps) == 1 and dumps[0].read_bytes()[:5] == b"PGDMP"
    finally:
        with eng.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
            c.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
        eng.dispose()


def _a_finished_search(repo) -> None:
    from nf4tune.families import DEQUANT
    from nf4tune.kernel.gpu import GPUInfo
    from nf4tune.measure import record
    from nf4tune.vocabulary import Problem

    gpu = GPUInfo("NVIDIA H200", "sm_90", (9, 0), 132, 62914560, 150 << 30, "580.159.04")
    from nf4tune.db import ENV_FIELDS

    versions = {k: "13.0" if k == "nvrtc" else "test" for k in ENV_FIELDS}
    run = repo.start_run("search", record.gpu_row(repo, gpu), repo.environment(**versions))
    cfg = DEQUANT.preset("blog", dtype="bf16", quant="nf4")
    repo.add_measurement(run, Problem((4096, 4096), "bf16", "nf4", 64),
                         dict(label="trial", status="ok", median_us=13.8, samples_us=[13.8] * 5, speedup_vs_bnb=2.0),
                         repo.config(cfg.to_dict(), DEQUANT.template_hash()))
    repo.finish_run(run)


# --- links, sizes, words, commands ----------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path: Path) -> set:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("doc", OWN_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not bad, f"{doc.name}: " + "; ".join(bad)


def test_the_readme_is_at_most_25_kb():
    size = (ROOT / "README.md").stat().st_size
    assert size <= 25_000, f"README.md is {size:,} bytes"


@pytest.mark.parametrize("doc", OWN_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_name_facts_not_sessions_and_stay_short(doc):
    text = doc.read_text()
    hits = [line for line in text.splitlines() if re.search(r"session [0-9]", line, re.I)]
    assert not hits, (f"{doc.relative_to(ROOT)} speaks of development sessions (say the GPU, NVRTC version and "
                      f"date): {hits[:3]}")
    assert len(text.splitlines()) <= 1000


#: options the docs describe that other work adds to the command line (checked once they exist)
PENDING = {("bench", "--host"), ("bench", "--generate"), ("search", "--experimental"),
           ("space", "--experimental"), ("compile", "--experimental"), ("bench", "--experimental"),
           ("db", None)}
for _sub in ("best", "export", "report", "regress", "search", "bench"):
    PENDING.add((_sub, "--lock-timeout"))


def doc_commands():
    """Every ``nf4-tune ...`` command line in the docs' code blocks and code spans."""
    for doc in OWN_DOCS:
        text = doc.read_text()
        spans = re.findall(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", text)
        for span in spans:
            for line in span.replace("\\\n", " ").splitlines():
                for m in re.finditer(r"(?:^|[\s;|&(])nf4-tune((?:\s+[^\s;|&<>)]+)*)", line):
                    yield doc.relative_to(ROOT).as_posix(), "nf4-tune" + m.group(1)


def test_the_commands_in_the_docs_exist():
    from nf4tune.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    top = {o for a in parser._actions for o in a.option_strings}
    bad = []
    for where, cmd in doc_commands():
        try:
            words = shlex.split(cmd.replace("[", " ").replace("]", " "), comments=True)[1:]
        except ValueError:
            words = cmd.split()[1:]
        if not words or words[0] in ("...", "COMMAND"):
            continue
        sub = words[0]
        if sub.startswith("-"):
            if sub not in top:
                bad.append(f"{where}: {cmd} (no option {sub})")
            continue
        if sub not in subs:
            if (sub, None) not in PENDING:
                bad.append(f"{where}: {cmd} (no subcommand {sub})")
            continue
        known = {o for a in subs[sub]._actions for o in a.option_strings}
        for w in words[1:]:
            opt = w.split("=", 1)[0]
            if opt.startswith("--") and opt not in known and (sub, opt) not in PENDING:
                bad.append(f"{where}: {cmd} (nf4-tune {sub} has no {opt})")
    assert not bad, "\n".join(sorted(set(bad)))
