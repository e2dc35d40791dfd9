"""What a packager takes: the sdist holds what its tests need and collects
them without an error; it builds without setuptools' deprecation warnings;
the version is the CHANGELOG's newest."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tomllib

import pytest

from .conftest import ROOT, source_copy

pytestmark = pytest.mark.slow


def _version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def test_the_version_is_the_changelogs_newest_release():
    text = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert released and released[0] == _version(), (released[:3], _version())
    assert "## [Unreleased]" in text and text.index("## [Unreleased]") < text.index(f"## [{released[0]}]")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    out = tmp_path_factory.mktemp("sdist")
    src = source_copy(tmp_path_factory.mktemp("src") / "tree")  # (a build writes into its tree)
    r = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                        "print(b.build_sdist(sys.argv[1]))", str(out)],
                       cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    name = r.stdout.strip().splitlines()[-1]
    return out / name, r.stderr


def test_the_sdist_builds_without_deprecation_warnings(sdist):
    _, stderr = sdist
    assert "Deprecat" not in stderr, stderr[-3000:]


def test_the_sdist_holds_the_package_its_tests_and_their_helpers(sdist):
    path, _ = sdist
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (this is an sdist): no file list to compare with")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    want = {p for p in tracked if not p.startswith(".") and os.path.exists(ROOT / p)}
    # a file of a checkout that git does not track yet ships too; it is not the sdist's fault
    untracked = set(subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=ROOT,
                                   capture_output=True, text=True, check=True).stdout.split())
    with tarfile.open(path) as t:
        top = f"sessionlog_store-{_version()}/"
        names = {m.name[len(top):] for m in t.getmembers() if m.isfile()}
    missing = want - names
    assert not missing, sorted(missing)[:20]
    extra = {n for n in names - want - untracked
             if not n.startswith("sessionlog_store.egg-info/")} - {"PKG-INFO", "setup.cfg"}
    assert not extra, sorted(extra)[:20]


def test_the_sdists_tests_collect_without_an_error(sdist, tmp_path):
    path, _ = sdist
    with tarfile.open(path) as t:
        t.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    env = {**os.environ, "PYTHONPATH": str(unpacked)}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                       cwd=unpacked, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "error" not in r.stdout.lower().splitlines()[-1], r.stdout[-2000:]
    # the tests import the unpacked copy, not this checkout
    assert "tests collected" in r.stdout and int(r.stdout.split(" tests collected")[0].split()[-1]) > 400
