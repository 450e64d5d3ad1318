import os
import secrets

import pytest


#: set to 1 to run the tests marked ``slow``: every distinct source of each family's default space compiled
#: (about 16 minutes on 2 cores, extrapolated from a timed sample). The weekly whole-space workflow sets it; the default run compiles
#: covering samples of the same spaces instead (every 3 source-knob values together).
WHOLE_SPACE = os.environ.get("NF4TUNE_WHOLE_SPACE") == "1"


def pytest_configure(config):
    """No test reads or writes the user's own per-user autotune table (~/.cache/nf4-tune/autotuned.json):
    the tests' is a path in a fresh folder that holds no table until a test writes one."""
    import tempfile

    os.environ["NF4TUNE_AUTOTUNE_TABLE"] = os.path.join(tempfile.mkdtemp(prefix="nf4tune-tests-"), "autotuned.json")
    os.environ.pop("NF4TUNE_AUTOTUNE", None)


def pytest_collection_modifyitems(config, items):
    from nf4tune.kernel.gpu import gpu_available

    marks = {}
    if not WHOLE_SPACE:
        marks["slow"] = pytest.mark.skip(reason="compiles a whole space (about 16 min on 2 cores): set "
                                                "NF4TUNE_WHOLE_SPACE=1 (the weekly whole-space workflow does)")
    if not gpu_available():
        marks["gpu"] = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        for name, mark in marks.items():
            if name in item.keywords:
                item.add_marker(mark)


DATA = os.path.join(os.path.dirname(__file__), "data")


def example_db(name: str, folder) -> str:
    """A fresh copy of the fixture database ``tests/data/<name>.db.gz`` (``h200-search``,
    ``h200-nightly``), unpacked into ``folder``; its path."""
    import gzip
    import shutil

    out = os.path.join(str(folder), f"{name}.db")
    with gzip.open(os.path.join(DATA, f"{name}.db.gz"), "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


@pytest.fixture(scope="session")
def nightly_db(tmp_path_factory):
    """The H200 nightly database, unpacked once per run (read-only uses only)."""
    return example_db("h200-nightly", tmp_path_factory.mktemp("fixtures"))


@pytest.fixture
def seed(request):
    """A fresh seed per test, printed on failure (pytest shows captured output)."""
    s = int(os.environ.get("NF4TUNE_TEST_SEED", secrets.randbits(31)))
    print(f"random seed {s} (rerun with NF4TUNE_TEST_SEED={s})")
    return s


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """One NVRTC cache shared by every test of the run."""
    return tmp_path_factory.mktemp("cubin-cache")


def fresh_database_url(kind: str, tmp_path) -> str:
    """A new, empty database: a SQLite file, or a fresh database on the PostgreSQL server that
    NF4TUNE_TEST_POSTGRES_URL names (.ci/run starts one; skipped without it)."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'nf4tune-test.db'}"
    pg = os.environ.get("NF4TUNE_TEST_POSTGRES_URL")
    if not pg:
        pytest.skip("no PostgreSQL server (set NF4TUNE_TEST_POSTGRES_URL; .ci/run starts one)")
    import uuid

    import sqlalchemy as sa

    name = "t_" + uuid.uuid4().hex[:12]
    eng = sa.create_engine(pg, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(sa.text(f"CREATE DATABASE {name}"))
    eng.dispose()
    return pg.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """Each storage backend in turn (optuna-style parametrisation)."""
    return fresh_database_url(request.param, tmp_path)
