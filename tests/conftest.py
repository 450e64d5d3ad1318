import os
import secrets

import pytest


def pytest_collection_modifyitems(config, items):
    from tuner.gpu import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
