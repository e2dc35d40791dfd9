"""The TypeScript client (clients/js/) under Node's own test runner: built
with tsc, its tests (clients/js/test/*.test.mjs) run against real `serve`
subprocesses they start (cut connections, a server restart mid-stream, a
graceful stop, Stop). Skipped (a failure under CI) without Node 20+."""
from __future__ import annotations

import os
import subprocess
import sys

from .conftest import ROOT
from .nodejs import JS_CLIENT_DIR, node_tests


def test_the_typescript_client_passes_its_node_tests() -> None:
    d = node_tests(JS_CLIENT_DIR)
    subprocess.run([str(d / "node_modules" / ".bin" / "tsc"), "-p", "."], cwd=d, check=True, timeout=300)
    run = subprocess.run(["node", "--experimental-websocket", "--test", "test/"], cwd=d, capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, SESSIONLOG_PYTHON=sys.executable))
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "# fail 0" in run.stdout and "# pass 0" not in run.stdout, run.stdout[-5000:]


def test_the_committed_page_bundle_is_built_from_its_source() -> None:
    """The page runs on the TypeScript client: static/app.js is esbuild's
    bundle of clients/page/app.js and clients/js/src/, committed so that the
    server needs no Node. A change to either without `python3 dev.py page`
    fails here."""
    node_tests(JS_CLIENT_DIR)
    sys.path.insert(0, str(ROOT))
    import dev
    built = dev.page_bundle()
    assert b"clients/js/src/socket.ts" in built, "the page is bundled with the client's WebSocket module"
    assert b"@durable-streams" not in built, "the page uses the client's WebSocket side only (tree-shaken)"
    assert dev.PAGE_BUNDLE.read_bytes() == built, "static/app.js is stale: run `python3 dev.py page`"
