from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Projects must lie under a project root, the home directory by default
# (docs/SECURITY.md): HOME is the temp folder that holds pytest's tmp_path
# folders, set before any test module builds a StoreConfig, and inherited by
# every server subprocess.
os.environ["HOME"] = tempfile.gettempdir()


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "store")


def child(code: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    """Start a Python child running `code` with the project on its path
    (`stdin`: with a pipe to its standard input)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE if stdin else None, text=True, env=env)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli_env({}, *args)


def run_cli_env(extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`sessionlog ARGS` in a subprocess, with `extra` in its environment."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    return subprocess.run([sys.executable, "-m", "sessionlog_store", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def source_copy(dest: Path) -> Path:
    """The checkout's files (no .venv, .git, build output or caches) copied to
    `dest`: a build there writes its egg-info and build/ there, not into the
    checkout another test process may be building from too."""
    import shutil
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".venv", ".git", "*.egg-info", "build", "dist", "__pycache__", ".pytest_cache", "node_modules", ".mypy_cache"))
    return dest


def read_logs(root: str) -> dict[str, bytes]:
    """Every session log under root, by session id, as bytes."""
    from sessionlog_store.eventstore.local.fsio import OS_FILES
    from sessionlog_store.eventstore.local.log import list_session_ids, log_path
    out = {}
    for sid in list_session_ids(OS_FILES, root):
        with open(log_path(root, sid), "rb") as f:
            out[sid] = f.read()
    return out


@pytest.fixture
def second_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real second filesystem (a tmpfs mount): another st_dev than the data root."""
    mnt = tmp_path / "second-fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture(scope="session")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real 3-node JetStream cluster for every test that only writes to
    it (each uses streams of its own names); a test that kills a node starts
    its own."""
    pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")
    from .nats_cluster import NatsCluster
    with NatsCluster(tmp_path_factory.mktemp("nats")) as c:
        yield c
