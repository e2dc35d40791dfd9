"""python -m bench page [--quick] [--baseline REV]: the web page's cost while
a long reply streams and the user types (issue 30 item 4), the page of this
tree beside the page of REV (default 334a7fa, the page before the reply was parsed
from its last finished block) in the same run, on the same server.

A `serve` subprocess; Debian's Chromium, headless, driven by Playwright; a
producer (a thread of this process, over HTTP: the server and the browser
are processes of their own) streams a 50 KB Markdown reply as a model does,
~200 characters every 40 ms, while the page's user types a character every
60 ms into the composer. The baseline is the same server with its page's
script swapped for REV's (a Playwright route). The page reports, through
the browser's own observers: long tasks (over 50 ms: their count and the
longest) and keystroke latency (the Event Timing API: a keydown's start to
the next paint after it; Chromium reports only those of 16 ms or more,
the others count as under 16)."""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from typing import Any

from bench.client_reads import TOKEN, _serve  # (a `serve` on a free port, with its token)
from bench.report import pct, save, table, verdict

CHROMIUM = os.environ.get("SESSIONLOG_CHROMIUM", "/usr/bin/chromium")
OBSERVE = """
window.__perf = { long: [], painted: [] };
new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__perf.long.push(e.duration); })
  .observe({ type: "longtask", buffered: true });
// a keydown's next frame painted: a task after the frame's rendering (its time in the epoch's ms)
document.addEventListener("keydown", () => requestAnimationFrame(() => {
  const c = new MessageChannel();
  c.port1.onmessage = () => window.__perf.painted.push(performance.timeOrigin + performance.now());
  c.port2.postMessage(0);
}), true);
"""

def reply_text(size: int) -> str:
    """A long model reply: headings, paragraphs, lists, code, a table."""
    para = ("An append-only log keeps every change in order, so that replaying it rebuilds the state exactly; "
            "small batches share one flush, which keeps durability cheap. ")
    parts = [
        "## Step {i}\n\n" + para * 3 + "\n\n",
        "1. read the **log**\n2. fold the `events`\n3. write the [answer](https://example.com)\n\n",
        "```python\nasync with open_session_store(root) as store:\n    meta, _ = await store.create_session()\n"
        "    for i in range({i}):\n        print(i)\n```\n\n",
        "| records | bytes |\n| --: | --: |\n| {i} | {i}00 |\n\n",
        para * 2 + "\n\n",
    ]
    out: list[str] = []
    i = 0
    while sum(map(len, out)) < size:
        out.append(parts[i % len(parts)].format(i=i))
        i += 1
    return "".join(out)


def run_one(browser: Any, port: int, script: bytes | None, text: str, pace: float, key_every: float) -> dict[str, Any]:
    import httpx
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    sid = http.post("/v1/sessions", json={"title": "bench page"}).json()["session"]["id"]
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "a long answer, please"})
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    if script is not None:
        page.route("**/static/app.js", lambda route: route.fulfill(body=script, content_type="text/javascript"))
    page.add_init_script(OBSERVE)
    page.goto(f"http://127.0.0.1:{port}/#token={TOKEN}&s={sid}")
    page.wait_for_selector(".conn.online")
    r = http.post(f"/v1/sessions/{sid}/replies", json={}).json()
    stream = r["stream"]
    page.wait_for_selector(f'[data-msg="{r["reply_id"]}"]')
    page.focus("#input")
    page.wait_for_timeout(500)
    page.evaluate("window.__perf.long = []")  # (the page's load is not what is measured)
    done = threading.Event()

    def produce() -> None:
        step = 200
        for at in range(0, len(text), step):
            http.post(stream, content=text[at:at + step].encode(), headers={"Content-Type": "text/plain"})
            time.sleep(pace)
        done.set()
    t = threading.Thread(target=produce)
    t0 = time.monotonic()
    t.start()
    sent: list[float] = []
    while not done.is_set():
        sent.append(time.time() * 1000)
        page.keyboard.type("x")
        page.wait_for_timeout(key_every * 1000)
    t.join()
    streamed = time.monotonic() - t0
    http.post(stream, content=b"", headers={"Content-Type": "text/plain", "Stream-Closed": "true"})
    page.wait_for_selector(f'[data-msg="{r["reply_id"]}"].done')
    page.wait_for_timeout(300)  # the observers' last entries
    perf = page.evaluate("window.__perf")
    typed = len(page.input_value("#input"))
    page.close()
    http.close()
    lat = [p - s for s, p in zip(sent, perf["painted"], strict=True)]
    return {"keys": len(sent), "typed": typed, "streamed_s": round(streamed, 1), "long_tasks": len(perf["long"]),
            "longest_task_ms": max(perf["long"], default=0.0), "key_p50_ms": pct(lat, 50), "key_p95_ms": pct(lat, 95),
            "key_max_ms": max(lat, default=0.0)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench page")
    ap.add_argument("--quick", action="store_true", help="a 20 KB reply, one run each")
    ap.add_argument("--baseline", default="334a7fa", help="the git revision whose page is the baseline")
    ap.add_argument("--size", type=int, default=50_000, help="the reply's characters")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright
    size, runs = (20_000, 1) if a.quick else (a.size, a.runs)
    old = subprocess.run(["git", "show", f"{a.baseline}:sessionlog_store/server/edge/static/app.js"],
                         capture_output=True, check=True, cwd=os.path.dirname(os.path.dirname(__file__))).stdout
    text = reply_text(size)
    root = tempfile.mkdtemp(prefix="bench-page-")
    proc, port = _serve(root)
    rows: list[dict[str, Any]] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
            for i in range(runs):  # alternated: the machine's drift falls on both
                for label, script in ((f"page of {a.baseline} (whole reply per frame)", old), ("this page", None)):
                    rows.append({"page": label, "run": i + 1, **run_one(browser, port, script, text, 0.04, 0.06)})
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    print(table(f"A {len(text):,}-character reply streaming while the user types (Chromium 1280x800)", rows))
    mine = [r for r in rows if r["page"] == "this page"]
    print(verdict("longest task while streaming, ms (worst run)", max(r["longest_task_ms"] for r in mine), 50,
                  higher_is_better=False))
    print(verdict("keystroke latency p95, ms (worst run)", max(r["key_p95_ms"] for r in mine), 50,
                  higher_is_better=False))
    print("  saved", save("page", {"size": len(text), "rows": rows}))
    return 0
