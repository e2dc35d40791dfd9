"""A FastAPI backend whose agent (the OpenAI Agents SDK, on any
OpenAI-compatible endpoint) streams its replies into sessionlog through the
Python client: text deltas, each tool call as a tool_call message (its
arguments, then its result), token usage; a user's Stop in any sessionlog
client (the page) stops the agent run. Readers (the page, any client)
follow the reply live and resume it exactly after a reload.

    SESSIONLOG_URL=http://127.0.0.1:8765 SESSIONLOG_TOKEN=... \
    OPENAI_BASE_URL=http://127.0.0.1:11434/v1 MODEL=llama3 \
    uvicorn app:app --port 8000
    curl -X POST localhost:8000/chat -H 'Content-Type: application/json' \
         -d '{"content": "What is the weather in Paris?"}'
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from fastapi import FastAPI, HTTPException
from openai import AsyncOpenAI
from openai.types.responses import ResponseTextDeltaEvent
from pydantic import BaseModel

from sessionlog_store.client import Client, Reply

set_tracing_disabled(True)  # (no traces sent to OpenAI from a local model)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"It is sunny in {city}, 21 C."


def make_agent() -> Agent:
    model = OpenAIChatCompletionsModel(model=os.environ.get("MODEL", "gpt-4o-mini"),
                                       openai_client=AsyncOpenAI(base_url=os.environ.get("OPENAI_BASE_URL"),
                                                                 api_key=os.environ.get("OPENAI_API_KEY", "none")))
    return Agent(name="Assistant", instructions="Answer briefly; use tools when they help.", tools=[get_weather],
                 model=model)


async def produce(agent: Agent, reply: Reply, prompt: str) -> None:
    """Run the agent, its events into the reply (open); the reply's Stop
    cancels the run."""
    result = Runner.run_streamed(agent, input=prompt)
    calls: dict[str, Reply] = {}
    async with anyio.create_task_group() as tg:
        async def stop_on_stop() -> None:
            await reply.stopped.wait()
            result.cancel()
            tg.cancel_scope.cancel()
        tg.start_soon(stop_on_stop)
        async for event in result.stream_events():
            if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent):
                reply.write(event.data.delta)
            elif event.type == "run_item_stream_event" and event.name == "tool_called":
                raw = event.item.raw_item
                call = reply.tool_call(getattr(raw, "name", "?"), call_id=getattr(raw, "call_id", ""),
                                       arguments=getattr(raw, "arguments", ""))
                calls[getattr(raw, "call_id", "")] = await call.__aenter__()
            elif event.type == "run_item_stream_event" and event.name == "tool_output":
                raw = event.item.raw_item
                call_id = raw.get("call_id", "") if isinstance(raw, dict) else getattr(raw, "call_id", "")
                call = calls.pop(call_id, None)
                if call is not None:
                    call.write(str(event.item.output))
                    await call.__aexit__(None, None, None)
        tg.cancel_scope.cancel()
    for call in calls.values():  # (calls cut by a Stop)
        await call.__aexit__(None, None, None)
    usage = result.context_wrapper.usage
    reply.tokens(input=usage.input_tokens, output=usage.output_tokens)


class ChatIn(BaseModel):
    content: str
    session_id: str | None = None


class ChatOut(BaseModel):
    session_id: str
    reply_id: str


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with Client(os.environ["SESSIONLOG_URL"], os.environ.get("SESSIONLOG_TOKEN")) as sl, \
            anyio.create_task_group() as runs:
        app.state.sl, app.state.runs, app.state.agent = sl, runs, make_agent()
        yield
        runs.cancel_scope.cancel()


app = FastAPI(lifespan=lifespan)


@app.post("/chat")
async def chat(body: ChatIn) -> ChatOut:
    """The user's message, then the agent's reply, streamed into sessionlog
    (answered once the reply's placeholder is durable: follow it there)."""
    sl: Client = app.state.sl
    sid = body.session_id or (await sl.create_session(title=body.content[:60])).id
    await sl.add_message(sid, body.content)
    opened: dict[str, str] = {}
    ready = anyio.Event()

    async def run() -> None:  # (in the app's task group: the reply outlives this request)
        try:
            async with sl.reply(sid) as reply:
                opened["reply_id"] = reply.reply_id
                ready.set()
                await produce(app.state.agent, reply, body.content)
        except Exception as e:  # noqa: BLE001 - the reply ended `error` with it; the app serves on
            opened.setdefault("error", f"{type(e).__name__}: {e}")
            ready.set()
    app.state.runs.start_soon(run)
    await ready.wait()
    if "reply_id" not in opened:
        raise HTTPException(502, opened.get("error", "the reply could not be opened"))
    return ChatOut(session_id=sid, reply_id=opened["reply_id"])
