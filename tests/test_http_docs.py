"""docs/HTTP.md as written: its curl examples run verbatim against a live
server, and it names every route of the API and every error code's status."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import trio

from sessionlog_store.server.edge.api import ROUTES, STATUS

from .test_deploy import start
from .test_ws import TOKEN

DOC = Path(__file__).resolve().parent.parent / "docs" / "HTTP.md"


def curl_blocks() -> list[str]:
    section = DOC.read_text().split("## Try it with curl", 1)[1]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("jq") is None,
                    reason="curl and jq are needed (.ci/run installs them)")
async def test_the_curl_examples_run_as_written(root, nursery):
    server = await start(nursery, root)
    blocks = curl_blocks()
    assert len(blocks) >= 3
    script = "set -euo pipefail\n" + "\n".join(blocks)
    env = {**os.environ, "URL": f"http://127.0.0.1:{server.port}", "TOKEN": TOKEN}
    with trio.fail_after(60):
        done = await trio.run_process(["bash", "-c", script], capture_stdout=True, capture_stderr=True, env=env,
                                      check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    lines = out.splitlines()
    assert "Hello, world." in lines and "world." in lines, out
    assert "event: control" in out and '"streamClosed": true' in out
    assert lines[-1] == "done"


def test_the_doc_names_every_route_and_every_codes_status():
    text = DOC.read_text()
    for r in ROUTES:
        shown = re.sub(r"\{session_id\}", "{id}", r.path)
        assert f"`{r.method} {shown}" in text, f"docs/HTTP.md does not name {r.method} {shown}"
    table = text.split("| Status | Codes |", 1)[1].split("\n\n", 1)[0]
    rows = {int(m[1]): m[2] for m in re.finditer(r"^\| (\d{3}) \| (.*) \|$", table, flags=re.M)}
    for code, status in STATUS.items():
        assert f"`{code}`" in rows.get(status, ""), f"{code} ({status}) is not in docs/HTTP.md's status table"
