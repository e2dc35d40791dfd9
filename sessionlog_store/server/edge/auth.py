"""Who a WebSocket client is. One `Authenticator` per server, chosen by
`--auth`, turns an upgrade request (its Host and Origin already checked)
into a `Principal`, or refuses it before any data is sent:

- `token` (the default): the single access token; one principal, the
  single user (owner "").
- `tokens-file`: a JSON object `{"<token>": "<user id>", ...}`; re-read on
  SIGHUP (a bad file keeps the old table and is logged).
- `proxy-header`: the user id in a header an auth proxy sets
  (`X-Forwarded-User`), believed only from `--forwarded-allow-ips`.
- `jwt`: a signed JWT, verified by
  PyJWT with an HS256 secret or a JWKS file; `exp` is required, `aud` and
  `iss` are checked when configured, the clock skew allowed is bounded.

A token (of `token`, `tokens-file` and `jwt`) is taken from the first of
these a request has, never falling back to a later one: `Authorization:
Bearer <token>` (scripts, clients that can set headers), the WebSocket
subprotocol `sessionlog.token.<the token in unpadded base64url>` offered
beside `sessionlog.v1` (the page: a browser cannot set headers on a
WebSocket, and a URL lands in every proxy's access log), `?token=` (kept
for scripts). The token's subprotocol is never echoed: the server selects
`sessionlog.v1`.

Every refusal is the same 403 with the same text, whatever was wrong (no
user, a wrong token, a bad signature), and a token is looked up by its
SHA-256 digest, so a wrong token and a wrong user take the same path.
A user id from any of them (and `--admin`) goes through `user_id()`: NFC,
case kept, no surrounding whitespace, no control or format characters.
docs/SECURITY.md has the threat model.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import msgspec

from sessionlog_store.server.edge.http import Request

log = logging.getLogger("sessionlog.auth")

# The one text of every refused handshake.
REFUSED: Final = "missing or wrong credentials"
# The longest user id (characters, after NFC): what owners are recorded as in the logs.
MAX_USER_ID: Final = 200
# Characters no user id holds (Unicode general categories): controls (Cc: tabs,
# newlines, DEL, C1), format characters (Cf: zero-width spaces and joiners,
# bidi overrides: "alice\u200b" would look like alice), lone surrogates (Cs),
# line and paragraph separators (Zl, Zp).
_NOT_IN_USER_IDS: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# The most clock skew a JWT's exp/nbf/iat may be given (seconds); RFC 7519
# leaves it to the verifier: "a few minutes" is the usual advice.
MAX_LEEWAY: Final = 300.0
AUTH_MODES: Final = ("token", "tokens-file", "proxy-header", "jwt")
# Whose the generic streams of requests without credentials are (the loopback
# anonymous mode, --streams-anonymous): no user id has a leading space.
ANONYMOUS: Final = " anonymous"


class Credential(msgspec.Struct, frozen=True, kw_only=True):
    """What a handshake proved: the user, until when (a JWT's exp plus the
    leeway; None: until revoked), and the digest of the secret it showed
    (to tell, after a reload, whether it still proves that user)."""
    user: str
    expires: float | None = None
    digest: bytes = b""


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """The user a connection acts for. `user` "" is the single-user principal
    (what sessions without an owner belong to). An admin may list and read
    every user's sessions (each such read is logged); writes stay its own."""
    user: str = ""
    admin: bool = False
    credential: Credential | None = None

    @property
    def reads(self) -> str | None:
        """The owner filter for reads: None (everyone's) for an admin."""
        return None if self.admin else self.user


class Authenticator(Protocol):
    def authenticate(self, req: Request, trusted_peer: bool) -> Credential | None:
        """What this request proves, or None (refused)."""

    def still_valid(self, cred: Credential) -> bool:
        """Whether an open connection's credential still holds (after a reload)."""

    def reload(self) -> None:
        """Re-read what it reads from files (SIGHUP)."""


def user_id(raw: str) -> str | None:
    """The user `raw` names, in NFC (one spelling of "é": a precomposed and a
    combining one are one user), or None when it names none: empty, longer
    than MAX_USER_ID, with whitespace around it, or a control or format
    character in it. Case is kept: "Alice" and "alice" are two users (as
    JWT `sub`s are compared, RFC 7519 section 2)."""
    if not raw or raw != raw.strip():
        return None
    user = unicodedata.normalize("NFC", raw)
    if len(user) > MAX_USER_ID or any(unicodedata.category(c) in _NOT_IN_USER_IDS for c in user):
        return None
    return user


