"""The Durable Streams protocol's own client from PyPI (`durable-streams`,
written by nobody here) reads a reply while an external producer streams it:
by long-poll and by SSE, cut in the middle and resumed from the offset it
was given, getting exactly the text (issue 27 item 2); and the protocol's
TypeScript client (`@durable-streams/client`) does the same under Node."""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
import trio

from .httpc import HttpClient
from .nodejs import node_tests
from .test_deploy import start
from .test_ws import TOKEN

durable_streams = pytest.importorskip("durable_streams", reason="the test extra installs durable-streams")

TEXT = ["Durable ", "streams\n", "resume ", "exactly ", "where\n", "they were ", "cut."]


async def append_text(producer: HttpClient, stream: str, pieces: list[str], close: bool = False) -> None:
    """An external producer's appends, the last closing the reply with `close`."""
    for i, piece in enumerate(pieces):
        last = close and i == len(pieces) - 1
        a = await producer.request("POST", stream, raw=piece.encode(), headers={
            "Content-Type": "text/plain", **({"Stream-Closed": "true"} if last else {})})
        assert a.status in (200, 204), a.body


@pytest.mark.parametrize("live", ["long-poll", "sse"])
async def test_the_official_python_client_reads_a_streaming_reply_and_resumes(root, nursery, live):
    server = await start(nursery, root)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with HttpClient(server.port, TOKEN) as producer:
        sid = (await producer.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        opened = (await producer.request("POST", f"/v1/sessions/{sid}/replies", {})).json()
        url = f"http://127.0.0.1:{server.port}{opened['stream']}"
        sent = trio.Event()

        async def produce(pieces: list[str], close: bool = False) -> None:
            await append_text(producer, opened["stream"], pieces, close)
            sent.set()

        await produce(TEXT[:1])
        got, offset = "", None
        async with trio.open_nursery() as n:
            async with durable_streams.astream(url, live=live, headers=auth) as res:
                n.start_soon(produce, TEXT[1:4])
                async for chunk in res.iter_text():
                    got += chunk
                    if got == "".join(TEXT[:4]):
                        offset = res.offset
                        break  # the reader is cut here
        assert got == "".join(TEXT[:4]) and offset
        await produce(TEXT[4:], close=True)  # while nobody reads
        async with durable_streams.astream(url, offset=offset, live=False, headers=auth) as res:
            rest = await res.read_text()
        # The offset the client holds covers what it had when it was given
        # (by SSE, an event's offset follows its text: it may lag the last
        # chunk); from it the read is exactly the rest. (The test may read
        # the offset: it is the server's own format.)
        at = int(offset[:16])
        full = "".join(TEXT)
        assert at <= len(got) and got[:at] == full[:at]
        assert rest == full[at:], "the resumed read is exactly the rest"
        loaded = (await producer.request("GET", f"/v1/sessions/{sid}")).json()["messages"][-1]
        assert loaded["content"] == full and loaded["status"] == "done"


@pytest.mark.parametrize("live", ["long-poll", "sse"])
async def test_the_official_typescript_client_reads_a_streaming_reply_and_resumes(root, nursery, live):
    """@durable-streams/client under Node (tests/node/read_stream.mjs) reads
    a reply while it streams, is cut, and resumes from the offset it held,
    getting exactly the rest up to the reply's end (the stream's closure)."""
    node_dir = node_tests()
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as producer:
        sid = (await producer.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        opened = (await producer.request("POST", f"/v1/sessions/{sid}/replies", {})).json()
        url = f"http://127.0.0.1:{server.port}{opened['stream']}"

        async def produce(pieces: list[str], close: bool = False) -> None:
            await append_text(producer, opened["stream"], pieces, close)

        async def read(offset: str, stop_after: int | None, then: list[str], close: bool) -> dict[str, Any]:
            """Run the Node reader; once it has handed over its first chunk,
            produce `then` (so it reads them live); its last line."""
            env = {**os.environ, **({"STOP_AFTER": str(stop_after)} if stop_after else {})}
            proc = await trio.lowlevel.open_process(["node", "read_stream.mjs", url, TOKEN, live, offset],
                                                    cwd=node_dir, stdout=subprocess.PIPE, env=env)
            assert proc.stdout is not None
            lines, buf, produced = [], b"", False
            try:
                while True:
                    data = await proc.stdout.receive_some(65536)
                    if not data:
                        break
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        lines.append(json.loads(line))
                        if not produced:
                            produced = True
                            nursery.start_soon(produce, then, close)
                await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0 and lines and lines[-1].get("end"), lines
            return lines[-1]

        full = "".join(TEXT)
        await produce(TEXT[:1])
        cut = await read("", len("".join(TEXT[:4])), TEXT[1:4], False)
        await produce(TEXT[4:5])  # while nobody reads
        at = int(cut["offset"][:16])  # (the server's own format: characters before it)
        assert cut["text"] == full[:at] and at >= len("".join(TEXT[:4]))
        rest = await read(cut["offset"], None, TEXT[5:], True)
        assert rest["text"] == full[at:], "the resumed read is exactly the rest"
        loaded = (await producer.request("GET", f"/v1/sessions/{sid}")).json()["messages"][-1]
        assert loaded["content"] == full and loaded["status"] == "done"
