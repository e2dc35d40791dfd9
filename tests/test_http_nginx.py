"""SSE and the HTTP API through Debian's nginx with docs/DEPLOY.md's
configuration (TLS, the sub-path /chat/; issue 27 item 2): a reply's text
reaches an SSE reader while the reply runs (nginx passes each event at once:
`X-Accel-Buffering: no`), the connection stays open across the reply's
pauses, and the reader's last control event closes the stream."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from .processes import stop_nginx
from .test_browser import behind_tls_nginx
from .test_producers import sse_events

CURL = shutil.which("curl")


@pytest.mark.slow
@pytest.mark.skipif(CURL is None, reason="curl is not installed (.ci/run installs it)")
def test_sse_passes_through_nginx_event_by_event(tmp_path):
    s, proxy, port, d = behind_tls_nginx(tmp_path, token="nginx-token")
    url = f"https://localhost:{port}/chat"
    auth = ["-k", "-s", "--resolve", f"localhost:{port}:127.0.0.1", "-H", "Authorization: Bearer nginx-token"]

    def curl(*args: str) -> str:
        assert CURL is not None
        return subprocess.run([CURL, *auth, *args], capture_output=True, text=True, check=True, timeout=30).stdout
    try:
        sid = json.loads(curl("-X", "POST", "-d", "{}", f"{url}/v1/sessions"))["session"]["id"]
        stream = url + json.loads(curl("-X", "POST", "-d", "{}", f"{url}/v1/sessions/{sid}/replies"))["stream"]
        assert CURL is not None
        reader = subprocess.Popen([CURL, *auth, "-N", f"{stream}?offset=-1&live=sse"], stdout=subprocess.PIPE)
        assert reader.stdout is not None
        got = ""
        for i, word in enumerate(["first ", "second ", "third"]):
            curl("-H", "Content-Type: text/plain", "--data-binary", word, stream)
            # Each word reaches the reader before the next is sent: nothing waits in nginx's buffers.
            while "".join(dd for k, dd in sse_events(got) if k == "data") != "first second third"[:len(
                    "".join(["first ", "second ", "third"][:i + 1]))]:
                line = reader.stdout.readline()
                assert line, "the SSE answer ended early"
                got += line.decode()
        curl("-X", "POST", "-H", "Content-Type: text/plain", "-H", "Stream-Closed: true", stream)
        rest = reader.stdout.read().decode()  # the answer ends with the stream's closure
        reader.wait(30)
        control = [json.loads(dd) for k, dd in sse_events(got + rest) if k == "control"][-1]
        assert control["streamClosed"] is True and control["status"] == "done"
        assert control["streamNextOffset"].startswith(f"{len('first second third'):016d}_")
    finally:
        stop_nginx(proxy)
        s.stop()
    log = (d / "access.log").read_text()
    assert "nginx-token" not in log and "/v1/stream/" in log
