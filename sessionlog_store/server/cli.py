"""The `sessionlog` command: serve, rebuild, verify, inspect, repair, users."""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Final

from sessionlog_store.eventstore.errors import EventStoreError
from sessionlog_store.server.version import DISTRIBUTION, version
from sessionlog_store.eventstore.local.fsio import OS_FILES, lock_root
from sessionlog_store.eventstore.local.storeformat import check_format, stamp_format

from sessionlog_store.server.logs import LOG_FORMATS, setup_logging

if TYPE_CHECKING:
    from sessionlog_store.server.migrate import StreamTarget

ENV_ROOT: Final = "SESSIONLOG_ROOT"


# Exit codes of every command (serve adds its own, see server/edge/ws.py; the README lists them all).
EXIT_OK: Final = 0
EXIT_PROBLEMS: Final = 1   # verify found problems; rebuild left sessions quarantined
EXIT_USAGE: Final = 2      # a bad command line (argparse)
EXIT_CANNOT: Final = 3     # could not run: no store at --root, the root is locked, a disk error


def default_root() -> str:
    """`$SESSIONLOG_ROOT`, else `$XDG_DATA_HOME/sessionlog`, else `~/.local/share/sessionlog`."""
    if os.environ.get(ENV_ROOT):
        return os.environ[ENV_ROOT]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "sessionlog")


