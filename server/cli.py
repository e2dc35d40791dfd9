"""The `sessionlog` command: serve, rebuild, verify, inspect, repair."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Final

from eventstore.errors import EventStoreError
from eventstore.fsio import OS_FILES, lock_root

ENV_ROOT: Final = "SESSIONLOG_ROOT"


def default_root() -> str:
    """`$SESSIONLOG_ROOT`, else `$XDG_DATA_HOME/sessionlog`, else `~/.local/share/sessionlog`."""
    if os.environ.get(ENV_ROOT):
        return os.environ[ENV_ROOT]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "sessionlog")


def _progress(label: str):  # type: ignore[no-untyped-def]
    step = [0]

    def report(done: int, total: int) -> None:
        if total >= 200 and (done == total or done - step[0] >= max(100, total // 20)):
            step[0] = done
            print(f"  {label}: {done}/{total} sessions", file=sys.stderr, flush=True)
    return report


def cmd_rebuild(args: argparse.Namespace) -> int:
    from projections.rebuild import rebuild
    fd = lock_root(args.root)
    try:
        r = rebuild(OS_FILES, os.path.abspath(args.root), progress=_progress("rebuild"))
    finally:
        os.close(fd)
    print(f"rebuilt {args.root}: {r.sessions} sessions, {r.records} records, {r.snapshots} snapshots, "
          f"{len(r.torn_repaired)} torn tails repaired, {len(r.quarantined)} sessions quarantined, "
          f"{len(r.unfinished_deletions)} unfinished deletions completed, in {r.seconds:.2f} s")
    for line in r.torn_repaired + [f"quarantined: {q}" for q in r.quarantined]:
        print(f"  {line}")
    return 1 if r.quarantined else 0


def cmd_verify(args: argparse.Namespace) -> int:
    from projections.rebuild import verify
    if not os.path.isdir(args.root):
        raise SystemExit(f"sessionlog: error: no store at {args.root}")
    n, problems = verify(OS_FILES, os.path.abspath(args.root), progress=_progress("verify"))
    for p in problems:
        print(p)
    print(f"verified {n} sessions: {len(problems)} problem(s)")
    return 1 if problems else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from projections.rebuild import inspect
    out = sys.stdout.buffer
    for line in inspect(OS_FILES, os.path.abspath(args.root), args.session_id, args.after):
        out.write(line + b"\n")
    out.flush()
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    from projections.rebuild import repair
    fd = lock_root(args.root)
    try:
        print(repair(OS_FILES, os.path.abspath(args.root), args.session_id))
    finally:
        os.close(fd)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .ws import run_server
    return run_server(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sessionlog", description="A durable session store for AI-agent chat apps.")
    sub = p.add_subparsers(dest="command", required=True)
    root_help = f"data directory (default: ${ENV_ROOT} or {default_root()})"

    s = sub.add_parser("serve", help="run the WebSocket server and the web page")
    s.add_argument("--root", default=default_root(), help=root_help)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback)")
    s.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    s.add_argument("--token", default=os.environ.get("SESSIONLOG_TOKEN"),
                   help="access token (default: $SESSIONLOG_TOKEN, else a new random one per start)")
    s.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="an extra allowed Origin (repeatable); the server's own origin is always allowed")
    s.add_argument("--agent-speed", type=float, default=30.0,
                   help="demo agent tokens per second (default 30)")
    s.add_argument("--log-level", default="INFO")
    s.set_defaults(func=cmd_serve)

    r = sub.add_parser("rebuild", help="rebuild index.json and every snapshot from the logs")
    r.add_argument("--root", default=default_root(), help=root_help)
    r.set_defaults(func=cmd_rebuild)

    v = sub.add_parser("verify", help="check logs and caches; change nothing; exit 1 on any problem")
    v.add_argument("--root", default=default_root(), help=root_help)
    v.set_defaults(func=cmd_verify)

    i = sub.add_parser("inspect", help="print a session's records (JSON lines)")
    i.add_argument("--root", default=default_root(), help=root_help)
    i.add_argument("session_id")
    i.add_argument("--after", type=int, default=0, metavar="SEQ", help="only records with seq > SEQ")
    i.set_defaults(func=cmd_inspect)

    f = sub.add_parser("repair", help="cut a quarantined session's log back to its last good record")
    f.add_argument("--root", default=default_root(), help=root_help)
    f.add_argument("session_id")
    f.set_defaults(func=cmd_repair)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "WARNING"), format="%(asctime)s %(levelname)s %(message)s")
    try:
        return int(args.func(args) or 0)
    except (EventStoreError, OSError, ValueError) as e:
        print(f"sessionlog: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
