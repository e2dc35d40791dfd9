"""What a server is told: its address, its one token or its authenticator,
who may reach it (hosts, origins, proxies), its path prefix, keepalive,
per-user limits (`sessionlog serve`'s flags, README: Configuration)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from sessionlog_store.server.edge.auth import AuthConfig
from sessionlog_store.server.edge.limits import Limits

# A client that has not taken one frame in this long is dropped.
SEND_TIMEOUT: Final = 5.0


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    allowed_origins: tuple[str, ...] = ()
    send_timeout: float = SEND_TIMEOUT
    # Beyond loopback (README: Deploying it). Extra Host values the page and
    # /ws answer ("name" or "name:port"):
    allowed_hosts: tuple[str, ...] = ()
    # The URL users open (e.g. https://chat.example.com/chat): its host is
    # allowed, its origin too, and its path is the root path unless one is given.
    public_url: str | None = None
    # Peers (IPs, or "*") whose X-Forwarded-For/-Proto/-Host are believed.
    forwarded_allow_ips: tuple[str, ...] = ()
    # A path prefix the server is reached under ("/chat"); requests with or
    # without it are served (a proxy may or may not strip it).
    root_path: str = ""
    # WebSocket keepalive: a ping this often; no pong within the timeout drops
    # the connection (a dead peer behind a NAT or proxy). 0: off.
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    # Who clients are (edge/auth.py; the default: the one token above) and
    # what one of them may do (edge/limits.py; None: none for the single
    # user, MULTI_USER for the other modes).
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: Limits | None = None
    # An external producer (edge/producers.py) silent this long loses its
    # reply: it ends aborted, "producer lost".
    producer_timeout: float = 30.0
    # The generic streams (/v1/stream/<name>) of requests without credentials,
    # from this machine only: an anonymous owner's (--streams-anonymous; for
    # the Durable Streams conformance suite and local tools, never sessions).
    streams_anonymous: bool = False

    def __post_init__(self) -> None:
        if self.public_url is not None:
            u = urlsplit(self.public_url)
            if u.scheme not in ("http", "https") or not u.netloc:
                raise ValueError(f"--public-url {self.public_url!r} is not an http(s) URL")
            if not self.root_path:
                self.root_path = u.path.rstrip("/")
        self.root_path = self.root_path.rstrip("/")
        if self.root_path and not self.root_path.startswith("/"):
            raise ValueError(f"--root-path {self.root_path!r} must start with /")
