"""A new study starts from everything known: on a fresh database, the packaged table's (and the per-user
table's) best configs of the nearest problems, several and across batch buckets, this GPU model's first."""

import pytest

from nf4tune.db import Repository, connect
from nf4tune.families import MATMUL as MM
from nf4tune.serve import table as T
from nf4tune.tune.search import WARM_STARTS, warm_starts
from nf4tune.vocabulary import Problem

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def fresh_repo(tmp_path):
    return Repository(connect(f"sqlite:///{tmp_path / 'fresh.db'}"))


def test_a_fresh_database_starts_from_the_tables_nearest_configs(fresh_repo):
    T.use_configs(None)
    table = T.current_table()
    for prob in (Problem((18944, 3584), "bf16", "nf4", 64, "matmul", 1),
                 Problem((3072, 8192), "bf16", "nf4", 64, "matmul", 16)):
        starts = warm_starts(fresh_repo, H100, prob, table)
        assert len(starts) == WARM_STARTS and len(set(starts)) == len(starts)
        assert all(c.m == prob.m and c.dtype == prob.dtype and MM.violation(c.to_dict()) is None for c in starts)
        mine = [e for e in table.entries if e.gpu == H100 and e.problem.family == "matmul"]
        same_bucket = {MM.for_problem(e.config, prob) for e in mine if e.problem.m == prob.m}
        # the batch bucket's own configs come first, then the neighbouring buckets'
        k = len([c for c in starts if c in same_bucket])
        assert k >= 2 and all(c in same_bucket for c in starts[:k])
        assert any(c not in same_bucket for c in starts)                       # across batch buckets


def test_the_database_and_the_table_both_count_and_this_gpu_comes_first(fresh_repo, tmp_path):
    T.use_configs(None)
    prob = Problem((8192, 8192), "fp16", "nf4", 64, "dequant")
    starts = warm_starts(fresh_repo, "NVIDIA H200", prob, T.current_table())
    h200 = [e for e in T.current_table().entries if e.gpu == "NVIDIA H200" and e.problem.family == "dequant"]
    assert starts and starts[0] in {e.config.replace(dtype="fp16") for e in h200 if e.problem.dtype == "fp16"}
    # a GPU model nobody tuned still starts from the other models' configs
    assert warm_starts(fresh_repo, "NVIDIA B200", prob, T.current_table())
    empty = T.ConfigTable([], "empty")
    assert warm_starts(fresh_repo, "NVIDIA H200", prob, empty) == []
