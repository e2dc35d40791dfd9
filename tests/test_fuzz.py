"""Protocol fuzzing over a real socket: frames generated from the protocol's
own types (every action, its real field names, values of every JSON type)
plus the known nasty inputs. Every frame gets valid JSON back, nothing
escapes a handler, the server never dies, and a second connection is served."""
from __future__ import annotations

import json

import msgspec
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket

from sessionlog_store.server.edge import protocol as p
from sessionlog_store.server.agents.demo import DemoAgent
from sessionlog_store.server.edge.client import open_client
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.edge.ws import Server, ServerConfig
from sessionlog_store.server.run import serve_store

FIELDS = {c.__struct_config__.tag: [f.name for f in msgspec.structs.fields(c)]  # type: ignore[attr-defined]
          for c in p.ClientAction.__args__}  # type: ignore[attr-defined]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30) | st.sampled_from(["../x", "/etc/passwd", "a\x00b", "default", "", "x" * 300]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=10)


@st.composite
def typed_frames(draw):  # type: ignore[no-untyped-def]
    action = draw(st.sampled_from(sorted(FIELDS)))
    names = FIELDS[action]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))) if names else []
    frame = {name: draw(json_values) for name in chosen}
    if draw(st.booleans()):
        frame[draw(st.text(min_size=1, max_size=6))] = draw(json_values)  # an unknown field
    frame["action"] = action
    return json.dumps(frame)


NASTY = [
    "[" * 50_000 + "]" * 50_000,
    '{"action": "list_sessions", "offset": NaN}',
    '{"action": "list_sessions", "offset": Infinity}',
    '{"action": "chat", "content": "\\ud800\\udfff\\ud800"}',
    '{"action": "list_sessions", "action": "chat"}',
    '{"action": "list_sessions", "limit": 1e999}',
    '{"action": "list_sessions", "limit": 99999999999999999999999999999999}',
    '{"action": "load_session", "session_id": ["a"]}',
    '{"action": "chat", "content": 5}',
    '{"action": "list_sessions", "filters": {"pinned": [[[[[[]]]]]]}}',
    "\x00",
    "",
    "null",
    "1e309",
    '{"action": "chat", "content": "' + "x" * (p.MAX_FRAME + 10) + '"}',
]

frames = st.one_of(typed_frames(), st.sampled_from(NASTY), st.text(max_size=50),
                   st.binary(max_size=50))


async def exchange(root: str, batch: list[str | bytes]) -> None:
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()
    async with trio.open_nursery() as n:
        n.start_soon(lambda: serve_store(root, ServerConfig(port=0, token="t"), agent=DemoAgent(speed=0),
                                         store_config=StoreConfig(checkpoint_interval=3600), on_ready=on_ready))
        await ready.wait()
        port = holder["s"].port
        with trio.fail_after(30):
            async with open_websocket("127.0.0.1", port, "/ws?token=t", use_ssl=False,
                                      max_message_size=p.WS_HARD_LIMIT) as ws:
                for i, frame in enumerate(batch):
                    await ws.send_message(frame)
                    sentinel = f"sentinel-{i}"
                    await ws.send_message(json.dumps({"action": "list_projects", "request_id": sentinel}))
                    while True:
                        reply = json.loads(await ws.get_message())  # every frame back is valid JSON
                        assert isinstance(reply, dict) and "type" in reply and "data" in reply
                        if reply["type"] == "error":
                            assert reply["data"]["code"] in p.ERROR_CODES, reply
                            assert reply["data"]["code"] != "internal", reply
                        if reply.get("request_id") == sentinel:
                            break
            async with open_client("127.0.0.1", port, "t") as other:  # a second connection is served
                assert "rows" in await other.request("list_sessions")
        n.cancel_scope.cancel()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(batch=st.lists(frames, min_size=1, max_size=25))
def test_fuzzed_frames_never_hurt_the_server(tmp_path_factory, batch):
    trio.run(exchange, str(tmp_path_factory.mktemp("fuzz")), batch)


def test_every_nasty_frame_at_once(tmp_path):
    trio.run(exchange, str(tmp_path), [*NASTY, b"\xff\xfe binary"])
