"""The page in real Chromium through Debian's nginx balancing two
`sessionlog serve --backend nats://…` workers on a real 3-node cluster: the
reply streams from the first worker; that worker is killed with SIGKILL;
the page reconnects on its own, through nginx, to the other worker, which
aborts the dead worker's reply "worker restart" once with the text that was
durable; the page shows exactly that text, and a retry streams to the end
on the live worker."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .test_browser import NGINX, browser, content_of, free_port, open_page, reply_id  # noqa: F401
from .test_scaleout import TOKEN, Worker, cluster  # noqa: F401

LB_CONF = """daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 128; }}
http {{
  access_log off;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
  upstream workers {{
    server 127.0.0.1:{one} max_fails=1 fail_timeout=60s;
    server 127.0.0.1:{two} backup;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://workers;
      proxy_next_upstream error timeout;
      proxy_connect_timeout 2s;
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


def test_the_page_moves_to_another_worker_when_its_own_is_killed(cluster, tmp_path: Path, browser):  # noqa: F811
    if not os.path.exists(NGINX):
        if os.environ.get("CI"):
            raise RuntimeError(f"CI needs nginx at {NGINX} (.ci/run installs Debian's nginx)")
        pytest.skip(f"no nginx at {NGINX}: install Debian's `nginx` to run this test")
    d = tmp_path / "nginx"
    (d / "tmp").mkdir(parents=True)
    port, one_port, two_port = free_port(), free_port(), free_port()
    (d / "nginx.conf").write_text(LB_CONF.format(d=d, port=port, one=one_port, two=two_port))
    extra = ("--public-url", f"http://localhost:{port}", "--forwarded-allow-ips", "127.0.0.1", "--agent-speed", "12")
    one = Worker(cluster, tmp_path / "w1", one_port, "SBROWSER", *extra)
    two = Worker(cluster, tmp_path / "w2", two_port, "SBROWSER", *extra)
    one.start()
    two.start()
    proxy = subprocess.Popen([NGINX, "-p", str(d), "-c", str(d / "nginx.conf"), "-e", str(d / "error.log")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proxy.poll() is None, proxy.stderr.read() if proxy.stderr else "nginx ended"
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)
        page = open_page(browser, f"http://localhost:{port}/?token={TOKEN}")
        page.fill("#input", "Write a long answer, please")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant.running")
        mid = reply_id(page)
        page.wait_for_function(f'document.querySelector(\'[data-msg="{mid}"] .bubble\').innerText.length > 40')
        one.kill()  # the worker streaming the reply, and holding the page's socket
        page.wait_for_selector(f'[data-msg="{mid}"].aborted', timeout=45_000)  # reconnected, through nginx, to two
        assert "worker restart" in page.locator(f'[data-msg="{mid}"] .why').inner_text()
        shown = content_of(page, mid)
        assert len(shown) > 0

        import trio

        from sessionlog_store.server.edge.client import open_client

        async def durable() -> str:
            async with open_client("127.0.0.1", two_port, TOKEN) as c:
                rows = (await c.request("list_sessions"))["rows"]
                msgs = (await c.request("load_session", session_id=rows[0]["id"]))["messages"]
                [m] = [m for m in msgs if m["msg_id"] == mid]
                assert m["status"] == "aborted"
                return str(m["content"])
        assert shown == trio.run(durable), "the page shows exactly the text that is durable"
        page.locator(f'[data-msg="{mid}"] .retry').click()
        page.wait_for_function(f'[...document.querySelectorAll(".msg.assistant")].some('
                               f'e => e.dataset.msg !== "{mid}")')
        page.wait_for_selector(".msg.assistant.done", timeout=90_000)
        assert page.locator(".msg.assistant.done").count() == 1
        assert not page.errors  # type: ignore[attr-defined]
    finally:
        proxy.terminate()
        proxy.wait(10)
        one.stop()
        two.stop()
