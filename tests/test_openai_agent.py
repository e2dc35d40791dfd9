"""The OpenAI-compatible agent (issue 15 item 5) against a local HTTP server
that streams Server-Sent Events exactly as the chat-completions API documents
them (content deltas, tool-call deltas, a final usage chunk, `[DONE]`),
routed by the session's agent_id, through a real server and socket."""
from __future__ import annotations

import json

import pytest
import trio

from sessionlog_store.server.agents.demo import DemoAgent
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.edge.ws import Server, ServerConfig
from sessionlog_store.server.run import serve_store
from sessionlog_store.server.agents import load_agents

from .test_ws import TOKEN

openai = pytest.importorskip("openai", reason="the `openai` extra is not installed")

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> bytes:
    body = dict(BASE, choices=[] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}])
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hello"}),
    chunk({"content": " world"}),
    chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                           "function": {"name": "search", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":"}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"durable\"}"}}]}),
    chunk({}, finish="tool_calls"),
    chunk(None, usage={"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}),
    b"data: [DONE]\n\n",
]


async def fake_openai(nursery: trio.Nursery, requests: list[dict], stream_parts: list[bytes] | None = None,
                      rounds: list[list[bytes]] | None = None) -> int:
    """A local OpenAI-compatible server streaming `stream_parts` to every
    request, or `rounds[i]` to the i-th (scripted)."""

    async def handle(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            body += await stream.receive_some(65536)
        requests.append({"path": head.split(b" ")[1].decode(), **json.loads(body)})
        parts = rounds[len(requests) - 1] if rounds is not None else STREAM if stream_parts is None else stream_parts
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                              b"Connection: close\r\n\r\n")
        entry = requests[-1]  # ("left_at": the part at which the client left; "complete": it did not)
        i = 0
        try:
            for i, part in enumerate(parts):
                await stream.send_all(part)
                with trio.move_on_after(0.01):  # (the pace; an end of the request's side: the client left)
                    if await stream.receive_some(1) == b"":
                        entry["left_at"] = i
                        return
            entry["complete"] = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            entry["left_at"] = i
        finally:
            await stream.aclose()
    listeners = await nursery.start(trio.serve_tcp, handle, 0)
    return int(listeners[0].socket.getsockname()[1])


async def serve_with(nursery: trio.Nursery, root: str, agent, agents=None) -> Server:  # type: ignore[no-untyped-def]
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()
    nursery.start_soon(lambda: serve_store(root, ServerConfig(port=0, token=TOKEN), agent=agent, agents=agents,
                                           store_config=StoreConfig(), on_ready=on_ready))
    await ready.wait()
    return holder["s"]


async def chat_done(c, content: str, **fields: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A chat through the WebSocket client, followed until its reply is done."""
    ack = await c.request("chat", content=content, **fields)
    sid, rid = ack["session_id"], ack["reply_id"]
    await c.follow(sid)
    with trio.fail_after(20):
        assert await c.wait_done(sid, rid) == "done"
    return sid, rid


async def test_an_openai_compatible_stream_becomes_a_reply_a_tool_call_and_token_counts(root, nursery):
    from sessionlog_store.server.agents.openai_compat import OpenAIAgent
    requests: list[dict] = []
    port = await fake_openai(nursery, requests)
    agents = {"gpt": OpenAIAgent("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k")}
    server = await serve_with(nursery, root, DemoAgent(speed=0), agents)
    from sessionlog_store.server.edge.client import open_client
    async with open_client("127.0.0.1", server.port, TOKEN) as c:
        sid, rid = await chat_done(c, "what is durable?", agent_id="gpt")
    state = await server.store.load_session(sid)
    reply = state.messages[rid]
    assert reply.content == "Hello world" and reply.tokens == {"input": 12, "output": 7}
    (call,) = [m for m in state.messages.values() if m.caller == rid]
    assert (call.kind, call.role, call.status, call.content) == ("tool_call", "tool", "done", "")
    assert call.metadata["tool"] == "search" and call.metadata["tool_call_id"] == "call_1"
    assert call.metadata["arguments"] == '{"q":"durable"}', "an agent without tools records the call, no result"
    (req,) = requests
    assert req["path"] == "/v1/chat/completions" and req["model"] == "m" and req["stream"] is True
    assert req["messages"][-1] == {"role": "user", "content": "what is durable?"}
    assert req["stream_options"] == {"include_usage": True}


def test_agents_are_loaded_by_flag_and_bad_specs_say_why():
    agents = load_agents(["demo2=sessionlog_store.server.agents.demo:DemoAgent"])
    assert isinstance(agents["demo2"], DemoAgent)
    for bad in ("nofactory", "x=sessionlog_store.server.agents.demo", "x=no.such.module:f"):
        with pytest.raises((ValueError, ImportError)):
            load_agents([bad])


async def test_a_stream_cut_off_upstream_ends_as_an_error_with_its_text(root, nursery):
    """Review finding: a stream that ends without a finish_reason (the
    upstream died, or answered without streaming) is not a `done` reply."""
    from sessionlog_store.server.agents.openai_compat import OpenAIAgent
    port = await fake_openai(nursery, [], [chunk({"content": "Hello, the answer is"})])
    server = await serve_with(nursery, root, OpenAIAgent("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k"))
    from sessionlog_store.server.edge.client import open_client
    async with open_client("127.0.0.1", server.port, TOKEN) as c:
        ack = await c.request("chat", content="hi")
        await c.follow(ack["session_id"])
        with trio.fail_after(20):
            assert await c.wait_done(ack["session_id"], ack["reply_id"]) == "error"
    m = (await server.store.load_session(ack["session_id"])).messages[ack["reply_id"]]
    assert m.content == "Hello, the answer is" and "cut off" in (m.error or "")


def called(*calls: tuple[str, str, str], content: str = "") -> list[bytes]:
    """A round in which the model says `content` and calls tools (id, name, arguments)."""
    parts = [chunk({"role": "assistant", "content": content})]
    for i, (cid, name, args) in enumerate(calls):
        parts.append(chunk({"tool_calls": [{"index": i, "id": cid, "type": "function",
                                            "function": {"name": name, "arguments": ""}}]}))
        parts.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args}}]}))
    return [*parts, chunk({}, finish="tool_calls"),
            chunk(None, usage={"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}), b"data: [DONE]\n\n"]


def answered(text: str) -> list[bytes]:
    return [chunk({"role": "assistant", "content": text}), chunk({}, finish="stop"),
            chunk(None, usage={"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}), b"data: [DONE]\n\n"]


async def test_an_agent_with_tools_runs_each_call_and_asks_again_until_the_model_answers(root, nursery):
    """Issue 28 item 5: the factory's tools (Python callables, their JSON
    Schema from their signatures) are offered to the model; scripted to
    call a tool twice (a sync one, then an async one) and then answer, the
    agent runs each call, records it as a tool_call message (arguments in
    its metadata, the result as its text), asks again with the results,
    and writes the answer; the next turn's history gives the calls and
    results back in the Chat Completions shape."""
    from sessionlog_store.server.agents.openai_compat import OpenAIAgent

    def add(a: int, b: int = 0) -> int:
        """Add two integers."""
        return a + b

    async def shout(text: str) -> str:
        """Say it louder."""
        return text.upper()
    requests: list[dict] = []
    port = await fake_openai(nursery, requests, rounds=[
        called(("call_1", "add", '{"a": 2, "b": 3}'), content="Let me add. "),
        called(("call_2", "shout", '{"text": "five"}'), ("call_3", "add", '{"a": "x"}')),
        answered("The sum is FIVE."),
        answered("Yes."),
    ])
    agent = OpenAIAgent("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", tools=[add, shout])
    server = await serve_with(nursery, root, agent)
    from sessionlog_store.server.edge.client import open_client
    async with open_client("127.0.0.1", server.port, TOKEN) as c:
        sid, rid = await chat_done(c, "add 2 and 3, loudly")
        state = await server.store.load_session(sid)
        reply = state.messages[rid]
        assert reply.content == "Let me add. The sum is FIVE." and reply.tokens == {"input": 40, "output": 11}
        calls = sorted((m for m in state.messages.values() if m.caller == rid), key=lambda m: m.created_at)
        assert [(m.metadata["tool"], m.metadata["arguments"], m.content, m.status) for m in calls] == [
            ("add", '{"a": 2, "b": 3}', "5", "done"), ("shout", '{"text": "five"}', "FIVE", "done"),
            ("add", '{"a": "x"}', calls[2].content, "done")]
        assert calls[2].content.startswith("error: bad arguments for add")
        first, second, third = requests[:3]
        assert [t["function"]["name"] for t in first["tools"]] == ["add", "shout"]
        assert first["tools"][0]["function"]["parameters"]["required"] == ["a"]
        assert second["messages"][-2:] == [
            {"role": "assistant", "content": "Let me add. ", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
        assert [m["role"] for m in third["messages"][-5:]] == ["assistant", "tool", "assistant", "tool", "tool"]
        # the next turn: the calls and results are in its history, in the same shape
        ack2 = await c.request("chat", content="is that right?", session_id=sid)
        with trio.fail_after(20):
            while (await server.store.load_session(sid)).messages[ack2["reply_id"]].status != "done":
                await trio.sleep(0.05)
    history = requests[3]["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant",
                                            "user"]
    assert history[3]["content"] is None and [t["id"] for t in history[3]["tool_calls"]] == ["call_2", "call_3"]
    assert history[6] == {"role": "assistant", "content": "The sum is FIVE."}
