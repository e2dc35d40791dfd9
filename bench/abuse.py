"""One user flooding: does it slow another user's stream?

    python -m bench abuse [--quick]

A real `sessionlog serve --auth tokens-file` runs in its own process. A
client process of well-behaved users (each streams a reply and pings with
`list_running` every 50 ms) measures, per user, the request round trip and
the gaps between consecutive `msg_update` pushes of its streaming reply. An
abuser process (one user, several connections) sends frames as fast as its
sockets take them and reads what comes back. Three phases, in one run:

  quiet      the users alone
  cpu hog    the users and a process that only spins (what the abuser's own
             CPU costs the users on this 2-core machine, server or not)
  limited    the users and the abuser, with the default per-user limits
  unlimited  the same with --limit-rate 0 (the baseline the limit is for)

The two cores are shared by the server and the client processes: compare the
phases with each other, not with another machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import trio

from .report import pct, save, table, verdict

USERS = 8


def token(name: str) -> str:
    return f"{name}-bench-token-0123456789"


# -- the client processes ------------------------------------------------------

async def users_role(port: int, seconds: float, out: str) -> None:
    from sessionlog_store.server.edge.client import open_client
    rtts: list[float] = []
    gaps: list[float] = []

    async def one(i: int) -> None:
        async with open_client("127.0.0.1", port, token(f"user{i}")) as c:
            deadline = time.monotonic() + seconds
            ack = await c.request("chat", content="tell me a long story " * 3)
            await c.follow(ack["session_id"])
            key = (ack["session_id"], ack["reply_id"])
            seen, last = 0, time.monotonic()
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                await c.request("list_running")
                rtts.append(time.monotonic() - t0)
                n = sum(1 for f in c.pushes if f["type"] == "msg_update")
                now = time.monotonic()
                if n > seen:
                    gaps.append(now - last)
                    seen, last = n, now
                if c.status.get(key) in ("done", "error", "aborted"):
                    ack = await c.request("chat", session_id=ack["session_id"], content="and another")
                    await c.follow(ack["session_id"])
                    key = (ack["session_id"], ack["reply_id"])
                await trio.sleep(0.05)
    async with trio.open_nursery() as n:
        for i in range(USERS):
            n.start_soon(one, i)
    with open(out, "w") as f:
        json.dump({"rtt": rtts, "gaps": gaps}, f)


async def abuser_role(port: int, seconds: float, out: str) -> None:
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket
    counts = {"sent": 0, "answered": 0, "rate_limited": 0, "dropped": 0}
    frame = json.dumps({"action": "list_sessions", "filters": {"agent_id": "x" * 100}})
    deadline = trio.current_time() + seconds

    async def flood() -> None:
        async with open_websocket("127.0.0.1", port, f"/ws?token={token('mallory')}", use_ssl=False) as ws:
            async def reader() -> None:
                while True:
                    got = await ws.get_message()
                    counts["answered"] += 1
                    counts["rate_limited"] += '"rate_limited"' in got
            async with trio.open_nursery() as n:
                n.start_soon(reader)
                with trio.move_on_at(deadline):
                    while True:
                        await ws.send_message(frame)
                        counts["sent"] += 1
                n.cancel_scope.cancel()

    async def conn() -> None:
        while trio.current_time() < deadline:  # dropped (too slow a reader): back at once
            try:
                await flood()
            except* (ConnectionClosed, HandshakeError, OSError):
                counts["dropped"] += 1
    async with trio.open_nursery() as n:
        for _ in range(4):
            n.start_soon(conn)
    with open(out, "w") as f:
        json.dump(counts, f)


# -- the conductor ---------------------------------------------------------------

def start_server(root: str, port: int, extra: list[str]) -> subprocess.Popen[str]:
    tokens = os.path.join(root + "-tokens.json")
    with open(tokens, "w") as f:
        json.dump({token(n): n for n in [*(f"user{i}" for i in range(USERS)), "mallory"]}, f)
    proc = subprocess.Popen([sys.executable, "-m", "sessionlog_store", "serve", "--root", root, "--port", str(port),
                             "--auth", "tokens-file", "--tokens-file", tokens, "--agent-speed", "40",
                             "--limit-running", "0", "--log-level", "WARNING", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    while "serving" not in (line := proc.stdout.readline()):
        if not line:
            raise SystemExit("the server did not start")
    return proc


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def phase(name: str, extra: list[str], abuse: str | None, seconds: float, work: str) -> dict[str, object]:
    port = free_port()
    server = start_server(os.path.join(work, name), port, extra)
    try:
        outs = {r: os.path.join(work, f"{name}-{r}.json") for r in ("users", "abuser", "hog")}
        roles = ["users", *([abuse] if abuse else [])]
        procs = [subprocess.Popen([sys.executable, "-m", "bench", "abuse", "--role", r, "--port", str(port),
                                   "--seconds", str(seconds), "--out", outs[r]]) for r in roles]
        for p in procs:
            p.wait(seconds + 60)
        users = json.load(open(outs["users"]))
        abuser = json.load(open(outs[abuse])) if abuse else {}
    finally:
        server.terminate()
        server.wait(30)
    return {"phase": name, "rtt p50 ms": pct(users["rtt"], 50) * 1e3, "rtt p99 ms": pct(users["rtt"], 99) * 1e3,
            "push gap p99 ms": pct(users["gaps"], 99) * 1e3, "requests": len(users["rtt"]),
            "abuser frames": abuser.get("sent", 0), "abuser refused": abuser.get("rate_limited", 0),
            "abuser dropped": abuser.get("dropped", 0)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench abuse")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--role", choices=("users", "abuser", "hog"))
    ap.add_argument("--port", type=int)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.role == "users":
        trio.run(users_role, args.port, args.seconds, args.out)
        return 0
    if args.role == "abuser":
        trio.run(abuser_role, args.port, args.seconds, args.out)
        return 0
    if args.role == "hog":
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            pass
        with open(args.out, "w") as f:
            json.dump({}, f)
        return 0
    seconds = 4.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work:
        rows = [phase("quiet", [], None, seconds, work),
                phase("cpu hog", [], "hog", seconds, work),
                phase("limited", [], "abuser", seconds, work),
                phase("unlimited", ["--limit-rate", "0"], "abuser", seconds, work)]
    print(table(f"{USERS} users streaming and pinging, one abuser on 4 connections ({seconds:g} s a phase)", rows))
    quiet, hog, limited, unlimited = rows
    print(verdict("rtt p99 with a limited abuser / quiet (target <= 1.5: unchanged within noise)",
                  float(limited["rtt p99 ms"]) / max(1e-9, float(quiet["rtt p99 ms"])), 1.5,  # type: ignore[arg-type]
                  higher_is_better=False))
    print(verdict("rtt p99 with a limited abuser / with a process that only spins (target <= 1.2)",
                  float(limited["rtt p99 ms"]) / max(1e-9, float(hog["rtt p99 ms"])), 1.2,  # type: ignore[arg-type]
                  higher_is_better=False))
    print(verdict("push gap p99 with a limited abuser / quiet (target <= 1.5)",
                  float(limited["push gap p99 ms"]) / max(1e-9, float(quiet["push gap p99 ms"])), 1.5,  # type: ignore[arg-type]
                  higher_is_better=False))
    print(save("abuse", {"rows": rows}))
    return 0
