"""The Node side of the suite (tests/node/: the Durable Streams conformance
suite, the protocol's reference server and its TypeScript client, pinned by
tests/node/package-lock.json; clients/js/: our TypeScript client, its build
tools and its tests): installed with `npm ci` once per lock file change,
under a file lock (two test processes may ask at once)."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parent / "node"
JS_CLIENT_DIR = Path(__file__).resolve().parent.parent / "clients" / "js"


def node_tests(node_dir: Path = NODE_DIR) -> Path:
    """`node_dir` (tests/node/ by default) with its packages installed;
    skipped (a failure under CI) where Node and npm are missing."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI needs Node.js 20+ and npm for tests/node/")
        pytest.skip("no node/npm: install Node.js 20+ to run the Node-side tests")
    lock, stamp = node_dir / "package-lock.json", node_dir / "node_modules" / ".sessionlog-installed"
    with open(node_dir / ".install-lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
            subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=node_dir, check=True,
                           stdout=subprocess.DEVNULL, timeout=600)
            stamp.touch()
    return node_dir
