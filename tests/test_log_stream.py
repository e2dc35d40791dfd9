"""A session's event log as a Durable Streams stream (issue 27 item 2):
every durable record from any offset, live by SSE (through the protocol's
own Python client) and long-poll, exact resume after a cut, another user's
session answered as an unknown one, and the session's deletion as the
stream's closure."""
from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from .httpc import HttpClient
from .test_deploy import start
from .test_users import TOKENS, start_users
from .test_ws import TOKEN

durable_streams = pytest.importorskip("durable_streams", reason="the test extra installs durable-streams")


async def open_reply(c: HttpClient, sid: str) -> str:
    return (await c.request("POST", f"/v1/sessions/{sid}/replies", {})).json()["stream"]


async def test_the_log_streams_live_and_resumes_exactly(root, nursery):
    server = await start(nursery, root)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with HttpClient(server.port, TOKEN) as c:
        sid = (await c.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        path = f"/v1/stream/sessions/{sid}"
        first = await c.request("GET", path)
        assert first.status == 200 and first.headers["content-type"] == "application/json"
        assert [m["event"]["type"] for m in first.json()] == ["session_created"]
        reply = await open_reply(c, sid)
        seen: list[dict] = []
        cut_at = ""
        url = f"http://127.0.0.1:{server.port}{path}"
        async with trio.open_nursery() as n:
            async with durable_streams.astream(url, offset=first.headers["stream-next-offset"], live="sse",
                                               headers=auth) as res:
                async def produce() -> None:
                    for piece in ("a", "b", "c"):
                        assert (await c.request("POST", reply, raw=piece.encode(),
                                                headers={"Content-Type": "text/plain"})).status in (200, 204)
                n.start_soon(produce)
                async for batch in res.iter_json_batches():
                    seen += batch
                    if [m["event"].get("d") for m in seen if m["event"]["type"] == "p"] == ["a", "b", "c"]:
                        # (no control event read yet when the first batch held all three: the start)
                        cut_at = res.offset or first.headers["stream-next-offset"]
                        break  # cut
        # while nobody reads: the reply ends
        assert (await c.request("POST", reply, raw=b"!", headers={"Content-Type": "text/plain",
                                                                 "Stream-Closed": "true"})).status in (200, 204)
        rest = await c.request("GET", f"{path}?offset={cut_at}")
        # (the client's offset covers what it was given; by SSE a batch's
        # offset comes in the control event after it: it may lag the last batch)
        at = int(cut_at[:16])
        assert [m["seq"] for m in seen][:at - 1] == list(range(2, at + 1))
        whole = first.json() + [m for m in seen if m["seq"] <= at] + rest.json()
        assert [m["seq"] for m in whole] == list(range(1, len(whole) + 1)), "nothing twice, nothing missed"
        assert [m["event"]["type"] for m in whole].count("message_finalized") == 1
        assert rest.headers["stream-next-offset"].startswith(f"{len(whole):016d}_")
        # a long-poll at the end waits for the next record, and gets it once it is durable
        tail = rest.headers["stream-next-offset"]
        async with trio.open_nursery() as n:
            got: list = []

            async def poll() -> None:
                async with HttpClient(server.port, TOKEN) as r:
                    a = await r.request("GET", f"{path}?offset={tail}&live=long-poll")
                    got.append(a)
            n.start_soon(poll)
            await trio.testing.wait_all_tasks_blocked()
            await c.request("PATCH", f"/v1/sessions/{sid}", {"title": "Renamed"})
        assert got[0].status == 200 and got[0].json()[0]["seq"] == len(whole) + 1
        # the session's deletion is the stream's last record and its closure
        # (for a reader waiting at its end: the log is gone afterwards)
        end = tail
        while True:  # (past the user's title: the auto-titler writes no more after it)
            more = await c.request("GET", f"{path}?offset={end}&live=long-poll")
            end = more.headers["stream-next-offset"]
            if any(m["event"].get("title") == "Renamed" for m in more.json()):
                break
        async with trio.open_nursery() as n:
            closing: list = []

            async def poll_end() -> None:
                async with HttpClient(server.port, TOKEN) as r:
                    closing.append(await r.request("GET", f"{path}?offset={end}&live=long-poll"))
            n.start_soon(poll_end)
            await trio.testing.wait_all_tasks_blocked()
            assert (await c.request("DELETE", f"/v1/sessions/{sid}")).status == 204
        assert closing[0].json()[-1]["event"]["type"] == "session_deleted"
        assert closing[0].headers.get("stream-closed") == "true"
        assert (await c.request("GET", path)).status == 404


async def test_another_users_log_is_an_unknown_session(root, nursery, tmp_path):
    server = await start_users(nursery, root, tmp_path)
    alice_token, bob_token = TOKENS["alice"], TOKENS["bob"]
    async with HttpClient(server.port, alice_token) as alice, HttpClient(server.port, bob_token) as bob:
        sid = (await alice.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        mine = await alice.request("GET", f"/v1/stream/sessions/{sid}")
        theirs = await bob.request("GET", f"/v1/stream/sessions/{sid}")
        unknown = await bob.request("GET", "/v1/stream/sessions/NoSuchSession0")
        assert mine.status == 200
        assert (theirs.status, json.loads(theirs.body)) == (unknown.status, json.loads(unknown.body.replace(
            b"NoSuchSession0", sid.encode())))
        assert (await bob.request("POST", f"/v1/stream/sessions/{sid}", raw=b"x")).status == 405