def _progress(label: str):
    step = [0]

    def report(done: int, total: int) -> None:
        if total >= 200 and (done == total or done - step[0] >= max(100, total // 20)):
            step[0] = done
            print(f"  {label}: {done}/{total} sessions", file=sys.stderr, flush=True)
    return report


def _existing_store(root: str) -> str:
    """The absolute path of an existing data root; a typo never creates an empty store."""
    path = os.path.abspath(root)
    if not os.path.isdir(path):
        raise CannotRun(f"no store at {root} (no such directory)")
    if not any(os.path.exists(os.path.join(path, name)) for name in ("sessions", "index.json", "projects")):
        raise CannotRun(f"no store at {root} (no sessions/, index.json or projects/ in it)")
    check_format(OS_FILES, path)  # a newer build's root: refused before anything reads it
    return path


class CannotRun(Exception):
    """The command cannot run here (exit code EXIT_CANNOT)."""


def _need_nats() -> None:
    """The JetStream backend's client is an extra: say which, not a traceback."""
    import importlib.util
    if importlib.util.find_spec("nats") is None:
        raise CannotRun("the JetStream backend (nats://) needs the nats extra, which is not installed: "
                        "pip install 'sessionlog-store[nats]'")


def _target(args: argparse.Namespace, servers: tuple[str, ...]) -> StreamTarget:
    from sessionlog_store.server.migrate import StreamTarget
    _need_nats()
    return StreamTarget(servers, stream=args.nats_stream, replicas=args.nats_replicas)


def cmd_rebuild(args: argparse.Namespace) -> int:
    from sessionlog_store.projections.rebuild import rebuild
    if args.backend:
        import trio

        from sessionlog_store.server.migrate import replay_stream
        n, records, seconds = trio.run(replay_stream, _target(args, args.backend))
        print(f"replayed stream {args.nats_stream}: {n} sessions, {records} records through the registry fold, "
              f"in {seconds:.2f} s (a worker's start; a worker caches nothing on disk, so nothing is rewritten)")
        return EXIT_OK
    root = _existing_store(args.root)
    fd = lock_root(root)
    try:
        from sessionlog_store.server.gc_policy import gc_paused
        from sessionlog_store.server.local.search import rebuild_writer
        with gc_paused(), rebuild_writer(root) as write_search:
            r = rebuild(OS_FILES, root, progress=_progress("rebuild"), each=write_search)
    finally:
        os.close(fd)
    print(f"rebuilt {args.root}: {r.sessions} sessions, {r.records} records, {r.snapshots} snapshots (and the search index), "
          f"{len(r.torn_repaired)} torn tails repaired, {len(r.quarantined)} sessions quarantined, "
          f"{len(r.unfinished_deletions)} unfinished deletions completed, in {r.seconds:.2f} s")
    for line in r.torn_repaired + [f"quarantined: {q}" for q in r.quarantined] + r.notes:
        print(f"  {line}")
    return EXIT_PROBLEMS if r.quarantined else EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from sessionlog_store.projections.rebuild import verify
    if args.backend:
        import trio

        from sessionlog_store.server.migrate import verify_stream
        n, bad, notes = trio.run(verify_stream, _target(args, args.backend), _progress("verify"))
        for line in bad + notes:
            print(line)
        print(f"verified {n} sessions on stream {args.nats_stream}: {len(bad)} problem(s)")
        return EXIT_PROBLEMS if bad else EXIT_OK
    n, problems = verify(OS_FILES, _existing_store(args.root), progress=_progress("verify"))
    for p in problems:
        print(p)
    print(f"verified {n} sessions: {len(problems)} problem(s)")
    return EXIT_PROBLEMS if problems else EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    """Copy every session between a data root and a stream (either way)."""
    import trio

    from sessionlog_store.server import migrate
    def stream(side: str) -> tuple[str, ...]:
        return _backend_urls(side) if "://" in side else ()
    try:
        src, dst = stream(args.source), stream(args.target)
    except argparse.ArgumentTypeError as e:
        raise CannotRun(str(e)) from None
    if src or dst:
        _need_nats()
    if bool(src) == bool(dst):
        raise CannotRun("migrate copies between a data root and a stream: one of --from and --to must be "
                        "nats://HOST:PORT[,...], the other a directory")
    if dst:
        check_nats_servers(args)
        root = _existing_store(args.source)
        fd = lock_root(root)  # the store is not served meanwhile
        try:
            report = trio.run(migrate.local_to_stream, OS_FILES, root, _target(args, dst), _progress("migrate"))
        finally:
            os.close(fd)
    else:
        root = os.path.abspath(args.target)
        os.makedirs(root, exist_ok=True)
        fd = lock_root(root)
        try:
            stamp_format(OS_FILES, root)
            report = trio.run(migrate.stream_to_local, OS_FILES, root, _target(args, src), _progress("migrate"))
        finally:
            os.close(fd)
    for line in report.problems:
        print(f"  {line}")
    print(report.summary(args.source, args.target))
    return EXIT_PROBLEMS if report.problems else EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from sessionlog_store.projections.rebuild import inspect
    out = sys.stdout.buffer
    for line in inspect(OS_FILES, _existing_store(args.root), args.session_id, args.after):
        out.write(line + b"\n")
    out.flush()
    return EXIT_OK


def cmd_repair(args: argparse.Namespace) -> int:
    from sessionlog_store.projections.rebuild import repair, repair_projects
    if args.target is None and not args.project_log and not args.journal:
        raise CannotRun("repair needs a session id, `projects`, --project-log or --journal")
    root = _existing_store(args.root)
    fd = lock_root(root)
    try:
        if args.journal:
            from sessionlog_store.eventstore.local.journal import apply_journal
            rep = apply_journal(OS_FILES, root, missing_logs="keep")
            print(rep.summary())
            for note in rep.notes:
                print(note)
            return EXIT_OK
        from sessionlog_store.eventstore.local.log import log_path
        # `projects` names the project log, unless a session has that id (then
        # `--project-log` names the project log).
        if args.project_log or (args.target == PROJECTS_TARGET and not os.path.exists(log_path(root, PROJECTS_TARGET))):
            print(repair_projects(OS_FILES, root, allow_empty=args.allow_empty))
        else:
            print(repair(OS_FILES, root, args.target, allow_empty=args.allow_empty))
    finally:
        os.close(fd)
    return EXIT_OK


def cmd_users(args: argparse.Namespace) -> int:
    """Offboarding one user (server/offboard.py): list, export, delete, transfer;
    on a shared stream, as one more worker (no data root of its own)."""
    from sessionlog_store.server import offboard
    if args.backend:
        _need_nats()
        check_nats_servers(args)
        # (checkpoints on whatever the flag says: a deletion then removes the
        # sessions' snapshots from the stream's cache, and the stop writes the
        # registry checkpoint without them)
        return offboard.run(args, os.path.abspath(args.root), _stream_config(
            args, make_stream=False, stream_checkpoint_interval=args.nats_checkpoint_interval or 30.0))
    return offboard.run(args, _existing_store(args.root))


def _stream_config(args: argparse.Namespace, **more: Any):
    """The StoreConfig of a worker on the shared stream `--backend` names."""
    from sessionlog_store.server.config import StoreConfig
    return StoreConfig(**{"backend": args.backend, "stream": args.nats_stream, "replicas": args.nats_replicas,
                          "lease_ttl": args.lease_ttl, "publish_retry": args.nats_retry_for,
                          "stream_checkpoint_interval": args.nats_checkpoint_interval, **more})


def maintenance_config(args: argparse.Namespace):
    from sessionlog_store.projections.maintenance import DAY, MaintenanceConfig
    return MaintenanceConfig(empty_shell_age=args.empty_shell_age, archive_ttl=args.archive_ttl_days * DAY,
                             max_sessions=args.max_sessions)


def cmd_serve(args: argparse.Namespace) -> int:
    args.forwarded_allow_ips = [ip.strip() for item in args.forwarded_allow_ips for ip in item.split(",") if ip.strip()]
    from sessionlog_store.server.run import run_server
    if args.backend:
        _need_nats()
        check_nats_servers(args)
    return run_server(args, store_config=_stream_config(
        args,
        project_roots=tuple(os.path.abspath(r) for r in args.project_root), many_users=args.auth != "token",
        maintenance=maintenance_config(args), sync_mode=args.sync_mode,
        journal_sync_interval=args.journal_sync_interval, log_write_interval=args.log_write_interval,
        progress_interval=args.progress_interval,
        progress_slots=args.progress_slots or None, checkpoint_interval=args.checkpoint_interval,
        snapshot_interval=args.snapshot_interval, stall_timeout=args.stall_timeout,
        state_cache=args.state_cache))


def cmd_maintenance(args: argparse.Namespace) -> int:
    """What the next start's maintenance removes (--dry-run), or run it now."""
    import time

    from sessionlog_store.projections.maintenance import plan_maintenance
    from sessionlog_store.projections.recovery import recover_registry
    root = _existing_store(args.root)
    cfg = maintenance_config(args)
    if args.dry_run:
        registry, damaged, _ = recover_registry(OS_FILES, root, repair=False)
        healthy = [m for sid, m in registry.rows.items() if sid not in damaged]
        plan = plan_maintenance(healthy, time.time(), cfg)
        for sid, why in plan.removals():
            meta = registry.rows[sid]
            print(f"would remove {sid} ({why}): {meta.title or meta.preview or '(untitled)'}")
        print(plan.summary().replace("removed", "would remove", 1) + " (dry run: nothing changed)")
        return EXIT_OK
    import trio

    from sessionlog_store.server.config import StoreConfig

    from sessionlog_store.server.stores import open_session_store

    async def run() -> None:
        async with open_session_store(root, config=StoreConfig(maintenance=cfg)) as store:
            for sid, why in store.removed_at_start:
                print(f"removed {sid} ({why})")
            print(f"{len(store.removed_at_start)} session(s) removed")
    trio.run(run)
    return EXIT_OK


PROJECTS_TARGET: Final = "projects"


def _number(text: str, *, low: float, high: float, what: str, open_low: bool = False) -> float:
    """An option's number, or an argparse error saying what is wrong with it."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (low < x if open_low else low <= x) or not x < high:
        raise argparse.ArgumentTypeError(f"{text} is not {what}")
    return x


def _non_negative(text: str) -> float:
    return _number(text, low=0, high=float("inf"), what="allowed: it must not be negative (0 turns the rule off)")


def _retention(p: argparse.ArgumentParser) -> None:
    """The spec's retention rules (startup maintenance); each 0 = off."""
    p.add_argument("--empty-shell-age", type=_non_negative, metavar="SECONDS", default=3600.0,
                   help="remove sessions with no message older than this (0: never)")
    p.add_argument("--archive-ttl-days", type=_non_negative, metavar="DAYS", default=90.0,
                   help="remove archived sessions not updated for this long (0: never)")
    p.add_argument("--max-sessions", type=_count, metavar="N", default=1000,
                   help="cap the registry, removing the oldest archived sessions first (0: no cap)")


def _count(text: str) -> int:
    return int(_non_negative(text))


class EnvList(list):
    """A repeatable option's values from the environment: flags given on the
    command line replace them (argparse would append to them)."""


class EnvError(str):
    """A bad value in the environment for an option not given on the command
    line: reported (exit 2) only when the command that has it runs."""


def _flags_replace_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for sub in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        chosen = sub.choices.get(getattr(args, "command", ""))
        for action in chosen._actions if chosen is not None else ():
            env = action.default
            value = getattr(args, action.dest, None)
            if isinstance(env, EnvList) and isinstance(value, list) and value is not env and len(value) > len(env):
                setattr(args, action.dest, value[len(env):])


def _env_defaults(p: argparse.ArgumentParser, secret: frozenset[str] = frozenset({"token"})) -> None:
    """Every `--some-option` of `p` may come from `$SESSIONLOG_SOME_OPTION`
    (checked like the flag; a flag on the command line wins), and its help says
    so with its default (not a secret's value)."""
    for action in p._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest == "help" or action.dest == "dry_run":
            continue
        name = "SESSIONLOG_" + longs[0][2:].upper().replace("-", "_")
        text = os.environ.get(name)
        if text is not None:
            try:
                items = ([t.strip() for t in text.split(",") if t.strip()]
                         if isinstance(action, argparse._AppendAction) else [text])
                values = [action.type(t) if action.type is not None else t for t in items]  # type: ignore[operator]
            except (argparse.ArgumentTypeError, ValueError) as e:
                action.default = EnvError(f"${name}: {e}")
                continue
            bad = [v for v in values if action.choices is not None and v not in action.choices]
            if bad:
                action.default = EnvError(f"${name}: {bad[0]!r} is not one of "
                                          f"{', '.join(map(str, action.choices or ()))}")
                continue
            if isinstance(action, argparse._AppendAction):
                action.default = EnvList(values)
            else:
                action.default = values[0]
        shown = "(set)" if action.dest in secret and action.default else action.default
        if isinstance(action.default, EnvError):
            shown = "invalid"
        elif isinstance(action, argparse._AppendAction):
            shown = ",".join(action.default) or "none"
        action.help = f"{action.help or ''} [${name}; default: {shown}]".strip()


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is not a port (0-65535; 0 picks a free one)")
    return n


def _seconds(text: str) -> float:
    return _number(text, low=0, high=86400, open_low=True, what="a duration in seconds (0 < s < 86400)")


def _seconds_or_off(text: str) -> float:
    return _number(text, low=0, high=86400, what="a duration in seconds (0: off; at most 86400)")


_LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(text: str) -> str:
    if text.upper() not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(_LOG_LEVELS)}")
    return text.upper()


def _users(s: argparse.ArgumentParser) -> None:
    """Many users on one server (docs/SECURITY.md)."""
    from sessionlog_store.server.edge.auth import AUTH_MODES, MAX_LEEWAY
    s.add_argument("--auth", choices=AUTH_MODES, default="token",
                   help="who clients are: the one --token (one user), a --tokens-file, a --user-header set by an "
                        "auth proxy in --forwarded-allow-ips, or a signed JWT (--jwt-secret or --jwt-jwks)")
    s.add_argument("--tokens-file", default=None, metavar="FILE",
                   help='JSON {"token": "user id", ...} for --auth tokens-file; re-read on SIGHUP')
    s.add_argument("--user-header", default="X-Forwarded-User", metavar="NAME",
                   help="the header holding the user id for --auth proxy-header")
    s.add_argument("--jwt-secret", default=None, metavar="SECRET",
                   help="HS256 key (32+ characters) for --auth jwt; better from the environment")
    s.add_argument("--jwt-jwks", default=None, metavar="FILE", help="a JWKS file of public keys for --auth jwt")
    s.add_argument("--jwt-audience", default=None, metavar="AUD", help="the aud a JWT must carry")
    s.add_argument("--jwt-issuer", default=None, metavar="ISS", help="the iss a JWT must carry")
    s.add_argument("--jwt-leeway", type=_non_negative, default=30.0, metavar="SECONDS",
                   help=f"clock skew allowed on exp/nbf/iat (at most {MAX_LEEWAY:g})")
    s.add_argument("--admin", action="append", default=[], metavar="USER",
                   help="a user who may list and read every user's sessions, each read logged (repeatable)")
    s.add_argument("--project-root", action="append", default=[], metavar="DIR",
                   help="a folder projects may lie under (repeatable; default: the home directory)")
    lim = "per user; default: none with --auth token, {} otherwise; 0: none"
    s.add_argument("--limit-sessions", type=_count, default=None, metavar="N",
                   help="sessions a user may own (" + lim.format(1000) + ")")
    s.add_argument("--limit-running", type=_count, default=None, metavar="N",
                   help="replies a user may have running at once (" + lim.format(4) + ")")
    s.add_argument("--limit-rate", type=_non_negative, default=None, metavar="FRAMES/S",
                   help="frames a user may send a second, all connections together (" + lim.format(20) + ")")
    s.add_argument("--limit-burst", type=_count, default=None, metavar="N",
                   help="frames above the rate taken at once (default: 100 with a rate set by mode, else 2x the rate)")
    s.add_argument("--limit-frame-bytes", type=_count, default=None, metavar="BYTES",
                   help="bytes one frame may have (default: 1048576 with --auth token, 262144 otherwise)")
    s.add_argument("--limit-connections", type=_count, default=None, metavar="N",
                   help="WebSocket connections a user may hold at once (" + lim.format(20) + ")")
    s.add_argument("--limit-projects", type=_count, default=None, metavar="N",
                   help="projects a user may create (" + lim.format(100) + ")")


def _backend(s: argparse.ArgumentParser) -> None:
    """Where the event log lives: the local JSONL logs, or a NATS JetStream
    stream shared by several workers (docs/SCALEOUT.md)."""
    s.add_argument("--backend", type=_backend_urls, default="local", metavar="local|nats://HOST:PORT[,HOST:PORT...]",
                   help="the event log: local (the JSONL logs under --root) or a NATS JetStream cluster "
                        "shared with other workers (default: local)")
    _stream_flags(s)
    _nats_checks(s)
    s.add_argument("--lease-ttl", type=_seconds, default=15.0, metavar="SECONDS",
                   help="a reply's lease lives this long unrenewed; a dead worker's replies are "
                        "aborted after it (JetStream backend)")
    s.add_argument("--nats-retry-for", type=_seconds, default=60.0, metavar="SECONDS",
                   help="a publish the servers do not answer is sent again for this long (a leader election "
                        "takes 4-9 s); then the worker's store fails and it exits 5 for its supervisor to "
                        "restart it (JetStream backend)")
    s.add_argument("--nats-checkpoint-interval", type=_seconds_or_off, default=30.0, metavar="SECONDS",
                   help="write the registry checkpoint to the stream's cache bucket this often when the stream "
                        "moved; a start replays only what follows it (0: none, a start replays the whole stream)")


def _stream_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--nats-stream", default="SESSIONLOG", metavar="NAME",
                   help="the stream every worker shares (serve creates it if missing; users needs it there)")
    s.add_argument("--nats-replicas", type=_count, default=3, metavar="N",
                   help="copies of the stream and the lease bucket (1 needs --nats-allow-single-replica)")


