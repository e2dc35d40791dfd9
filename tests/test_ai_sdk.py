"""The Vercel AI SDK, unchanged (issue 28 item 4): examples/ai_sdk_react/,
a React app on the real `ai` and `@ai-sdk/react` packages (useChat with its
default transport, `resume: true`; nothing of sessionlog's but the endpoint
URL), bundled by esbuild, served by the test from another origin, in
Chromium, against a real `serve` whose demo agent makes a tool call: the
reply streams live with its tool call shown, survives a reload mid-stream
(the hook resumes it and it ends with exactly the stored text), and the
chat's messages come back after a reload once it ended."""
from __future__ import annotations

import functools
import http.server
import json
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionlog_store.server.edge.aisdk import chat_session

from .conftest import ROOT
from .nodejs import node_tests
from .processes import ServeProcess, free_port
from .test_browser import browser  # noqa: F401  (skips without Chromium)

APP = ROOT / "examples" / "ai_sdk_react"
TOKEN = "ai-sdk-token"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[int]:
    """The example's bundle (as its `npm run build` makes it), served on a port of its own."""
    d = node_tests(APP)
    out = tmp_path / "app"
    out.mkdir()
    subprocess.run([str(d / "node_modules" / ".bin" / "esbuild"), "src/app.jsx", "--bundle", "--format=esm",
                    "--jsx=automatic", '--define:process.env.NODE_ENV="production"', f"--outfile={out / 'app.js'}"],
                   cwd=d, check=True, capture_output=True, timeout=300)
    (out / "index.html").write_bytes((APP / "index.html").read_bytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def sessionlog(tmp_path: Path, app: int) -> Iterator[ServeProcess]:
    proc = ServeProcess(str(tmp_path / "data"), free_port(), speed=12.0, token=TOKEN, log=tmp_path / "serve.log",
                        extra=("--allow-origin", f"http://127.0.0.1:{app}"))
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def stored(port: int, chat: str) -> list[dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/sessions/{chat_session('', chat)}",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["messages"]


SHOWN_TEXT = """() => [...document.querySelectorAll('.msg.assistant')].at(-1)
    ?.querySelectorAll('.text') ?? []"""


def shown(page) -> str:  # type: ignore[no-untyped-def]
    """The last assistant message's text as the hook holds it (its text parts, in order)."""
    return page.evaluate(f"() => [...({SHOWN_TEXT})()].map(p => p.textContent).join('')")


def test_use_chat_streams_shows_the_tool_call_and_resumes_after_a_reload(sessionlog, app, browser):  # noqa: F811
    api = f"http://127.0.0.1:{sessionlog.port}/v1/ai/chat"
    chat = "aisdkchat1"
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{app}/?api={api}&token={TOKEN}&chat={chat}")
    page.wait_for_selector("#status[data-status=ready]")
    page.fill("#input", "search for durable logs")
    page.press("#input", "Enter")
    # live: text, then the tool call where it happened, with its result
    page.wait_for_selector(".msg.assistant .tool[data-state=output-available] summary:has-text('search')",
                           timeout=60_000)
    page.wait_for_function(f"() => [...({SHOWN_TEXT})()].map(p => p.textContent).join('').length > 40")
    reply = next(m for m in stored(sessionlog.port, chat) if m["role"] == "assistant" and not m["caller"])
    assert reply["status"] == "running", "the reload must come mid-stream"
    before = shown(page)
    page.reload()
    # useChat({resume: true}) asks GET {api}/{id}/stream and rebuilds the reply from its whole replay
    page.wait_for_function(f"() => [...({SHOWN_TEXT})()].map(p => p.textContent).join('').length > {len(before)}",
                           timeout=60_000)
    page.wait_for_selector("#status[data-status=ready]", timeout=60_000)
    final = next(m for m in stored(sessionlog.port, chat) if m["msg_id"] == reply["msg_id"])
    assert final["status"] == "done"
    assert shown(page) == final["content"]
    assert page.locator(".msg.assistant .tool summary:has-text('search')").count() == 1
    assert page.locator(".msg.user").count() == 1, "the user's message came back with the chat's messages"
    # once it ended, a reload shows the chat from its messages (the resume route answers 204)
    page.reload()
    page.wait_for_selector(".msg.assistant .text")
    assert shown(page) == final["content"]
    assert not errors, errors
