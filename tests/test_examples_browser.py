"""The FastAPI + Agents SDK example seen in a real browser (issue 28 item
2): the page follows the reply the example streams, live; after a reload
mid-stream it goes on with exactly the stored text; Stop in the page stops
the agent run (its model's stream is left) and the reply ends `aborted`
with the text the page shows."""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="the example needs openai-agents (the test extra)")
pytest.importorskip("fastapi", reason="the example needs fastapi (the test extra)")

from .conftest import ROOT  # noqa: E402
from .processes import ServeProcess, free_port  # noqa: E402
from .test_browser import browser, content_of, open_page  # noqa: E402,F401  (skips without Chromium)

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
WORDS = 600


def slow_model() -> tuple[http.server.ThreadingHTTPServer, dict[str, object]]:
    """An OpenAI-compatible server that says WORDS words, 20 ms apart, and
    notes whether its client left before the end."""
    seen: dict[str, object] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for i in range(WORDS):
                    delta = {"role": "assistant", "content": f"word{i} "}
                    body = dict(BASE, choices=[{"index": 0, "delta": delta, "finish_reason": None}])
                    self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(0.02)
                end = dict(BASE, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
                self.wfile.write(b"data: " + json.dumps(end).encode() + b"\n\ndata: [DONE]\n\n")
                seen["complete"] = True
            except OSError:
                seen["left"] = True

        def log_message(self, *args: object) -> None:
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[ServeProcess, int, dict[str, object]]]:
    sl = ServeProcess(str(tmp_path / "store"), free_port())
    sl.start()
    model, seen = slow_model()
    port = free_port()
    env = {**os.environ, "SESSIONLOG_URL": f"http://127.0.0.1:{sl.port}", "SESSIONLOG_TOKEN": sl.token,
           "OPENAI_BASE_URL": f"http://127.0.0.1:{model.server_address[1]}/v1", "OPENAI_API_KEY": "k",
           "MODEL": "m", "PYTHONPATH": str(ROOT)}
    app = subprocess.Popen([sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "warning"],
                           cwd=ROOT / "examples" / "fastapi_agents", env=env)
    try:
        import httpx
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/openapi.json").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert app.poll() is None and time.monotonic() < deadline, "the example app did not start"
            time.sleep(0.1)
        yield sl, port, seen
    finally:
        app.terminate()
        app.wait(10)
        model.shutdown()
        sl.stop()


def test_the_page_follows_the_examples_reply_resumes_after_a_reload_and_stops_its_agent(stack, browser):  # noqa: F811
    import httpx
    sl, port, seen = stack
    answer = httpx.post(f"http://127.0.0.1:{port}/chat", json={"content": "count for me"}, timeout=30).json()
    sid, rid = answer["session_id"], answer["reply_id"]
    page = open_page(browser, f"{sl.url}&s={sid}")
    page.wait_for_selector(f'[data-msg="{rid}"].running')
    page.wait_for_function(f'window.sessionlog.messages.get("{rid}").content.includes("word20 ")', timeout=60_000)
    before = content_of(page, rid)
    page.reload()
    page.wait_for_selector(".conn.online")
    page.wait_for_selector(f'[data-msg="{rid}"].running')
    page.wait_for_function(f'window.sessionlog.messages.get("{rid}").content.includes("word40 ")', timeout=60_000)
    assert content_of(page, rid).startswith(before)
    page.keyboard.press("Escape")  # Stop, in the page
    page.wait_for_selector(f'[data-msg="{rid}"].aborted', timeout=30_000)
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen.get("left") and not seen.get("complete"), "the agent run stopped: it left its model's stream"
    stored = httpx.get(f"http://127.0.0.1:{sl.port}/v1/sessions/{sid}", timeout=30,
                       headers={"Authorization": f"Bearer {sl.token}"}).json()
    m = next(m for m in stored["messages"] if m["msg_id"] == rid)
    assert m["status"] == "aborted" and m["metadata"]["aborted_reason"] == "stopped by user"
    page.wait_for_function(f'window.sessionlog.messages.get("{rid}").content.length === {len(m["content"])}')
    assert content_of(page, rid) == m["content"] and m["content"].startswith(before)
    assert not page.errors