def _nats_checks(s: argparse.ArgumentParser) -> None:
    s.add_argument("--nats-allow-single-replica", action="store_true",
                   help="accept an R1 stream: one lost disk or node loses acknowledged records")
    s.add_argument("--nats-monitor", action="append", default=[], metavar="URL",
                   help="a server's monitoring endpoint (http://HOST:8222; repeatable): each must report "
                        "sync_interval: always on /varz, or serve refuses to start")
    s.add_argument("--nats-accept-unsynced", action="store_true",
                   help="start without checking that the servers fsync before they acknowledge "
                        "(acknowledged records may be lost in a power cut)")


def _backend_urls(text: str) -> tuple[str, ...]:
    """`local` (or nothing): (); else the NATS servers' URLs."""
    text = text.strip()
    if text in ("", "local"):
        return ()
    urls = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        url = part if "://" in part else f"nats://{part}"
        scheme, _, rest = url.partition("://")
        host, _, port = rest.rstrip("/").rpartition(":")
        if scheme not in ("nats", "tls") or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"{part!r} is not nats://HOST:PORT")
        urls.append(url)
    if not urls:
        raise argparse.ArgumentTypeError("no server in --backend")
    return tuple(urls)


def check_nats_servers(args: argparse.Namespace) -> None:
    """Refuse an R1 stream and servers that do not fsync before they ack,
    unless told (CannotRun says which flag accepts the risk); wait for a
    quorum of the monitors to answer (server/natscheck.py). The monitors
    that did not answer go into `args.late_monitors`; serve checks every one
    of them (`args.watched_monitors`) again while it runs."""
    from sessionlog_store.server.natscheck import ServersUnfit, wait_for_quorum
    args.late_monitors, args.watched_monitors = [], []
    if args.nats_replicas < 2 and not args.nats_allow_single_replica:
        raise CannotRun("--nats-replicas 1 keeps one copy of every record: one lost disk loses acknowledged "
                        "records; give --nats-allow-single-replica to accept that")
    monitors = [m.strip() for item in args.nats_monitor for m in item.split(",") if m.strip()]
    if args.nats_accept_unsynced:
        return
    if not monitors:
        raise CannotRun("cannot check that the NATS servers fsync before they acknowledge: give each "
                        "server's monitoring URL with --nats-monitor (their jetstream block needs "
                        "sync_interval: always), or --nats-accept-unsynced to accept the risk")
    args.watched_monitors = monitors  # all of them, checked again while it serves (one restarted unsynced)
    try:
        args.late_monitors = wait_for_quorum(monitors, lambda line: print(f"sessionlog: {line}", file=sys.stderr,
                                                                           flush=True))
    except ServersUnfit as e:
        raise CannotRun(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sessionlog", description="A durable session store for AI-agent chat apps.")
    p.add_argument("--version", action="version", version=f"sessionlog (the {DISTRIBUTION} distribution) {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    root_help = f"data directory (default: ${ENV_ROOT} or {default_root()})"

    s = sub.add_parser("serve", help="run the WebSocket server and the web page")
    s.add_argument("--root", default=default_root(), help="data directory")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    s.add_argument("--port", type=_port, default=8765, help="port (0 picks a free one)")
    s.add_argument("--token", default=None, help="access token (unset: a new random one per start)")
    s.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="an extra allowed Origin (repeatable; comma-separated in the environment); "
                        "the server's own origin is always allowed")
    s.add_argument("--allowed-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="an extra Host the page and /ws answer (repeatable; a LAN name or address, a proxied "
                        "name); loopback names on the bound port are always allowed")
    s.add_argument("--public-url", default=None, metavar="URL",
                   help="the URL users open (https://chat.example.com/chat): its host and origin are allowed and "
                        "its path is the root path")
    s.add_argument("--forwarded-allow-ips", action="append", default=[], metavar="IP",
                   help="peers whose X-Forwarded-For/-Proto/-Host are believed (repeatable, or comma-separated; "
                        "* for any, as uvicorn's)")
    s.add_argument("--root-path", default="", metavar="/PREFIX",
                   help="a path prefix the server is reached under (requests with or without it are served)")
    s.add_argument("--ws-ping-interval", type=_non_negative, default=20.0, metavar="SECONDS",
                   help="WebSocket keepalive ping period; no pong within as long drops the client (0: off)")
    s.add_argument("--agent-speed", type=float, default=30.0, help="demo agent tokens per second")
    s.add_argument("--agent", action="append", default=[], metavar="NAME=module:factory",
                   help="the agent that answers sessions whose agent_id is NAME (repeatable; `default` replaces the "
                        "demo agent), e.g. gpt=sessionlog_store.server.agents.openai_compat:from_env")
    _retention(s)
    s.add_argument("--producer-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                   help="an external producer (HTTP API) silent this long loses its reply: aborted, producer lost")
    s.add_argument("--streams-anonymous", action="store_true",
                   help="let requests without credentials from this machine (loopback, no proxy) use their own "
                        "generic streams under /v1/stream/ (never sessions): for local tools and the Durable "
                        "Streams conformance suite")
    s.add_argument("--stop-grace", type=_seconds, default=10.0, metavar="SECONDS",
                   help="how long a stop (SIGINT/SIGTERM) may take before the server exits anyway with code 4")
    s.add_argument("--log-level", type=_log_level, default="INFO", help=f"one of {', '.join(_LOG_LEVELS)}")
    s.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="text, or json: one JSON object a line on stderr")
    # the store's tunables (server.store.StoreConfig)
    s.add_argument("--sync-mode", choices=("journal", "auto", "syncfs", "fdatasync"), default="journal",
                   help="how appends are made durable (README: Configuration)")
    s.add_argument("--journal-sync-interval", type=_seconds, default=1.0, metavar="SECONDS",
                   help="how often the logs are synced and journal segments removed")
    s.add_argument("--log-write-interval", type=_seconds_or_off, default=1.0, metavar="SECONDS",
                   help="how long acknowledged records wait in the journal for the next ones before their "
                        "session's log is written (a read never waits for it; 0: write each batch at once)")
    s.add_argument("--progress-interval", type=_seconds, default=0.25, metavar="SECONDS",
                   help="how often a streaming reply's progress is written")
    s.add_argument("--progress-slots", type=_count, default=0, metavar="N",
                   help="phases of the progress interval (0: 20 with the journal, 1 with a direct mode)")
    s.add_argument("--checkpoint-interval", type=_seconds, default=5.0, metavar="SECONDS",
                   help="index.json debounce")
    s.add_argument("--snapshot-interval", type=_seconds, default=2.0, metavar="SECONDS",
                   help="snapshot.json debounce for running sessions")
    s.add_argument("--stall-timeout", type=_seconds, default=300.0, metavar="SECONDS",
                   help="a running reply silent this long is aborted as stalled")
    s.add_argument("--state-cache", type=_count, default=256, metavar="N",
                   help="loaded sessions kept in memory besides running ones")
    _users(s)
    _backend(s)
    _env_defaults(s, secret=frozenset({"token", "jwt_secret"}))
    s.set_defaults(func=cmd_serve)

    r = sub.add_parser("rebuild", help="rebuild index.json, every snapshot and the search index from the logs")
    r.add_argument("--root", default=default_root(), help=root_help)
    r.add_argument("--backend", type=_backend_urls, default="local", metavar="local|nats://HOST:PORT[,...]",
                   help="replay a stream instead (what a worker's start does), changing nothing")
    _stream_flags(r)
    r.set_defaults(func=cmd_rebuild)

    v = sub.add_parser("verify", help="check logs and caches; change nothing; exit 1 on any problem")
    v.add_argument("--root", default=default_root(), help=root_help)
    v.add_argument("--backend", type=_backend_urls, default="local", metavar="local|nats://HOST:PORT[,...]",
                   help="check a stream's sessions instead (records, seqs, tombstones, leaseless replies)")
    _stream_flags(v)
    v.set_defaults(func=cmd_verify)

    g = sub.add_parser("migrate", help="copy every session between a data root and a NATS JetStream stream "
                                       "(either way), each read back and compared; safe to run again")
    g.add_argument("--from", dest="source", required=True, metavar="DIR|nats://HOST:PORT[,...]")
    g.add_argument("--to", dest="target", required=True, metavar="DIR|nats://HOST:PORT[,...]")
    _stream_flags(g)
    _nats_checks(g)
    g.set_defaults(func=cmd_migrate)

    i = sub.add_parser("inspect", help="print a session's records (JSON lines)")
    i.add_argument("--root", default=default_root(), help=root_help)
    i.add_argument("session_id")
    i.add_argument("--after", type=int, default=0, metavar="SEQ", help="only records with seq > SEQ")
    i.set_defaults(func=cmd_inspect)

    m = sub.add_parser("maintenance", help="the spec's retention: with --dry-run, print what the next start "
                                          "would remove; without, run it now (stop the server first)")
    m.add_argument("--root", default=default_root(), help=root_help)
    m.add_argument("--dry-run", action="store_true", help="print what would be removed; change nothing")
    _retention(m)
    _env_defaults(m)
    m.set_defaults(func=cmd_maintenance)

    f = sub.add_parser("repair", help="cut a quarantined session's log (or the project log: `repair projects`) "
                                      "back to its last good record")
    f.add_argument("--root", default=default_root(), help=root_help)
    f.add_argument("target", metavar="SESSION_ID|projects", nargs="?")
    f.add_argument("--project-log", action="store_true", help="repair the project log (projects/log.jsonl)")
    f.add_argument("--journal", action="store_true",
                   help="apply the journal where a start refuses to (logs missing, and the journal damaged): "
                        "what can be applied is, the journal is kept in journal-damaged-N")
    f.add_argument("--allow-empty", action="store_true",
                   help="allow a repair that keeps no record (damage in line 1); the log is emptied, "
                        "its bytes kept beside it, and the session stays listed as damaged")
    f.set_defaults(func=cmd_repair)
    _users_commands(sub, root_help)
    return p


def _users_commands(sub: argparse._SubParsersAction, root_help: str) -> None:
    """`sessionlog users list|export|delete|transfer` (docs/SECURITY.md: offboarding)."""
    u = sub.add_parser("users", help="offboarding: list the owners; export, delete or transfer one user's "
                                     "sessions and projects (stop the server first)")
    u.set_defaults(func=cmd_users)
    us = u.add_subparsers(dest="users_command", required=True, metavar="list|export|delete|transfer")
    who = 'a user id ("" names the single user of --auth token)'
    made = {name: us.add_parser(name, help=text) for name, text in (
        ("list", "every owner: its sessions, projects and last update"),
        ("export", "a tar of one user's session logs, byte for byte, and a manifest"),
        ("delete", "delete every session and project of one user (a durable tombstone each)"),
        ("transfer", "give every session and project of one user to another (an appended record each)"))}
    for name, q in made.items():
        q.add_argument("--root", default=default_root(), help=root_help)
        _backend(q)
        if name != "list":
            q.add_argument("user", metavar="USER", help=who)
        if name in ("delete", "transfer"):
            q.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
    made["export"].add_argument("--out", metavar="FILE", default=None,
                                help="write the tar here (never over an existing file); default: stdout, "
                                     "unless it is a terminal")
    made["transfer"].add_argument("--to", required=True, metavar="OTHER", help="the user who receives them")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    bad = [v for v in vars(args).values() if isinstance(v, EnvError)]
    if bad:
        parser.error(bad[0])
    _flags_replace_env(parser, args)
    setup_logging(getattr(args, "log_level", "WARNING"), getattr(args, "log_format", "text"))
    try:
        return int(args.func(args) or 0)
    except (CannotRun, EventStoreError, OSError, ValueError) as e:
        print(f"sessionlog: error: {e}", file=sys.stderr)
        return EXIT_CANNOT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
