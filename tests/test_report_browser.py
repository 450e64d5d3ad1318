"""The report in a real headless browser (Debian's chromium, which .ci/run installs): the page
loads from disk with no network and no script errors, every chart renders, the nightly flags
are visible, and a screenshot is saved ($NF4TUNE_SCREENSHOT_DIR keeps a copy)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reports import build_report, collect
from tuner.track.nightly import run_regress

from test_regress_job import GPU, ENV, FakeMeasure, _seeded_repo


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("NF4TUNE_REQUIRE_CHROMIUM"):
        pytest.fail("no chromium on PATH, and NF4TUNE_REQUIRE_CHROMIUM is set (CI installs it)")
    pytest.skip("no chromium on PATH (apt-get install chromium)")


def _flagged_site(tmp_path) -> Path:
    """A database with a search, quiet nights and a confirmed regression, and its report."""
    url = f"sqlite:///{tmp_path / 'nightly.db'}"
    repo = _seeded_repo(url)
    fake = FakeMeasure(seed=5)
    for _ in range(4):
        run_regress(repo, GPU, measure=fake, env=ENV)
    fake.slow["8192x8192 bf16 nf4 bs64"] = 1.3
    assert run_regress(repo, GPU, measure=fake, env=dict(ENV, driver="590.0")).exit_code == 1
    site = tmp_path / "site"
    build_report(collect(repo, url), site)
    return site


def _browser(chromium, *args, timeout=120):
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader",
            "--disable-background-networking", "--no-first-run", "--enable-logging=stderr", "--v=0"]
    return subprocess.run(base + list(args), capture_output=True, text=True, timeout=timeout)


def test_report_renders_in_headless_chromium_with_flags_visible(tmp_path):
    chromium = _chromium()
    site = _flagged_site(tmp_path)
    url = (site / "index.html").as_uri()
    r = _browser(chromium, "--virtual-time-budget=8000", "--dump-dom", url)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    body = re.search(r"<body([^>]*)>", dom).group(1)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))
    assert attrs.get("checked") == "1", "the page's self-check never ran"
    assert attrs["errors"] == "[]", f"script errors in the page: {attrs['errors']}"
    assert int(attrs["charts-expected"]) >= 3        # two histories and the knob heatmap
    assert attrs["charts-rendered"] == attrs["charts-expected"], attrs
    assert not re.search(r"Uncaught|net::ERR_", r.stderr), r.stderr[-2000:]
    # the flags: the overview cell, the flags table, and the marker on the history chart
    assert re.search(r"class=\"flag-bad nightly\"[^>]*data-flag=\"regression\"", dom)
    assert "<table id=\"flags\">" in dom and "driver: 580.1 → 590.0" in dom
    assert re.search(r"<text[^>]*>regression</text>", dom), "no flagged point drawn on a history chart"

    shot = tmp_path / "report.png"
    r = _browser(chromium, "--virtual-time-budget=8000", "--window-size=1400,2400", f"--screenshot={shot}", url)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    keep = os.environ.get("NF4TUNE_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "report.png")
