"""The `sessionlog serve` process: opens the store, starts the edge with its
agents, handles signals, the stop watchdog and the exit codes (README).
Wires server.domain, server.agents and server.edge together."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import quote

import trio

from sessionlog_store.eventstore.errors import EventStoreError, leaf_errors
from sessionlog_store.eventstore.local.fsio import OS_FILES, FileOps
from sessionlog_store.server.agents import Agent, DemoAgent, load_agents
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store, open_streams
from sessionlog_store.server.edge.auth import AuthConfig, JwtConfig, make_authenticator
from sessionlog_store.server.edge.limits import MULTI_USER, Limits
from sessionlog_store.server.edge.ws import Server, ServerConfig
from sessionlog_store.server.gc_policy import tune_gc

log = logging.getLogger("sessionlog.run")


async def serve_store(root: str, config: ServerConfig, *, agent: Agent | None = None,
                      agents: dict[str, Agent] | None = None,
                      store_config: StoreConfig | None = None,
                      on_ready: Callable[[Server], None] | None = None, fs: FileOps = OS_FILES) -> None:
    """Open the store (recovering first), serve until cancelled, shut down gracefully."""
    async with open_session_store(root, config=store_config, fs=fs) as store, \
            open_streams(root, config=store_config, fs=fs) as space:
        server = Server(store, config, agent or DemoAgent(), agents, streams=space)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            tune_gc()
            if on_ready is not None:
                on_ready(server)


# `sessionlog serve` exit codes (documented in the README).
EXIT_OK: Final = 0             # stopped by SIGINT/SIGTERM, everything finalized and checkpointed
EXIT_STARTUP: Final = 3        # could not start: root locked or unusable, port in use, a damaged store file
EXIT_STOP_TIMEOUT: Final = 4   # the stop took longer than --stop-grace (or a second signal came)
EXIT_STORE_FAILED: Final = 5   # the store failed while serving (a write or sync error); restart to recover
# How long a graceful stop may take before the server exits anyway.
STOP_GRACE: Final = 10.0


def where(error: BaseException) -> str:
    """Where an error that is not the store's own came from: the last of
    this package's frames it passed ("nats: timeout" alone does not say
    which request), or nothing for the store's errors, which say it."""
    import traceback
    if isinstance(error, EventStoreError):
        return ""
    ours = [f for f in traceback.extract_tb(error.__traceback__) if f"{os.sep}sessionlog_store{os.sep}" in f.filename]
    if not ours:
        return ""
    f = ours[-1]
    return f" ({type(error).__name__} in {f.name}, {f.filename.rsplit(os.sep + 'sessionlog_store' + os.sep, 1)[1]}:{f.lineno})"


def auth_config(args: Any) -> AuthConfig:
    """--auth and the flags of each mode."""
    mode = getattr(args, "auth", "token")
    jwt = None
    if mode == "jwt":
        jwt = JwtConfig(secret=args.jwt_secret, jwks_file=args.jwt_jwks, audience=args.jwt_audience,
                        issuer=args.jwt_issuer, leeway=args.jwt_leeway)
    return AuthConfig(mode=mode, tokens_file=getattr(args, "tokens_file", None),
                      user_header=getattr(args, "user_header", "X-Forwarded-User"), jwt=jwt,
                      admins=tuple(getattr(args, "admin", ())))


def limits_of(args: Any) -> Limits:
    """--limit-*: what was given, the mode's defaults for the rest."""
    base = Limits() if getattr(args, "auth", "token") == "token" else MULTI_USER
    given = {"sessions": getattr(args, "limit_sessions", None), "running": getattr(args, "limit_running", None),
             "frames_per_second": getattr(args, "limit_rate", None), "burst": getattr(args, "limit_burst", None),
             "frame_bytes": getattr(args, "limit_frame_bytes", None),
             "connections": getattr(args, "limit_connections", None), "projects": getattr(args, "limit_projects", None)}
    return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