def anonymous_principal(req: Request, remote: str, enabled: bool) -> Principal | None:
    """The anonymous principal, for a request of the generic namespace that
    shows no credentials at all, sent straight from this machine (a loopback
    peer, no proxy's forwarding header), when the mode is on; else None."""
    if not enabled or presented_token(req) or "authorization" in req.headers:
        return None
    if " (via " in remote or "x-forwarded-for" in req.headers or "forwarded" in req.headers:
        return None
    try:
        peer = ipaddress.ip_address(remote.rsplit(":", 1)[0].strip("[]"))
    except ValueError:
        return None
    return Principal(user=ANONYMOUS) if peer.is_loopback else None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


TOKEN_SUBPROTOCOL: Final = "sessionlog.token."
PROTOCOL: Final = "sessionlog.v1"  # the subprotocol the server selects when offered
PROTOCOL_FAMILY: Final = "sessionlog.v"  # a client offering only others of it is refused (400)


def offered_subprotocols(req: Request) -> list[str]:
    return [p.strip() for p in req.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def presented_token(req: Request) -> str:
    """The token a request shows: its bearer header, else its token
    subprotocol, else its `?token=` ("" when none, or one that does not
    decode: refused like a wrong one)."""
    bearer = req.headers.get("authorization", "")
    if bearer[:7].lower() == "bearer ":
        return bearer[7:].strip()
    for proto in offered_subprotocols(req):
        if proto.startswith(TOKEN_SUBPROTOCOL):
            raw = proto[len(TOKEN_SUBPROTOCOL):]
            try:
                return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                return ""
    return (req.query.get("token") or [""])[0]


class SingleToken:
    """The default: one token, one principal (the single user)."""

    def __init__(self, token: str) -> None:
        self._digest = _digest(token)

    def authenticate(self, req: Request, trusted_peer: bool) -> Credential | None:
        return Credential(user="") if hmac.compare_digest(_digest(presented_token(req)), self._digest) else None

    def still_valid(self, cred: Credential) -> bool:
        return True

    def reload(self) -> None:
        pass


_TOKENS_FILE = msgspec.json.Decoder(dict[str, str])


class TokensFile:
    """A table of tokens, each naming its user, from a JSON file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._table: dict[bytes, str] = {}
        self._table = self._read()  # a bad file at startup is a startup error

    def _read(self) -> dict[bytes, str]:
        try:
            with open(self.path, "rb") as f:
                raw = _TOKENS_FILE.decode(f.read())
        except OSError as e:
            raise ValueError(f"--tokens-file {self.path}: {e.strerror}") from None
        except msgspec.DecodeError as e:
            raise ValueError(f"--tokens-file {self.path}: not a JSON object of token -> user id: {e}") from None
        table = {}
        for token, user in raw.items():
            if len(token) < 16:
                raise ValueError(f"--tokens-file {self.path}: a token of user {user!r} is shorter than 16 characters")
            uid = user_id(user)
            if uid is None:
                raise ValueError(f"--tokens-file {self.path}: bad user id {user!r} (docs/SECURITY.md: user ids)")
            table[_digest(token)] = uid
        return table

    def authenticate(self, req: Request, trusted_peer: bool) -> Credential | None:
        # A dict lookup by digest: what a timing difference could tell is
        # about the digest of the guess, never about a stored token.
        digest = _digest(presented_token(req))
        user = self._table.get(digest)
        return None if user is None else Credential(user=user, digest=digest)

    def still_valid(self, cred: Credential) -> bool:
        """A token removed from the file (or given to another user) ends its connections at the reload."""
        return self._table.get(cred.digest) == cred.user

    def reload(self) -> None:
        try:
            self._table = self._read()
        except ValueError as e:
            log.error("tokens file not reloaded, the old table stays: %s", e)
            return
        log.info("tokens file reloaded: %d tokens", len(self._table))


class ProxyHeader:
    """The user id an authenticating proxy put in a header."""

    def __init__(self, header: str) -> None:
        self.header = header.lower()

    def authenticate(self, req: Request, trusted_peer: bool) -> Credential | None:
        if not trusted_peer:
            return None  # anyone can send the header; only our proxy's counts
        # (an HTTP header's value comes without the whitespace around it, RFC 9110 5.5)
        user = user_id(req.headers.get(self.header, "").strip())
        return Credential(user=user) if user is not None and "," not in user else None  # ",": it came twice

    def still_valid(self, cred: Credential) -> bool:
        return True

    def reload(self) -> None:
        pass


@dataclass
class JwtConfig:
    secret: str | None = None       # HS256
    jwks_file: str | None = None    # public keys (RS256, ES256, PS256, EdDSA)
    audience: str | None = None
    issuer: str | None = None
    leeway: float = 30.0
    user_claim: str = "sub"


class Jwt:
    """Signed JWTs (PyJWT). The algorithm is the key's, never the token's
    choice (no `alg: none`, no HS256 with a public key)."""

    def __init__(self, cfg: JwtConfig) -> None:
        try:
            import jwt
        except ImportError:
            raise ValueError("--auth jwt needs PyJWT: pip install 'sessionlog-store[jwt]'") from None
        self.jwt = jwt
        if (cfg.secret is None) == (cfg.jwks_file is None):
            raise ValueError("--auth jwt needs exactly one of --jwt-secret and --jwt-jwks")
        if cfg.secret is not None and len(cfg.secret) < 32:
            raise ValueError("--jwt-secret must be at least 32 characters (RFC 7518 3.2: a key of 256 bits)")
        if not 0 <= cfg.leeway <= MAX_LEEWAY:
            raise ValueError(f"--jwt-leeway must be between 0 and {MAX_LEEWAY:g} seconds")
        self.cfg = cfg
        self._keys: dict[str | None, Any] = {}
        self._kids: set[str] = set()
        self.reload_or_raise()

    def reload_or_raise(self) -> None:
        if self.cfg.jwks_file is None:
            return
        try:
            with open(self.cfg.jwks_file, encoding="utf-8") as f:
                keyset = self.jwt.PyJWKSet.from_json(f.read())
        except OSError as e:
            raise ValueError(f"--jwt-jwks {self.cfg.jwks_file}: {e.strerror}") from None
        except (self.jwt.PyJWKSetError, self.jwt.InvalidKeyError, ValueError) as e:
            raise ValueError(f"--jwt-jwks {self.cfg.jwks_file}: {e}") from None
        self._keys = {k.key_id: k for k in keyset.keys}
        self._kids = {str(k) for k in self._keys}

    def reload(self) -> None:
        try:
            self.reload_or_raise()
        except ValueError as e:
            log.error("JWKS not reloaded, the old keys stay: %s", e)

    def still_valid(self, cred: Credential) -> bool:
        """Until it expires (the connection ends itself then), or its key is
        taken out of the JWKS file (checked at the reload)."""
        return self.cfg.jwks_file is None or cred.digest.decode("utf-8", "replace") in self._kids

    def authenticate(self, req: Request, trusted_peer: bool) -> Credential | None:
        jwt, cfg = self.jwt, self.cfg
        token = presented_token(req)
        try:
            if cfg.secret is not None:
                key: Any = cfg.secret
                algorithms = ["HS256"]
            else:
                kid = jwt.get_unverified_header(token).get("kid")
                found = self._keys.get(kid) or (next(iter(self._keys.values())) if len(self._keys) == 1 else None)
                if found is None:
                    return None
                key, algorithms = found.key, [found.algorithm_name]
                kid = found.key_id
            claims = jwt.decode(token, key, algorithms=algorithms, audience=cfg.audience, issuer=cfg.issuer,
                                leeway=cfg.leeway, options={"require": ["exp", cfg.user_claim]})
            # (a token that names an audience is refused when none is configured: PyJWT's default)
        except (jwt.PyJWTError, ValueError, TypeError, KeyError):
            return None
        sub, exp = claims.get(cfg.user_claim), claims.get("exp")
        user = user_id(sub) if isinstance(sub, str) else None
        if user is None or not isinstance(exp, int | float):
            return None
        kid_text = "" if cfg.secret is not None else str(kid)
        return Credential(user=user, expires=float(exp) + cfg.leeway, digest=kid_text.encode())


@dataclass
class AuthConfig:
    mode: str = "token"
    tokens_file: str | None = None
    user_header: str = "X-Forwarded-User"
    jwt: JwtConfig | None = None
    admins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        admins = []
        for name in self.admins:  # spelled as the users they name are (NFC)
            uid = user_id(name)
            if uid is None:
                raise ValueError(f"--admin {name!r} is not a user id (docs/SECURITY.md: user ids)")
            admins.append(uid)
        self.admins = tuple(admins)


def make_authenticator(cfg: AuthConfig, token: str, forwarded_allow_ips: tuple[str, ...] = ()) -> Authenticator:
    """The authenticator `cfg` names (ValueError: a configuration problem, for the operator)."""
    if cfg.mode == "proxy-header" and ("*" in forwarded_allow_ips or not forwarded_allow_ips):
        raise ValueError("--auth proxy-header needs --forwarded-allow-ips naming the proxy (not *: anyone "
                         "could then claim to be any user)")
    makers: dict[str, Callable[[], Authenticator]] = {
        "token": lambda: SingleToken(token),
        "tokens-file": lambda: TokensFile(_needed(cfg.tokens_file, "--auth tokens-file needs --tokens-file")),
        "proxy-header": lambda: ProxyHeader(cfg.user_header),
        "jwt": lambda: Jwt(cfg.jwt or JwtConfig()),
    }
    if cfg.mode not in makers:
        raise ValueError(f"--auth must be one of {', '.join(AUTH_MODES)}")
    return makers[cfg.mode]()


def _needed(value: str | None, why: str) -> str:
    if not value:
        raise ValueError(why)
    return value
