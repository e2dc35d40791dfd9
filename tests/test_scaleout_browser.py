"""The page in real Chromium through Debian's nginx balancing two
`sessionlog serve --backend nats://…` workers on a real 3-node cluster: the
reply streams from the first worker; that worker is killed with SIGKILL;
the page reconnects on its own, through nginx, to the other worker, which
aborts the dead worker's reply "worker restart" once with the text that was
durable; the page shows exactly that text, and a retry streams to the end
on the live worker."""
from __future__ import annotations

from pathlib import Path

from .processes import NGINX_HEAD, NGINX_PROXY, free_port, start_nginx, stop_nginx
from .test_browser import browser, content_of, open_page, reply_id  # noqa: F401
from .test_scaleout import TOKEN, Worker

LB_CONF = NGINX_HEAD + """  upstream workers {{
    server 127.0.0.1:{one} max_fails=1 fail_timeout=60s;
    server 127.0.0.1:{two} backup;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://workers;
      proxy_next_upstream error timeout;
      proxy_connect_timeout 2s;
""" + NGINX_PROXY + """    }}
  }}
}}
"""


def test_the_page_moves_to_another_worker_when_its_own_is_killed(nats_cluster, tmp_path: Path, browser):  # noqa: F811 (the imported fixture)
    port, one_port, two_port = free_port(), free_port(), free_port()
    extra = ("--public-url", f"http://localhost:{port}", "--forwarded-allow-ips", "127.0.0.1", "--agent-speed", "12")
    one = Worker(nats_cluster, tmp_path / "w1", one_port, "SBROWSER", *extra)
    two = Worker(nats_cluster, tmp_path / "w2", two_port, "SBROWSER", *extra)
    one.start()
    two.start()
    d = tmp_path / "nginx"
    try:
        proxy = start_nginx(d, LB_CONF.format(d=d, port=port, one=one_port, two=two_port), port)
    except BaseException:
        one.stop()
        two.stop()
        raise
    try:
        page = open_page(browser, f"http://localhost:{port}/#token={TOKEN}")
        page.fill("#input", "Write a long answer, please")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.assistant.running")
        mid = reply_id(page)
        page.wait_for_function(f'document.querySelector(\'[data-msg="{mid}"] .bubble\').innerText.length > 40')
        one.kill()  # the worker streaming the reply, and holding the page's socket
        page.wait_for_selector(f'[data-msg="{mid}"].aborted', timeout=45_000)  # reconnected, through nginx, to two
        assert "the server restarted" in page.locator(f'[data-msg="{mid}"] .why').inner_text()
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
        stop_nginx(proxy)
        one.stop()
        two.stop()
