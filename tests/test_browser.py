"""The web page in a real headless Chromium (Debian's), driven by Playwright,
against a real `sessionlog serve` process. Skipped, with a message, where no
Chromium is installed; under CI (CI=true) a missing Chromium is a failure."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionlog_store.eventstore.fsio import OS_FILES
from sessionlog_store.projections.recovery import load_session_state

from .conftest import ROOT

CHROMIUM = os.environ.get("SESSIONLOG_CHROMIUM", "/usr/bin/chromium")
TOKEN = "browser-test-token"
SHOTS = os.environ.get("SESSIONLOG_SCREENSHOTS")  # a folder: save the README's screenshots there

if not os.path.exists(CHROMIUM):
    if os.environ.get("CI"):
        raise RuntimeError(f"CI needs Chromium at {CHROMIUM} for the browser tests (.ci/run installs it)")
    pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's `chromium` to run the browser tests",
                allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        # Two tabs at once: keep the one in the background rendering (Playwright polls
        # selectors on animation frames, which a backgrounded tab does not get).
        "--disable-renderer-backgrounding", "--disable-background-timer-throttling",
        "--disable-backgrounding-occluded-windows"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    def __init__(self, root: str, port: int, speed: float = 25.0, extra: tuple[str, ...] = (),
                 prefix: str = "") -> None:
        self.root, self.port, self.speed, self.extra, self.prefix = root, port, speed, extra, prefix
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}/?token={TOKEN}"

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sessionlog_store", "serve", "--root", self.root, "--port", str(self.port),
             "--token", TOKEN, "--agent-speed", str(self.speed), *self.extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            assert line, self.proc.stderr.read() if self.proc.stderr else "server ended"
            if "serving http://" in line:
                return
        raise AssertionError("server did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    s = ServeProcess(str(tmp_path / "store"), free_port())
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, url: str):  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1280, "height": 800}, bypass_csp=True)  # for wait_for_function
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector(".conn.online")
    page.errors = errors  # type: ignore[attr-defined]
    return page


def shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"))


def bubble_text(page, msg_id: str) -> str:  # type: ignore[no-untyped-def]
    return page.locator(f'[data-msg="{msg_id}"] .bubble').inner_text()


def reply_id(page) -> str:  # type: ignore[no-untyped-def]
    return page.locator(".msg.assistant").last.get_attribute("data-msg")


def log_text(root: str, sid: str, msg_id: str) -> tuple[str, str]:
    state, _ = load_session_state(OS_FILES, root, sid, use_snapshot=False)
    m = state.messages[msg_id]
    return m.content, m.status


def current_session(page) -> str:  # type: ignore[no-untyped-def]
    return page.evaluate("window.sessionlog.current")


def test_reload_mid_stream_continues_with_identical_text(serve, browser):
    page = open_page(browser, serve.url)
    page.fill("#input", "Explain the log, please")
    page.press("#input", "Enter")
    page.wait_for_selector(".msg.assistant.running")
    sid, mid = current_session(page), reply_id(page)
    other = open_page(browser, f"{serve.url}#s={sid}")  # never reloads
    other.wait_for_selector(f'[data-msg="{mid}"]')
    page.wait_for_function(f'document.querySelector(\'[data-msg="{mid}"] .bubble\').innerText.length > 60')
    shot(page, "streaming")
    before = bubble_text(page, mid)
    page.reload()
    page.wait_for_selector(".conn.online")
    page.wait_for_selector(f'[data-msg="{mid}"]')
    after = bubble_text(page, mid)
    assert after.startswith(before[: len(before) - 40]) and len(after) >= len(before) - 40
    page.wait_for_selector(f'[data-msg="{mid}"].done', timeout=60_000)
    other.wait_for_selector(f'[data-msg="{mid}"].done', timeout=60_000)
    final = bubble_text(page, mid)
    assert len(final) > len(before)
    assert final == bubble_text(other, mid)
    content, status = log_text(serve.root, sid, mid)
    assert status == "done" and final.strip() == content.strip()
    assert not page.errors and not other.errors
    shot(page, "list")


def test_backend_killed_mid_stream_shows_aborted_with_a_working_retry(serve, browser):
    page = open_page(browser, serve.url)
    page.fill("#input", "Write a long answer")
    page.press("#input", "Enter")
    page.wait_for_selector(".msg.assistant.running")
    mid = reply_id(page)
    page.wait_for_function(f'document.querySelector(\'[data-msg="{mid}"] .bubble\').innerText.length > 40')
    serve.kill()
    page.wait_for_selector(".conn.offline")
    serve.start()
    page.wait_for_selector(f'[data-msg="{mid}"].aborted', timeout=30_000)  # reconnected by itself
    assert "worker restart" in page.locator(f'[data-msg="{mid}"] .why').inner_text()
    assert len(bubble_text(page, mid)) > 0
    shot(page, "aborted-retry")
    page.locator(f'[data-msg="{mid}"] .retry').click()
    page.wait_for_function(f'[...document.querySelectorAll(".msg.assistant")].some('
                           f'e => e.dataset.msg !== "{mid}")')
    page.wait_for_selector(".msg.assistant.done", timeout=60_000)
    assert page.locator(".msg.assistant.done").count() == 1


def test_a_launched_chat_never_typed_into_survives_sigkill(serve, browser):
    page = open_page(browser, serve.url)
    page.click("#new-chat")
    page.wait_for_function("window.sessionlog.current !== null")
    sid = current_session(page)
    page.wait_for_selector(f'#sessions li[data-id="{sid}"]')
    serve.kill()
    serve.start()
    page.reload()
    page.wait_for_selector(".conn.online")
    page.wait_for_selector(f'#sessions li[data-id="{sid}"]')


def test_two_tabs_see_rename_archive_delete(serve, browser):
    a = open_page(browser, serve.url)
    a.fill("#input", "hello from tab a")
    a.press("#input", "Enter")
    a.wait_for_selector(".msg.assistant")
    sid = current_session(a)
    b = open_page(browser, serve.url)
    row = f'#sessions li[data-id="{sid}"]'
    b.wait_for_selector(row)

    def in_a(*steps):  # type: ignore[no-untyped-def]
        a.bring_to_front()
        for step in steps:
            step()
        b.bring_to_front()  # a background tab gets no animation frames, and Playwright polls on them

    in_a(lambda: a.click("#act-rename"), lambda: a.fill("#title-input", "Renamed in A"),
         lambda: a.press("#title-input", "Enter"))
    b.wait_for_function(f'document.querySelector(\'{row}\').innerText.includes("Renamed in A")')
    in_a(lambda: a.click("#act-archive"))
    b.wait_for_selector(row, state="detached")  # gone from the active view
    b.click('#views button[data-view="archived"]')
    b.wait_for_selector(row)
    in_a(lambda: a.click("#act-delete"), lambda: a.wait_for_selector("#act-delete.confirm"),
         lambda: a.click("#act-delete"))
    b.wait_for_selector(row, state="detached")
    assert not a.errors and not b.errors


def test_project_chip_states(serve, browser, tmp_path):
    folder = tmp_path / "myproject"
    folder.mkdir()
    page = open_page(browser, serve.url)
    page.evaluate(f'window.sessionlog.ws.send(JSON.stringify({{action: "create_project", name: "myproject", '
                  f'path: "{folder}"}}))')
    page.wait_for_selector('#project-picker option:has-text("myproject")', state="attached")
    page.select_option("#project-picker", label="myproject")
    shot(page, "project-draft")
    page.fill("#input", "work in my project")
    page.press("#input", "Enter")
    page.wait_for_selector("#project-chip.frozen")
    assert "myproject" in page.locator("#project-chip").inner_text()
    page.wait_for_selector(".msg.assistant.done", timeout=60_000)
    moved = tmp_path / "moved"
    folder.rename(moved)
    page.reload()
    page.wait_for_selector("#project-chip.missing")
    shot(page, "project-missing")
    page.click("#locate")
    page.fill("#locate-input", str(moved))
    page.press("#locate-input", "Enter")
    page.wait_for_selector("#project-chip:not(.missing)")
    page.wait_for_selector(".block.relocate")
    assert str(moved) in page.locator("#project-chip").inner_text()


def test_a_reconnecting_page_asks_only_for_what_it_missed(serve, browser):
    """The session list resumes exactly (issue 13, item 9): after its socket
    drops, the page sends `list_sessions` with `since` and ends with the rows a
    fresh list gives, deletes and renames made while it was away included."""
    import trio

    from sessionlog_store.server.edge.client import open_client

    async def changes(make: bool) -> list[str]:
        async with open_client("127.0.0.1", serve.port, TOKEN) as c:
            if make:
                ids = [(await c.request("create_session", title=f"s{k}"))["session"]["id"] for k in range(3)]
                return ids
            listed = await c.request("list_sessions", include_archived=True)
            return [r["id"] for r in listed["rows"]]
    ids = trio.run(changes, True)
    page = open_page(browser, serve.url)
    for sid in ids:
        page.wait_for_selector(f'#sessions li[data-id="{sid}"]')
    page.evaluate("""() => {
        const orig = WebSocket.prototype.send;
        window.sent = [];
        WebSocket.prototype.send = function (d) { window.sent.push(d); return orig.call(this, d); };
        window.sessionlog.backoff = 3000;
        window.sessionlog.ws.close();
    }""")
    page.wait_for_selector(".conn.offline")

    async def while_away() -> None:
        async with open_client("127.0.0.1", serve.port, TOKEN) as c:
            await c.request("rename_session", session_id=ids[0], title="renamed while away")
            await c.request("delete_session", session_id=ids[1])
            await c.request("create_session", title="made while away")
    trio.run(while_away)
    page.wait_for_selector(".conn.online", timeout=20_000)
    page.wait_for_selector(f'#sessions li[data-id="{ids[1]}"]', state="detached")
    page.wait_for_function(f'document.querySelector(\'#sessions li[data-id="{ids[0]}"]\')'
                           '.innerText.includes("renamed while away")')
    sent = page.evaluate("window.sent")
    assert any('"since"' in s for s in sent), sent
    fresh = trio.run(changes, False)
    shown = page.evaluate("[...window.sessionlog.sessions.keys()]")
    assert sorted(shown) == sorted(fresh)
    assert not page.errors


def test_the_page_works_under_a_path_prefix(tmp_path, browser):
    """Issue 15 item 2: with --root-path the page finds its files and its
    socket under the prefix (no hard-coded /static or /ws)."""
    s = ServeProcess(str(tmp_path / "store"), free_port(), speed=200.0, extra=("--root-path", "/chat"),
                     prefix="/chat")
    s.start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 800}, bypass_csp=True)
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url))
        page.on("websocket", lambda w: asked.append(w.url))
        page.goto(s.url)
        page.wait_for_selector(".conn.online")
        page.fill("#input", "Hello from under a prefix")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant.done", timeout=60_000)
        paths = {u.split(str(s.port), 1)[1].split("?")[0] for u in asked}
        assert paths and all(p.startswith("/chat/") for p in paths), paths
        assert "/chat/ws" in paths and "/chat/static/app.js" in paths
    finally:
        s.stop()


NGINX = os.environ.get("SESSIONLOG_NGINX", "/usr/sbin/nginx")

NGINX_CONF = """daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 128; }}
http {{
  access_log off;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {d}/cert.pem;
    ssl_certificate_key {d}/key.pem;
    location /chat/ {{
      proxy_pass http://127.0.0.1:{backend};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_set_header X-Forwarded-Host $http_host;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_read_timeout 3600s;
    }}
  }}
}}
"""


def test_behind_nginx_with_tls_and_a_sub_path(tmp_path, browser):
    """Issue 15 item 2: Debian's nginx in front (TLS with a self-signed
    certificate, the sub-path /chat/, the WebSocket upgrade); the page in
    Chromium and the Python client over wss:// both work through it."""
    if not os.path.exists(NGINX):
        if os.environ.get("CI"):
            raise RuntimeError(f"CI needs nginx at {NGINX} (.ci/run installs Debian's nginx)")
        pytest.skip(f"no nginx at {NGINX}: install Debian's `nginx` to run this test")
    d = tmp_path / "nginx"
    (d / "tmp").mkdir(parents=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    port, backend = free_port(), free_port()
    (d / "nginx.conf").write_text(NGINX_CONF.format(d=d, port=port, backend=backend))
    s = ServeProcess(str(tmp_path / "store"), backend, speed=200.0,
                     extra=("--public-url", f"https://localhost:{port}/chat", "--forwarded-allow-ips", "127.0.0.1"))
    s.start()
    proxy = subprocess.Popen([NGINX, "-p", str(d), "-c", str(d / "nginx.conf"), "-e", str(d / "error.log")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:  # nginx is up once it accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proxy.poll() is None, proxy.stderr.read() if proxy.stderr else "nginx ended"
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)
        ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 800})
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"https://localhost:{port}/chat/?token={TOKEN}")
        page.wait_for_selector(".conn.online")
        page.fill("#input", "Hello through nginx")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant.done", timeout=60_000)
        assert not errors
        ctx.close()

        import ssl

        import trio

        from sessionlog_store.server.edge.client import open_client
        tls = ssl.create_default_context(cafile=str(d / "cert.pem"))

        async def over_wss() -> int:
            async with open_client("localhost", port, TOKEN, ssl_context=tls, root_path="/chat") as c:
                return len((await c.request("list_sessions"))["rows"])
        assert trio.run(over_wss) == 1
    finally:
        proxy.terminate()
        proxy.wait(10)
        s.stop()
