"""examples/ run as their users would (issue 28 item 2): the FastAPI app
whose /chat route runs an OpenAI Agents SDK agent (against a local
OpenAI-compatible server, scripted: the model calls the app's function
tool, then answers) and streams its events into a sessionlog reply
through the Python client; followed by a sessionlog client: the text, the
tool call (its arguments, its result), the token usage; and a user's
Stop, sent to sessionlog, stops the agent run (the model's stream is
abandoned) and ends the reply `aborted` with its text."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

pytest.importorskip("agents", reason="the example needs openai-agents (the test extra)")
pytest.importorskip("fastapi", reason="the example needs fastapi (the test extra)")
httpx = pytest.importorskip("httpx")

from sessionlog_store.client import Client  # noqa: E402

from .conftest import ROOT  # noqa: E402
from .processes import ServeProcess, free_port  # noqa: E402
from .test_openai_agent import answered, called, chunk, fake_openai  # noqa: E402

TOKEN = "example-token"
APP = ROOT / "examples" / "fastapi_agents"


@pytest.fixture
def sessionlog(tmp_path: Path) -> Iterator[ServeProcess]:
    proc = ServeProcess(str(tmp_path / "data"), free_port(), token=TOKEN, log=tmp_path / "serve.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


async def start_app(nursery: trio.Nursery, llm_port: int, sessionlog: ServeProcess) -> tuple[int, subprocess.Popen]:
    port = free_port()
    env = {**os.environ, "SESSIONLOG_URL": f"http://127.0.0.1:{sessionlog.port}", "SESSIONLOG_TOKEN": TOKEN,
           "OPENAI_BASE_URL": f"http://127.0.0.1:{llm_port}/v1", "OPENAI_API_KEY": "k", "MODEL": "m",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level",
                             "warning"], cwd=APP, env=env)
    async with httpx.AsyncClient() as h:
        with trio.fail_after(60):
            while True:
                try:
                    if (await h.get(f"http://127.0.0.1:{port}/openapi.json")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, "the example app exited"
                await trio.sleep(0.1)
    return port, proc


async def test_the_fastapi_agents_example_streams_a_reply_with_a_tool_call(nursery, sessionlog):
    requests: list[dict] = []
    llm = await fake_openai(nursery, requests, rounds=[
        called(("call_1", "get_weather", '{"city": "Paris"}')),
        answered("It is sunny in Paris."),
    ])
    port, app = await start_app(nursery, llm, sessionlog)
    try:
        async with httpx.AsyncClient() as h:
            r = await h.post(f"http://127.0.0.1:{port}/chat", json={"content": "What is the weather in Paris?"})
            assert r.status_code == 200, r.text
            sid, rid = r.json()["session_id"], r.json()["reply_id"]
        async with Client(f"http://127.0.0.1:{sessionlog.port}", TOKEN) as sl:
            with trio.fail_after(60):
                chunks = [c async for c in sl.read_message(sid, rid)]
            assert "".join(c.text for c in chunks) == "It is sunny in Paris." and chunks[-1].status == "done"
            messages = (await sl.get_session(sid)).messages
        reply = next(m for m in messages if m.msg_id == rid)
        (call,) = [m for m in messages if m.caller == rid]
        assert (call.kind, call.status, call.metadata["tool"], call.metadata["tool_call_id"]) == (
            "tool_call", "done", "get_weather", "call_1")
        assert call.metadata["arguments"] == '{"city": "Paris"}' and call.content == "It is sunny in Paris, 21 C."
        assert reply.tokens == {"input": 30, "output": 8}, reply.tokens
        assert [t["function"]["name"] for t in requests[0]["tools"]] == ["get_weather"]
        assert requests[1]["messages"][-1]["role"] == "tool"
    finally:
        app.terminate()
        app.wait(10)


async def test_a_stop_in_sessionlog_stops_the_example_agents_run(nursery, sessionlog):
    slow = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": f"word{i} "}) for i in range(400)]
    requests: list[dict] = []
    llm = await fake_openai(nursery, requests, rounds=[slow + [chunk({}, finish="stop"), b"data: [DONE]\n\n"]])
    port, app = await start_app(nursery, llm, sessionlog)
    try:
        async with httpx.AsyncClient() as h:
            r = await h.post(f"http://127.0.0.1:{port}/chat", json={"content": "talk for a while"})
            sid, rid = r.json()["session_id"], r.json()["reply_id"]
        async with Client(f"http://127.0.0.1:{sessionlog.port}", TOKEN) as sl:
            with trio.fail_after(60):
                text = ""
                async for c in sl.read_message(sid, rid):
                    text += c.text
                    if "word3 " in text:
                        break
            await sl.stop(sid, rid)
            with trio.fail_after(30):
                while True:
                    m = next(m for m in (await sl.get_session(sid)).messages if m.msg_id == rid)
                    if m.status != "running":
                        break
                    await trio.sleep(0.05)
            assert m.status == "aborted" and m.metadata.get("aborted_reason") == "stopped by user"
            assert m.content.startswith("word0 word1 word2 word3") and not m.content.endswith("word399 ")
            with trio.fail_after(30):
                while not ({"left_at", "complete"} & requests[0].keys()):
                    await trio.sleep(0.05)
            assert "left_at" in requests[0], "the agent run stopped: it left its model's stream"
    finally:
        app.terminate()
        app.wait(10)
