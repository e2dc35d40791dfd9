"""I/O adapter: TCP <-> HTTP page + WebSocket <-> the session store.

One port serves both. Each TCP connection's request head is read by h11
(http.py): `GET /ws` with an Upgrade header goes, after the Host, Origin and
token checks, to wsproto and trio-websocket; any other `GET` or `HEAD` is
answered as plain HTTP (the page and its static files, probes, metrics).

Each WebSocket connection gets its own nursery and a `Connection`
(connection.py): the reader loop, the bounded send queue, its subscriptions.
This module holds what all connections share: the listener, the HTTP routes,
the Host and Origin checks, the broadcasts and the agents' nursery.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import Any, Final
from urllib.parse import urlsplit

import trio
from trio_websocket import ConnectionClosed
from wsproto.utilities import RemoteProtocolError as WsprotoError

from sessionlog_store.eventstore.errors import EventStoreError
from sessionlog_store.server.agents.base import Agent
from sessionlog_store.server.domain.errors import NotFound
from sessionlog_store.server.domain.store import SessionStore
from sessionlog_store.server.domain.subscriptions import MsgUpdate
from sessionlog_store.server.edge import protocol as p
from sessionlog_store.server.domain.streamspace import StreamSpace
from sessionlog_store.server.edge.auth import (PROTOCOL, PROTOCOL_FAMILY, REFUSED, Principal, anonymous_principal,
                                              make_authenticator, offered_subprotocols)
from sessionlog_store.server.edge.config import ServerConfig as ServerConfig
from sessionlog_store.server.edge.connection import Connection
from sessionlog_store.server.edge.limits import MULTI_USER, Limits, Quotas
from sessionlog_store.server.edge.api import V1, VERSIONED, Api
from sessionlog_store.server.edge.assets import STATIC_NAME, Assets, representation
from sessionlog_store.server.edge.http import Exchange, HTTPError, Request
from sessionlog_store.server.edge.producers import ExternalReply, Producers
from sessionlog_store.server.edge.metrics import CONTENT_TYPE as METRICS_TYPE
from sessionlog_store.server.edge.metrics import ServerMetrics, readiness
from sessionlog_store.server.edge.logstream import LogTaps
from sessionlog_store.server.edge.namespace import Namespace

log = logging.getLogger("sessionlog.ws")

# Operator endpoints (GET and HEAD): liveness, readiness, Prometheus metrics.
OPS_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})


class Server:
    """The WebSocket/HTTP front of one store."""

    def __init__(self, store: SessionStore, config: ServerConfig, agent: Agent,
                 agents: dict[str, Agent] | None = None, streams: StreamSpace | None = None) -> None:
        self.store = store
        self.config = config
        self.agent = agent  # answers sessions whose agent_id has no agent of its own
        self.agents = dict(agents or {})
        self.port = config.port
        self.auth = make_authenticator(config.auth, config.token, config.forwarded_allow_ips)
        self.admins = frozenset(config.auth.admins)
        self.quotas = Quotas(config.limits or (Limits() if config.auth.mode == "token" else MULTI_USER))
        self.connections: set[Connection] = set()
        self.dropped = 0  # connections dropped for not taking their frames
        self.stopping = trio.Event()  # set as a stop begins: live stream reads end their answers
        self.live_reads = 0           # stream reads (/v1/stream/) being answered now
        self._shared: tuple[MsgUpdate | None, str] = (None, "")
        self._agents: trio.Nursery | None = None
        store.scoped_watchers.append(self._on_store_change)
        self.metrics = ServerMetrics(self)
        self.assets = Assets()
        self.producers = Producers(store, self.quotas, config.producer_timeout)
        self.producer_timeout = config.producer_timeout
        self.log_taps = LogTaps(store.es)
        self.namespace = (Namespace(streams, config.root_path, config.public_url, stopping=self.stopping)
                          if streams is not None else None)
        self.api = Api(self)

    # -- security --------------------------------------------------------------

    def allowed_hosts(self) -> set[str]:
        names = {"127.0.0.1", "localhost", "[::1]"}
        if self.config.host not in ("0.0.0.0", "::", ""):
            names.add(self.config.host if ":" not in self.config.host else f"[{self.config.host}]")
        hosts = {f"{n}:{self.port}" for n in names} | ({*names} if self.port == 80 else set())
        hosts |= {h.lower() for h in self.config.allowed_hosts}
        if self.config.public_url is not None:
            hosts.add(_public_netloc(self.config.public_url))
        return hosts

    def allowed_origins(self) -> set[str]:
        """The page's own origins (any allowed host, http or https: the Host was
        checked, and a TLS proxy makes the browser's origin https) and extras."""
        own = {f"{scheme}://{h}" for h in self.allowed_hosts() for scheme in ("http", "https")}
        if self.config.public_url is not None:
            own.add(f"{urlsplit(self.config.public_url).scheme}://{_public_netloc(self.config.public_url)}")
        return own | {o.lower() for o in self.config.allowed_origins}

    def _trusted(self, peer_ip: str) -> bool:
        allow = self.config.forwarded_allow_ips
        return "*" in allow or peer_ip in allow

    def localize(self, req: Request, peer_ip: str) -> tuple[Request, str | None]:
        """The request as this server sees it: the root path taken off its path,
        and, from a trusted proxy, X-Forwarded-Host as its Host. Also the client's
        address from X-Forwarded-For (trusted proxies only), else None."""
        headers = req.headers
        remote = None
        if self.config.forwarded_allow_ips and self._trusted(peer_ip):
            fwd_host = headers.get("x-forwarded-host")
            if fwd_host:
                headers = {**headers, "host": fwd_host.split(",")[0].strip()}
            fwd_for = headers.get("x-forwarded-for")
            if fwd_for:
                # the rightmost entry is the one our trusted proxy added; the
                # ones before it are what the client claimed
                remote = fwd_for.split(",")[-1].strip()
        target = req.target
        root = self.config.root_path
        if root and (target == root or target.startswith(root + "/") or target.startswith(root + "?")):
            target = target[len(root):] or "/"
        return Request(req.method, target, headers), remote

    def check_handshake(self, req: Request, trusted_peer: bool) -> Principal | str:
        """Who this upgrade is from, or why it is refused."""
        if req.headers.get("host", "").lower() not in self.allowed_hosts():
            return "Host not allowed"
        origin = req.headers.get("origin")
        if origin is not None and origin.lower() not in self.allowed_origins():
            return "Origin not allowed"
        cred = self.auth.authenticate(req, trusted_peer)
        if cred is None:
            self.quotas.refused["auth"] += 1
            return REFUSED
        return Principal(user=cred.user, admin=cred.user in self.admins, credential=cred)

    def anonymous(self, req: Request, remote: str) -> Principal | None:
        return anonymous_principal(req, remote, self.config.streams_anonymous)

    def reload_auth(self) -> None:
        """SIGHUP: re-read the credentials; a connection whose credential no
        longer holds (a token removed from the file) is closed."""
        self.auth.reload()
        for conn in list(self.connections):
            cred = conn.principal.credential
            if cred is not None and not self.auth.still_valid(cred):
                conn.end(1008, "credentials revoked")

    # -- connections -----------------------------------------------------------

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        remote = _peer(stream)
        ex = Exchange(stream)
        try:
            while True:
                req = await ex.read_request()
                if req is None:
                    if not ex.idle_end:
                        await ex.reply(400, b"bad request\n", close=True)
                        await ex.linger()
                    return
                if not await self._answer(ex, req, remote) or not ex.next_cycle():
                    return
        except _PEER_GONE:
            pass
        except BaseExceptionGroup as group:  # from the WebSocket's nursery
            cancelled, rest = group.split(trio.Cancelled)
            if rest is not None and rest.split(_PEER_GONE)[1] is not None:
                log.exception("connection handler failed")
            if cancelled is not None:
                raise cancelled from None  # the server is stopping: never swallowed
        except WsprotoError as e:  # what wsproto refused of a checked upgrade
            log.info("WebSocket handshake refused by wsproto: %s", e, extra={"remote": remote})
            await ex.reply(400, b"bad WebSocket handshake\n", close=True)
        except Exception:
            log.exception("connection handler failed")
        finally:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()

    async def _answer(self, ex: Exchange, req: Request, remote: str) -> bool:
        """Answer one request; False: the connection ends after it (a
        WebSocket's end, a refusal)."""
        try:
            raw_path = urlsplit(req.target).path
        except ValueError:  # an unparsable target ("//[x/")
            await ex.reply(400, b"bad request\n", close=True)
            return False
        upgrade = req.headers.get("upgrade", "").lower() == "websocket"
        peer_ip = remote.rsplit(":", 1)[0].strip("[]")
        local, forwarded_for = self.localize(req, peer_ip)  # (the path without the root path: /chat/v1/ is /v1/)
        api = local.path.startswith(V1) or VERSIONED.match(local.path) is not None
        body = b""
        if not upgrade:
            try:
                body = await ex.read_body(self.api.max_body if api else 0)
            except HTTPError as e:
                if api:  # the API's answers are JSON, its refusals too
                    await self.api.refuse(ex, e.status, e.text)
                else:
                    await ex.reply(e.status, f"{e.text}\n".encode(), close=True)
                await ex.linger()  # (the rest of the body is read and dropped: our answer is not reset away)
                return False
        if raw_path in OPS_PATHS and req.method in ("GET", "HEAD"):
            # at the server's own root only: a proxy that forwards /chat/
            # never exposes these under it
            await self._ops(ex, req)
            return True
        root = self.config.root_path
        if root and raw_path == root and req.method in ("GET", "HEAD"):
            # relative URLs in the page need the slash
            query = urlsplit(req.target).query
            await ex.reply(301, headers={"Location": f"{root}/" + (f"?{query}" if query else "")})
            return True
        trusted_peer = bool(self.config.forwarded_allow_ips) and self._trusted(peer_ip)
        req = local
        if forwarded_for is not None:
            remote = f"{forwarded_for} (via {remote})"
        if req.path == "/ws" and upgrade:
            await self._upgrade(ex, req, remote, trusted_peer)
            return False
        if api:
            return await self.api.handle(ex, req, body, remote, trusted_peer)
        if req.method in ("GET", "HEAD"):
            await self._static(ex, req)
            return True
        await ex.reply(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"}, close=True)
        return False

    async def _upgrade(self, ex: Exchange, req: Request, remote: str, trusted_peer: bool) -> None:
        versions = [v for v in offered_subprotocols(req) if v.startswith(PROTOCOL_FAMILY)]
        if versions and PROTOCOL not in versions:  # (none offered: a script's client, taken as v1)
            await ex.reply(400, f"unsupported protocol version {', '.join(versions)[:80]}: this server speaks "
                                f"{PROTOCOL}\n".encode(), close=True)
            return
        who = self.check_handshake(req, trusted_peer)
        if isinstance(who, str):
            log.warning("refused a WebSocket handshake: %s", who, extra={"remote": remote})
            await ex.reply(403, f"{who}\n".encode(), close=True)
            return
        bad = ex.upgrade_problem()
        if bad is not None:
            status, text = bad
            await ex.reply(status, f"{text}\n".encode(), close=True,
                           headers={"Sec-WebSocket-Version": "13"} if status == 426 else None)
            return
        if not self.quotas.may_connect(who.user):  # checks and counts at once: no race to pass it
            await ex.reply(429, b"too many connections for this user\n", close=True)
            return
        try:
            log.info("WebSocket handshake accepted%s", f" for {who.user!r}" if who.user else "",
                     extra={"remote": remote})
            await self._websocket(ex, remote, who)
        finally:
            self.quotas.disconnected(who.user)

    async def _ops(self, ex: Exchange, req: Request) -> None:
        """Probes and metrics: no Host check and no token (a Kubernetes probe or
        a Prometheus scrape addresses the pod, not a name), nothing in them but
        counts and states (server/edge/metrics.py)."""
        path = urlsplit(req.target).path
        if path == "/metrics" and req.headers.get("host", "").lower() not in self.allowed_hosts():
            # activity counts are not for any web page (DNS rebinding): a
            # scraper's address is added with --allowed-host
            await ex.reply(403, b"Host not allowed\n")
            return
        if path == "/healthz":
            await ex.reply(200, b"ok\n")
        elif path == "/readyz":
            why = readiness(self)
            if why is None:
                await ex.reply(200, b"ready\n")
            else:
                await ex.reply(503, f"not ready: {why}\n".encode())
        else:
            await ex.reply(200, self.metrics.render(), METRICS_TYPE)

    async def _static(self, ex: Exchange, req: Request) -> None:
        if req.headers.get("host", "").lower() not in self.allowed_hosts():
            await ex.reply(403, b"Host not allowed\n")
            return
        if req.path == "/favicon.ico":
            await ex.reply(204)
            return
        name = "index.html" if req.path in ("/", "/index.html") else req.path.removeprefix("/static/")
        if name != "index.html" and (not req.path.startswith("/static/") or not STATIC_NAME.fullmatch(name)):
            await ex.reply(404, b"not found\n")
            return
        asset = await self.assets.get(name)
        if asset is None:
            await ex.reply(404, b"not found\n")
            return
        status, body, headers = representation(asset, req.headers.get("accept-encoding", ""),
                                               req.headers.get("if-none-match", ""))
        await ex.reply(status, body, asset.content_type, headers={
            **headers,
            "Content-Security-Policy": "default-src 'self'; connect-src 'self'; style-src 'self' 'unsafe-inline'",
            "X-Frame-Options": "DENY"})

    async def _websocket(self, ex: Exchange, remote: str, principal: Principal) -> None:
        async with trio.open_nursery() as nursery:
            # a frame over 4x the user's limit closes the connection (1009) unread
            limit = min(p.WS_HARD_LIMIT, 4 * self.quotas.limits.frame_bytes)
            request = await ex.upgrade(nursery, max_message_size=limit)
            # the page offers sessionlog.v1 beside its token's subprotocol
            # (edge/auth.py): select the first, never echo the token
            ws = await request.accept(subprotocol=PROTOCOL if PROTOCOL in request.proposed_subprotocols else None)
            conn = Connection(self, ws, nursery, principal)
            conn.remote = remote
            self.connections.add(conn)
            cred = principal.credential
            if cred is not None and not self.auth.still_valid(cred):  # revoked while we shook hands
                conn.end(1008, "credentials revoked")
            try:
                await conn.run()
            finally:
                self.connections.discard(conn)
                conn.close_subscriptions()
                nursery.cancel_scope.cancel()

    def shared_frame(self, update: MsgUpdate) -> str:
        """The encoded frame of an update published to many subscribers: the
        hub hands the same object to each in turn, so it is encoded once."""
        if self._shared[0] is not update:
            self._shared = (update, p.encode_frame("msg_update", p.to_wire(update)))
        return self._shared[1]

    # -- broadcasts ------------------------------------------------------------

    def broadcast(self, frame: str, owner: str) -> None:
        """A push about something of `owner`'s: to its connections only (an
        admin reads others' sessions by asking, and each ask is logged)."""
        for conn in list(self.connections):
            if conn.principal.user == owner:
                conn.send_nowait(frame)

    def _on_store_change(self, kind: str, data: dict[str, Any], owner: str) -> None:
        if kind in ("session_updated", "session_deleted", "session_created"):
            self.broadcast(p.encode_frame(kind, data), owner)
        elif kind in ("message_created", "head_moved"):
            sid = data["session_id"]
            watching = [c for c in self.connections if sid in c.watching]
            if not watching:
                return
            if kind == "message_created":
                message = p.to_wire(data["message"])
                if message["caller"] is None:
                    message["siblings"] = data["siblings"]
                frame = p.encode_frame("message_created", {"session_id": sid, "message": message})
            else:
                frame = p.encode_frame("head_moved", data)
            for conn in watching:
                conn.send_nowait(frame)

    def push_projects(self, owner: str) -> None:
        """Each connection of `owner` gets its projects list."""
        for conn in list(self.connections):
            if conn.principal.user == owner:
                conn.send_nowait(conn.projects_frame())

    # -- agents ----------------------------------------------------------------

    async def start_reply(self, session_id: str, parent_id: str | None, user: str = "",
                          reserved: bool = False, reply_id: str | None = None) -> str:
        """Run the agent's reply as an in-flight message; returns its id once
        its placeholder is durable. Counts against `user`'s running replies
        (`reserved`: the caller reserved its place already; `reply_id`: and
        the reply's id and lease, `reserve_reply`)."""
        assert self._agents is not None
        if not reserved:
            self.quotas.start_reply(user)
        return await self._agents.start(self._run_agent, session_id, parent_id, user, reply_id)

    async def _run_agent(self, session_id: str, parent_id: str | None, user: str, reply_id: str | None = None,
                         task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        try:
            async with self.store.inflight(session_id, kind="llm_reply", parent_id=parent_id, msg_id=reply_id,
                                           leased=reply_id is not None) as reply:
                task_status.started(reply.msg_id)
                started = True
                state = await self.store.load_session(session_id)
                # (the branch with its tool calls: an agent gives them back to its model)
                history = [m for m in state.branch() if m.msg_id != reply.msg_id and m.caller != reply.msg_id]
                agent_id = state.meta.agent_id if state.meta is not None else "default"
                await self.agents.get(agent_id, self.agent).respond(self.store, session_id, history, reply)
        except (NotFound, EventStoreError) as e:  # deleted meanwhile, or the store failed
            if not started:
                raise  # the requester gets the real error (read_only, store_broken...)
            log.warning("reply in %s ended: %s", session_id, e)
        except Exception:
            if not started:
                raise  # (the placeholder was never written: the requester gets the error)
            log.exception("the agent failed in session %s", session_id)
        finally:
            self.quotas.end_reply(user)

    async def open_external_reply(self, session_id: str, user: str, *, kind: str, parent_id: str | None,
                                  caller: str | None, role: str | None = None,
                                  metadata: dict[str, Any] | None = None) -> ExternalReply:
        """A reply an external producer streams into (edge/producers.py)."""
        assert self._agents is not None
        return await self.producers.open(self._agents, session_id, user, kind=kind, parent_id=parent_id,
                                         caller=caller, role=role, metadata=metadata)

    async def prepare_stop(self, timeout: float = 2.0) -> None:
        """The first part of a graceful stop, while connections are still
        open: no new reply starts, every running one is finalized `aborted`
        "server shutdown", every request read before the stop gets its answer
        and every subscription its terminal update, and then each connection
        is closed with a close handshake (1001). A request read after the stop
        began is answered `shutting_down` and not carried out (connection.py).
        The requests in flight, the terminal updates and the queues get up to
        `timeout` in all; the close handshakes up to `timeout` more."""
        store = self.store
        store.shutting_down = True
        self.stopping.set()  # a live read (long-poll, SSE) answers what it has and ends
        if self.namespace is not None:
            self.namespace.space.wake_all()
        self.log_taps.wake_all()
        await store.abort_running("server shutdown")
        deadline = trio.current_time() + timeout
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as n:
                for c in list(self.connections):
                    n.start_soon(c.wait_until, Connection.idle)
        # A reply that a request in flight started ends now (it saw the stop
        # as it went live: `inflight`), its finalize written before the close.
        await store.abort_running("server shutdown")
        # The finalizes' own terminal updates (a reply that just ended `done`
        # included) go out first: they are published once durable.
        with trio.move_on_at(deadline):
            while store.publishing:
                await trio.sleep(0.005)
        store.hub.end(None, "server shutdown")
        with trio.move_on_at(deadline):  # (their answers' ends: a reader resumes from its offset)
            while self.live_reads:
                await trio.sleep(0.005)
        async with trio.open_nursery() as n:
            for c in list(self.connections):
                n.start_soon(self._close, c, deadline, timeout)

    @staticmethod
    async def _close(conn: Connection, deadline: float, timeout: float) -> None:
        """A close handshake (1001 "going away") once `conn` has sent what it
        had queued, or at `deadline`: a client reads everything sent before
        it, which an abrupt close of the socket does not promise."""
        with trio.move_on_at(deadline):
            await conn.wait_until(Connection.drained)
        # No checkpoint from the check to the close frame (conn.close): no
        # answer is queued in between, to be refused by the closing socket.
        with trio.move_on_after(timeout):
            await conn.close(1001, "server shutdown")

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._agents = nursery
            listeners = await nursery.start(partial(trio.serve_tcp, host=self.config.host),
                                            self.handle_stream, self.config.port)
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started(self.port)


def _public_netloc(url: str) -> str:
    """The Host a browser sends for `url`: lower case, without a default port."""
    u = urlsplit(url)
    host = (u.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}.get(u.scheme)
    return host if u.port in (None, default) else f"{host}:{u.port}"


_PEER_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionClosed)


def _peer(stream: trio.abc.Stream) -> str:
    """host:port of the other end of a TCP stream ("?" if it has none)."""
    sock = getattr(stream, "socket", None)
    try:
        host, port = sock.getpeername()[:2] if sock is not None else ("?", "")
    except OSError:
        return "?"
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
