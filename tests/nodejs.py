"""The Node side of the suite (tests/node/: the Durable Streams conformance
suite, the protocol's reference server and its TypeScript client, pinned by
tests/node/package-lock.json): installed with `npm ci` once per lock file
change, under a file lock (two test processes may ask at once)."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parent / "node"


def node_tests() -> Path:
    """tests/node/ with its packages installed; skipped (a failure under CI)
    where Node and npm are missing."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI needs Node.js 20+ and npm for tests/node/")
        pytest.skip("no node/npm: install Node.js 20+ to run the Node-side tests")
    lock, stamp = NODE_DIR / "package-lock.json", NODE_DIR / "node_modules" / ".sessionlog-installed"
    with open(NODE_DIR / ".install-lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
            subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=NODE_DIR, check=True,
                           stdout=subprocess.DEVNULL, timeout=600)
            stamp.touch()
    return NODE_DIR