def run_server(args: Any, *, agent: Agent | None = None, store_config: StoreConfig | None = None) -> int:
    """`sessionlog serve`: run until SIGINT or SIGTERM, then stop gracefully:
    running replies are finalized `aborted` "server shutdown" with their text
    and the checkpoints are written. A stop that takes longer than
    `args.stop_grace` seconds (a producer that ignores cancellation, a disk
    that does not answer), or a second signal, finalizes what it can and
    exits with EXIT_STOP_TIMEOUT; it never hangs. Startup failures print one
    line and exit with EXIT_STARTUP."""
    try:
        config = ServerConfig(host=args.host, port=args.port, allowed_origins=tuple(args.allow_origin),
                              allowed_hosts=tuple(getattr(args, "allowed_host", ())),
                              public_url=getattr(args, "public_url", None),
                              forwarded_allow_ips=tuple(getattr(args, "forwarded_allow_ips", ())),
                              root_path=getattr(args, "root_path", "") or "",
                              ping_interval=getattr(args, "ws_ping_interval", 20.0),
                              ping_timeout=getattr(args, "ws_ping_interval", 20.0),
                              producer_timeout=float(getattr(args, "producer_timeout", 30.0)),
                              streams_anonymous=bool(getattr(args, "streams_anonymous", False)),
                              auth=auth_config(args), limits=limits_of(args))
        if args.token:
            config.token = args.token
        # a bad tokens file or JWT setting: a startup error, before the store opens
        make_authenticator(config.auth, config.token, config.forwarded_allow_ips)
    except ValueError as e:
        print(f"sessionlog: error: {e}", file=sys.stderr)
        return EXIT_STARTUP
    single = config.auth.mode == "token"
    if not single and store_config is not None and not store_config.project_roots:
        log.warning("--auth %s without --project-root: every user may make a project of any folder under "
                    "the home directory (docs/SECURITY.md)", config.auth.mode)
    root = os.path.abspath(args.root)
    grace = float(getattr(args, "stop_grace", STOP_GRACE))
    try:
        agents = load_agents(getattr(args, "agent", ()))
    except (ValueError, ImportError, AttributeError) as e:
        print(f"sessionlog: error: --agent: {e}", file=sys.stderr)
        return EXIT_STARTUP
    started: list[Server] = []

    failed_events: list[trio.Event] = []
    exit_code: list[int] = []  # a reason to stop other than a signal (a late NATS server unsynced)

    def ready(server: Server) -> None:
        started.append(server)
        if store_config is not None and store_config.backend and failed_events:
            # A worker on a shared stream whose store failed serves nothing of
            # worth (its replies are other workers' to sweep): it stops and
            # exits EXIT_STORE_FAILED, for its supervisor to restart it.
            server.store.es.failure_listeners.append(lambda e: failed_events[0].set())
        host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
        print(f"sessionlog: data in {root}", flush=True)
        base = f"http://{host}:{server.port}{config.root_path}/"
        if not single:  # each user brings their own credentials
            print(f"sessionlog: serving {base} (--auth {config.auth.mode})", flush=True)
            return
        if sys.stdout.isatty():  # a person at a terminal: the URL to open
            print(f"sessionlog: serving {base}#token={quote(config.token, safe='')}", flush=True)
            return
        # stdout is a log (journald, docker logs): the token is not written there
        if args.token:
            print(f"sessionlog: serving {base} (token: as configured)", flush=True)
        else:
            path = os.path.join(root, ".token")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(config.token + "\n")
            print(f"sessionlog: serving {base} (token: in {path}, readable by this user only)", flush=True)

    def give_up(why: str) -> None:
        print(f"sessionlog: error: {why}; exiting with what is durable (replies still running are "
              "marked aborted by the next start)", file=sys.stderr, flush=True)
        os._exit(EXIT_STOP_TIMEOUT)

    async def watchdog() -> None:
        """Runs once a stop has begun; the process exits before it wakes
        unless the stop is stuck."""
        await trio.sleep(grace)
        if started:  # finalize what can still be finalized, briefly
            with trio.move_on_after(min(2.0, grace)):
                await started[0].store.abort_running("server shutdown")
        give_up(f"the stop took longer than {grace:g} s (--stop-grace)")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            serving = trio.CancelScope()
            stopping: list[int] = []
            failed_events.append(trio.Event())

            async def check_servers(watched: list[str], late: list[str]) -> None:
                """Every NATS server, again and again while it serves: one
                that answers unsynced (one that was down at the start, or one
                restarted since without `sync_interval: always`) stops the
                worker (EXIT_STARTUP)."""
                from sessionlog_store.server.natscheck import LATE_RECHECK, ServersUnfit, check_one
                silent = set(late)
                while True:
                    await trio.sleep(LATE_RECHECK)
                    for url in watched:
                        try:
                            answered = await trio.to_thread.run_sync(check_one, url)
                        except ServersUnfit as e:
                            log.error("%s; stopping", e)
                            exit_code.append(EXIT_STARTUP)
                            if not stopping:
                                stopping.append(0)
                                nursery.start_soon(watchdog)
                                nursery.start_soon(stop)
                            return
                        if answered and url in silent:
                            silent.discard(url)
                            log.info("the NATS server at %s answers, synced", url)
                        elif not answered and url not in silent:
                            silent.add(url)
                            log.warning("the NATS server at %s does not answer", url)
            if getattr(args, "watched_monitors", None):
                nursery.start_soon(check_servers, list(args.watched_monitors), list(args.late_monitors))

            async def on_store_failure() -> None:
                await failed_events[0].wait()
                if not stopping:
                    log.error("the store failed on the shared stream: stopping; exit %d for a restart",
                              EXIT_STORE_FAILED)
                    stopping.append(0)
                    nursery.start_soon(watchdog)
                    nursery.start_soon(stop)
            nursery.start_soon(on_store_failure)

            async def on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as sigs:
                    async for sig in sigs:
                        if sig == signal.SIGHUP:  # re-read the tokens file or the JWKS
                            log.info("received SIGHUP: reloading credentials")
                            if started:
                                started[0].reload_auth()
                            continue
                        if stopping:
                            give_up(f"a second {signal.Signals(sig).name} during the stop")
                        log.info("received %s: stopping (grace %g s)", signal.Signals(sig).name, grace)
                        stopping.append(sig)
                        nursery.start_soon(watchdog)
                        nursery.start_soon(stop)

            async def stop() -> None:
                with trio.CancelScope(shield=True):
                    if started:
                        with trio.move_on_after(grace / 2):
                            await started[0].prepare_stop()
                serving.cancel()
            nursery.start_soon(on_signal)
            with serving:
                await serve_store(root, config, agent=agent or agents.pop("default", None)
                                  or DemoAgent(speed=args.agent_speed), agents=agents,
                                  store_config=store_config, on_ready=ready)
            nursery.cancel_scope.cancel()
    try:
        trio.run(main)
    except BaseException as e:  # noqa: BLE001 - sorted below: known failures are one line
        errors = leaf_errors(e)
        if not all(isinstance(x, EventStoreError | OSError | ValueError) for x in errors):
            raise
        for x in errors:
            print(f"sessionlog: error: {x}{where(x)}", file=sys.stderr)
        return EXIT_STORE_FAILED if started else EXIT_STARTUP
    failure = started[0].store.failure() if started else None
    if failure is not None:
        print(f"sessionlog: error: the store failed while serving ({failure}); restart to recover",
              file=sys.stderr)
        return EXIT_STORE_FAILED
    if exit_code:
        return exit_code[0]
    log.info("stopped: every reply finalized, the logs synced, index.json written")
    return EXIT_OK
