"""Refused handshakes take the same time whatever was wrong (issue 16).

    python -m bench auth [--quick]

A real `sessionlog serve --auth tokens-file` (tokens of 20 users) in its own
process; this process opens WebSocket handshakes one after another and
times each refusal, interleaving the kinds so that drift hits all alike:

  no token        ?token= empty
  wrong token     a random token of a real token's length
  near miss       a real token with its last character changed
  removed user    a token that was in the file before a SIGHUP took it out

and, after them, accepted handshakes. The refusals should not differ by
more than the noise between two samples of one kind (compared: the medians,
and the spread of each).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .report import median, pct, save, table, verdict


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def handshake(port: int, token: str) -> tuple[int, float]:
    req = (f"GET /ws?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port)) as s:
        t0 = time.perf_counter()
        s.sendall(req.encode())
        head = s.recv(4096)
        took = time.perf_counter() - t0
    return int(head.split(b" ", 2)[1]), took


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench auth")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rounds = 200 if args.quick else 1000
    users = {f"user{i}": f"user{i}-" + secrets.token_urlsafe(18) for i in range(20)}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work:
        path = os.path.join(work, "tokens.json")
        with open(path, "w") as f:
            json.dump({t: u for u, t in users.items()}, f)
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "sessionlog_store", "serve", "--root", os.path.join(work, "s"),
                                 "--port", str(port), "--auth", "tokens-file", "--tokens-file", path,
                                 "--limit-connections", "0", "--log-level", "ERROR"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        while "serving" not in (line := proc.stdout.readline()):
            if not line:
                raise SystemExit("the server did not start")
        try:
            removed = users.pop("user19")
            with open(path, "w") as f:
                json.dump({t: u for u, t in users.items()}, f)
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.5)
            real = users["user0"]
            kinds = {
                "no token": lambda: "",
                "wrong token": lambda: secrets.token_urlsafe(18)[: len(real)],
                "near miss": lambda: real[:-1] + ("A" if real[-1] != "A" else "B"),
                "removed user": lambda: removed,
                "accepted": lambda: real,
            }
            times: dict[str, list[float]] = {k: [] for k in kinds}
            statuses: dict[str, set[int]] = {k: set() for k in kinds}
            order = [k for k in kinds if k != "accepted"]
            rng = random.Random(1)
            for _ in range(rounds):  # the refusals, in a new order each round (no kind always first)
                rng.shuffle(order)
                for kind in order:
                    status, took = handshake(port, kinds[kind]())
                    statuses[kind].add(status)
                    times[kind].append(took)
            for _ in range(rounds):  # apart: an accepted connection's close costs the next ones
                status, took = handshake(port, kinds["accepted"]())
                statuses["accepted"].add(status)
                times["accepted"].append(took)
                time.sleep(0.002)
        finally:
            proc.terminate()
            proc.wait(30)
    rows = [{"kind": k, "status": ",".join(map(str, sorted(statuses[k]))), "p50 us": median(v) * 1e6,
             "p90 us": pct(v, 90) * 1e6, "samples": len(v)} for k, v in times.items()]
    print(table(f"{rounds} handshakes of each kind, interleaved, against a real serve", rows))
    refused = [r for r in rows if r["kind"] != "accepted"]
    p50s = [float(r["p50 us"]) for r in refused]  # type: ignore[arg-type]
    print(verdict("refusals' medians, largest / smallest (target <= 1.1: the same path whatever was wrong)",
                  max(p50s) / min(p50s), 1.1, higher_is_better=False))
    print(verdict("every refusal is a 403", float(all(r["status"] == "403" for r in refused)), 1.0))
    print(save("auth", {"rows": rows}))
    return 0
