"""Many users on one server (docs/SECURITY.md), over real sockets: who a
connection is, what it may see and change, and what it is told. Another
user's id must answer exactly as an id that does not exist; no frame a user
receives may hold a byte of someone else's sessions."""
from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import HandshakeError, open_websocket

from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.projections.recovery import load_session_state
from sessionlog_store.server.agents.demo import DemoAgent
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.edge.auth import REFUSED, AuthConfig, JwtConfig, make_authenticator
from sessionlog_store.server.edge.client import Client, ServerError, open_client
from sessionlog_store.server.edge.limits import Limits
from sessionlog_store.server.edge.ws import Server, ServerConfig
from sessionlog_store.server.run import serve_store

from .conftest import read_logs

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab", "carol": "carol-token-0123456789"}
FAKE = "Zq9ZZZZZZZZZZZZZZZZZZZ"  # an id that never existed, of an id's shape


def tokens_file(folder: Path) -> str:
    path = folder / "tokens.json"
    path.write_text(json.dumps({t: u for u, t in TOKENS.items()}))
    return str(path)


async def start(nursery: trio.Nursery, root: str, *, auth: AuthConfig, limits: Limits | None = None,
                speed: float = 400.0, trust: tuple[str, ...] = (), **store: object) -> Server:
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()
    config = ServerConfig(port=0, token="single-user-token", auth=auth, limits=limits or Limits(),
                          forwarded_allow_ips=trust)
    nursery.start_soon(lambda: serve_store(root, config, agent=DemoAgent(speed=speed), on_ready=on_ready,
                                           store_config=StoreConfig(progress_interval=0.05,
                                                                    many_users=auth.mode != "token", **store)))
    await ready.wait()
    return holder["s"]


async def start_users(nursery: trio.Nursery, root: str, tmp_path: Path, **kw: object) -> Server:
    return await start(nursery, root, auth=AuthConfig(mode="tokens-file", tokens_file=tokens_file(tmp_path),
                                                      admins=("carol",)), **kw)  # type: ignore[arg-type]


def user(server: Server, name: str, **kw: object):  # type: ignore[no-untyped-def]
    return open_client("127.0.0.1", server.port, TOKENS[name], **kw)  # type: ignore[arg-type]


async def error_of(c: Client, action: str, **fields: object) -> dict[str, object]:
    with pytest.raises(ServerError) as e:
        await c.request(action, **fields)
    return e.value.data


def same_refusal(a: dict[str, object], b: dict[str, object], real: dict[str, str]) -> bool:
    """Two error replies are one answer, once the ids each named are swapped."""
    def shown(d: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in d.items() if k != "request_id"}
    text = json.dumps(shown(b))
    for value in real.values():
        text = text.replace(value, FAKE)
    return json.dumps(shown(a)) == text


# -- the matrix: principals x actions x someone else's ids ---------------------

WRITES = {
    "switch_branch": lambda s, m, p: {"session_id": s, "msg_id": m},
    "stop": lambda s, m, p: {"session_id": s, "msg_id": m},
    "retry": lambda s, m, p: {"session_id": s, "msg_id": m},
    "rename_session": lambda s, m, p: {"session_id": s, "title": "pwned"},
    "set_archived": lambda s, m, p: {"session_id": s, "archived": True},
    "set_pinned": lambda s, m, p: {"session_id": s, "pinned": True},
    "set_unread": lambda s, m, p: {"session_id": s, "unread": True},
    "delete_session": lambda s, m, p: {"session_id": s},
    "set_session_project": lambda s, m, p: {"session_id": s, "project_id": "default"},
    "relocate_project": lambda s, m, p: {"session_id": s, "project_id": p, "path": "/tmp"},
    "chat": lambda s, m, p: {"session_id": s, "content": "hi"},
}
READS = {
    "load_session": lambda s, m, p: {"session_id": s},
    "subscribe_msg": lambda s, m, p: {"session_id": s, "msg_id": m, "offset": 0},
}
PROJECT_USES = {  # someone else's project named from one's own session, or a new one
    "chat": lambda own, p: {"content": "hi", "project_id": p},
    "create_session": lambda own, p: {"project_id": p},
    "set_session_project": lambda own, p: {"session_id": own, "project_id": p},
}


async def test_someone_elses_ids_answer_exactly_as_unknown_ones(root, nursery, tmp_path, caplog):
    server = await start_users(nursery, root, tmp_path, speed=5.0)  # alice's reply is still running throughout
    folder = tmp_path / "alices-project"
    folder.mkdir()
    async with user(server, "alice") as alice:
        project = (await alice.request("create_project", name="alice-proj", path=str(folder)))["project"]["id"]
        ack = await alice.request("chat", content="my private medical question", project_id=project)
        sid, reply = ack["session_id"], ack["reply_id"]
        before = read_logs(root)[sid]
        real = {"s": sid, "m": reply, "p": project}
        fake = {"s": FAKE, "m": FAKE, "p": FAKE}
        caplog.set_level(logging.WARNING, logger="sessionlog.audit")
        for name in ("bob", "carol"):
            async with user(server, name) as other:
                own = (await other.request("create_session"))["session"]["id"]
                cells = [(a, f, name == "bob") for a, f in READS.items()] + [(a, f, True) for a, f in WRITES.items()]
                for action, fields, refused in cells:
                    if not refused:  # carol is an admin: she may read, and it is logged
                        await other.request(action, **fields(sid, reply, project))
                        assert any(sid in r.getMessage() and action in r.getMessage() for r in caplog.records)
                        continue
                    got = await error_of(other, action, **fields(sid, reply, project))
                    unknown = await error_of(other, action, **fields(**fake))
                    assert same_refusal(unknown, got, real), (name, action, got, unknown)
                for action, fields in PROJECT_USES.items():
                    got = await error_of(other, action, **fields(own, project))
                    unknown = await error_of(other, action, **fields(own, FAKE))
                    assert same_refusal(unknown, got, real), (name, action, got, unknown)
                    assert got["code"] == "unknown_project"
                assert [p["id"] for p in (await other.request("list_projects"))["projects"]] == \
                    (["default", project] if name == "carol" else ["default"])
        assert alice.status.get((sid, reply)) is None  # never subscribed: nobody stopped it for her
        await server.store.es.flush()  # (the log writer lingers: a reader of the file asks for its lines first)
        state, _ = load_session_state(OS_FILES, root, sid, use_snapshot=False)
        assert state.meta is not None and state.meta.title != "pwned" and not state.meta.archived
        assert read_logs(root)[sid].startswith(before), "nothing was written into alice's log by others"
        assert state.messages[reply].status in ("running", "done"), "no one else stopped it"


async def test_the_owner_is_in_the_log_and_old_logs_belong_to_the_single_user(root, tmp_path):
    async with trio.open_nursery() as n:
        server = await start_users(n, root, tmp_path)
        async with user(server, "alice") as alice:
            sid = (await alice.request("create_session", title="mine"))["session"]["id"]
        n.cancel_scope.cancel()
    first = json.loads(read_logs(root)[sid].split(b"\n")[0])
    assert first["type"] == "session_created" and first["owner"] == "alice"
    # The same store as a single-user server: alice's session is not the single user's...
    async with trio.open_nursery() as n:
        single = await start(n, root + "-single", auth=AuthConfig())
        async with open_client("127.0.0.1", single.port, "single-user-token") as c:
            legacy = (await c.request("create_session", title="before users"))["session"]["id"]
        n.cancel_scope.cancel()
    assert "owner" not in json.loads(read_logs(root + "-single")[legacy].split(b"\n")[0]), \
        "the single user's records carry no owner: a log from before owners reads the same"
    async with trio.open_nursery() as n:
        server = await start_users(n, root + "-single", tmp_path)
        async with user(server, "alice") as alice:
            assert (await alice.request("list_sessions"))["rows"] == []
            assert (await error_of(alice, "load_session", session_id=legacy))["code"] == "unknown_session"
        async with user(server, "carol") as carol:  # the admin sees it, owner ""
            assert [r["id"] for r in (await carol.request("list_sessions"))["rows"]] == [legacy]
            assert [r["id"] for r in (await carol.request("list_sessions", filters={"owner": ""}))["rows"]] == [legacy]
            assert (await carol.request("list_sessions", filters={"owner": "alice"}))["rows"] == []
        n.cancel_scope.cancel()


async def test_an_admins_read_of_another_users_session_follows_nothing_unlogged(root, nursery, tmp_path, caplog):
    """An admin's `load_session` of someone else's session is one read: no
    `message_created` or `head_moved` of it follows. A `subscribe_msg` is a
    follow of one message, logged when it starts and when it ends."""
    server = await start_users(nursery, root, tmp_path)
    caplog.set_level(logging.WARNING, logger="sessionlog.audit")

    def audited(word: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "sessionlog.audit" and word in r.getMessage()]
    async with user(server, "alice") as alice, user(server, "carol", record=True) as carol:
        first = await alice.request("chat", content="ALICE-FIRST")
        sid = first["session_id"]
        await alice.follow(sid)
        loaded = await carol.request("load_session", session_id=sid)
        assert loaded["session"]["id"] == sid and len(audited(sid)) == 1
        with trio.fail_after(30):  # (a second turn waits for the first reply's end)
            await alice.wait_done(sid, first["reply_id"])
        second = await alice.request("chat", session_id=sid, content="ALICE-SECOND")
        await alice.request("subscribe_msg", session_id=sid, msg_id=second["reply_id"], offset=0)
        with trio.fail_after(30):
            await alice.wait_done(sid, second["reply_id"])
        retried = await alice.request("retry", session_id=sid, msg_id=second["reply_id"])
        with trio.fail_after(30):
            await alice.wait_for(lambda f: f["type"] == "head_moved")
        await carol.request("create_session")  # her own: not logged; any push of alice's came before its answer
        assert carol.frames is not None
        assert not [f for f in carol.frames if "ALICE-SECOND" in f or '"message_created"' in f
                    or '"head_moved"' in f], "an admin's load watches nothing"
        assert len(audited(sid)) == 1, "one read, one line"
        # a follow of one message: its start and its end are logged
        reply = retried["reply_id"]
        await carol.request("subscribe_msg", session_id=sid, msg_id=reply, offset=0)
        with trio.fail_after(30):
            assert await carol.wait_done(sid, reply) == "done"
        lines = audited(f"message {reply}")
        assert len(lines) == 2 and lines[0].endswith("of user 'alice'") and lines[1].endswith("ended"), lines
        await carol.request("subscribe_msg", session_id=sid, msg_id=second["reply_id"], offset=0)  # ended already
        assert [line.endswith("ended") for line in audited(f"message {second['reply_id']}")] == [False, True]
    # the admin's own sessions are watched as anyone's
    async with user(server, "carol", record=True) as carol:
        ack = await carol.request("chat", content="carol's own")
        mine = ack["session_id"]
        await carol.follow(mine)
        with trio.fail_after(30):  # (a second turn waits for the first reply's end)
            await carol.wait_done(mine, ack["reply_id"])
        await carol.request("chat", session_id=mine, content="again")
        await carol.request("create_session")
        assert carol.frames is not None and any('"message_created"' in f for f in carol.frames)


async def test_an_admins_rows_say_whose_each_session_is_and_a_users_do_not(root, nursery, tmp_path):
    server = await start_users(nursery, root, tmp_path, speed=5.0)  # alice's reply runs throughout
    async with user(server, "alice") as alice, user(server, "bob") as bob, user(server, "carol") as carol:
        rev = (await carol.request("list_sessions"))["rev"]
        a = (await alice.request("chat", content="alice asks"))["session_id"]
        b = (await bob.request("create_session", title="bob's"))["session"]["id"]
        own = await carol.request("create_session", title="carol's")
        assert own["session"]["owner"] == "carol"
        rows = (await carol.request("list_sessions"))["rows"]
        assert {r["id"]: r["owner"] for r in rows} == {a: "alice", b: "bob", own["session"]["id"]: "carol"}
        assert [r["id"] for r in (await carol.request("list_sessions", filters={"owner": "bob"}))["rows"]] == [b]
        assert (await carol.request("load_session", session_id=a))["session"]["owner"] == "alice"
        assert {r["session_id"]: r["owner"] for r in (await carol.request("list_running"))["running"]} == {a: "alice"}
        changes = (await carol.request("list_sessions", since=rev))["changes"]
        created = {c["data"]["session"]["id"]: c["data"] for c in changes if c["type"] == "session_created"}
        assert {sid: (d["owner"], d["session"]["owner"]) for sid, d in created.items()} == \
            {a: ("alice", "alice"), b: ("bob", "bob"), own["session"]["id"]: ("carol", "carol")}
        assert all(c["data"]["owner"] for c in changes), changes
        # a user's rows, answers and pushes do not carry it: they are all its own
        mine = await alice.request("list_sessions", since=rev)
        assert mine["changes"] and not any("owner" in c["data"] or "owner" in c["data"].get("session", {})
                                           for c in mine["changes"])
        assert "owner" not in (await alice.request("list_sessions"))["rows"][0]
        assert "owner" not in (await alice.request("load_session", session_id=a))["session"]
        assert all("owner" not in r for r in (await alice.request("list_running"))["running"])


# -- no frame carries another user's bytes -----------------------------------

ACTIONS = st.sampled_from(["chat_new", "chat_again", "rename", "archive", "pin", "delete", "project",
                           "list", "list_since", "running", "projects", "load", "stop"])


async def _act(c: Client, who: str, action: str, mine: list[str], n: int, folder: Path) -> None:
    mark = f"{who.upper()}SECRET{n}"
    sid = mine[n % len(mine)] if mine else None
    try:
        match action:
            case "chat_new":
                mine.append((await c.request("chat", content=f"{mark} hello"))["session_id"])
            case "chat_again" if sid:
                await c.request("chat", session_id=sid, content=f"{mark} again")
            case "rename" if sid:
                await c.request("rename_session", session_id=sid, title=f"{mark} title")
            case "archive" if sid:
                await c.request("set_archived", session_id=sid, archived=bool(n % 2))
            case "pin" if sid:
                await c.request("set_pinned", session_id=sid, pinned=True)
            case "delete" if sid:
                await c.request("delete_session", session_id=sid)
                mine.remove(sid)
            case "project":
                d = folder / f"{who}-{n}"
                d.mkdir(exist_ok=True)
                await c.request("create_project", name=f"{mark} project", path=str(d))
            case "list":
                await c.request("list_sessions", include_archived=True)
            case "list_since":
                rev = (await c.request("list_sessions"))["rev"]
                await c.request("list_sessions", since=rev.rsplit(":", 1)[0] + ":0")
            case "running":
                await c.request("list_running")
            case "projects":
                await c.request("list_projects")
            case "load" if sid:
                await c.follow(sid)
            case "stop" if sid:
                for m in (await c.request("load_session", session_id=sid))["messages"]:
                    if m["status"] == "running":
                        await c.request("stop", session_id=sid, msg_id=m["msg_id"])
    except ServerError as e:
        assert e.code in ("not_running", "path_in_use", "unknown_session", "reply_running"), e.data


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(st.tuples(st.sampled_from(["alice", "bob"]), ACTIONS), min_size=4, max_size=25))
async def test_two_users_never_receive_a_byte_of_each_others_sessions(steps):
    work = Path(tempfile.mkdtemp(dir=os.environ["HOME"]))
    async with trio.open_nursery() as nursery:
        server = await start_users(nursery, str(work / "store"), work, speed=200.0)
        mine: dict[str, list[str]] = {"alice": [], "bob": []}
        async with user(server, "alice", record=True) as alice, user(server, "bob", record=True) as bob:
            clients = {"alice": alice, "bob": bob}
            for n, (who, action) in enumerate(steps):
                await _act(clients[who], who, action, mine[who], n, work)
            await trio.sleep(0.3)  # the last replies' pushes
            ids = {who: set(mine[who]) | {sid for sid, _ in clients[who].content} for who in mine}
            for who, other in (("alice", "bob"), ("bob", "alice")):
                frames = clients[who].frames
                assert frames is not None
                for frame in frames:
                    assert f"{other.upper()}SECRET" not in frame, (who, frame[:300])
                    assert not any(sid in frame for sid in ids[other]), (who, frame[:300])
                    assert f"/{other}-" not in frame, (who, frame[:300])  # a project path
        nursery.cancel_scope.cancel()


# -- projects: no disk probing -----------------------------------------------

async def test_project_paths_outside_the_roots_get_one_answer_whatever_is_wrong(root, nursery, tmp_path):
    allowed = tmp_path / "projects"
    (allowed / "ok").mkdir(parents=True)
    (allowed / "a-file").write_text("x")
    (allowed / "escape").symlink_to("/etc")
    (tmp_path / "outside").mkdir()
    server = await start_users(nursery, root, tmp_path, project_roots=(str(allowed),))
    async with user(server, "alice") as alice:
        answers = set()
        for bad in ("/etc", str(tmp_path / "outside"), str(allowed / "missing"), str(allowed / "a-file"),
                    str(allowed / "escape"), str(allowed / ".." / "outside"), "relative/path", "/nonexistent/x"):
            e = await error_of(alice, "create_project", name="x", path=bad)
            answers.add((e["code"], e["message"]))
        assert len(answers) == 1 and next(iter(answers))[0] == "bad_path", answers
        made = (await alice.request("create_project", name="ok", path=str(allowed / "ok")))["project"]
        assert made["path"] == str(allowed / "ok")
        default = (await alice.request("list_projects"))["projects"][0]
        assert default["id"] == "default" and default["path"] == "", "the server's home is not shown to users"
    async with user(server, "bob") as bob:  # the same folder is bob's to use too: no "in use" oracle
        assert (await bob.request("create_project", name="mine", path=str(allowed / "ok")))["project"]["path"]
        e = await error_of(bob, "create_project", name="again", path=str(allowed / "ok"))
        assert e["code"] == "path_in_use", "one user's own projects never share a folder"


# -- limits per principal ----------------------------------------------------

async def test_limits_refuse_with_stable_codes_change_nothing_and_are_counted(root, nursery, tmp_path):
    server = await start_users(nursery, root, tmp_path, speed=3.0,
                               limits=Limits(sessions=2, running=1, frames_per_second=5, burst=10,
                                             frame_bytes=2000))
    async with user(server, "alice") as alice, user(server, "bob") as bob:
        first = await alice.request("chat", content="one")
        assert (await error_of(alice, "chat", content="two"))["code"] == "limit_running"
        assert (await error_of(alice, "chat", session_id=first["session_id"], content="x"))["code"] == "limit_running"
        assert len(read_logs(root)) == 1, "a refused chat writes nothing"
        await alice.request("stop", session_id=first["session_id"], msg_id=first["reply_id"])
        with trio.fail_after(10):
            while server.quotas.running["alice"]:
                await trio.sleep(0.01)
        await alice.request("create_session")
        assert (await error_of(alice, "create_session"))["code"] == "limit_sessions"
        assert len([s for s in read_logs(root)]) == 2
        await alice.ws.send_message(json.dumps({"action": "rename_session", "session_id": first["session_id"],
                                                "title": "x" * 3000}))
        with trio.fail_after(10):
            await alice.wait_for(lambda f: f["type"] == "error" and f["data"]["code"] == "frame_too_large")
        # alice floods; bob, at his own pace, is answered every time
        await trio.sleep(2.5)  # buckets full again
        for i in range(40):
            await alice.ws.send_message(json.dumps({"action": "list_running", "request_id": f"flood-{i}"}))
        for i in range(5):
            await bob.request("list_running")
        with trio.fail_after(15):
            refused = await alice.wait_for(lambda f: f["type"] == "error" and f["data"]["code"] == "rate_limited")
        assert refused["data"]["request_id"].startswith("flood-"), "answered, by request_id"
    text = server.metrics.render().decode()
    for reason in ("limit_running", "limit_sessions", "frame_too_large", "rate_limited"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f'sessionlog_refusals_total{{reason="{reason}"}}'))
        assert float(line.split()[-1]) >= 1, line


# -- authenticators ------------------------------------------------------------

async def handshake_status(port: int, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> int | None:
    try:
        async with open_websocket("127.0.0.1", port, path, use_ssl=False, extra_headers=headers):
            return 101
    except HandshakeError as e:
        return getattr(e, "status_code", None)


async def test_a_refused_handshake_says_the_same_whatever_was_wrong(root, nursery, tmp_path):
    from .test_ws import raw_http
    server = await start_users(nursery, root, tmp_path)
    bodies = set()
    for token in ("", "wrong", TOKENS["alice"][:-1], TOKENS["alice"] + "x", "nobody-token-0123456789"):
        up = (f"GET /ws?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
              "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        reply = await raw_http(server.port, up.encode())
        bodies.add(reply.split(b"\r\n", 1)[0] + reply.split(b"\r\n\r\n", 1)[1])
    assert bodies == {b"HTTP/1.1 403 Forbidden" + REFUSED.encode() + b"\n"}, bodies
    assert await handshake_status(server.port, f"/ws?token={TOKENS['bob']}") == 101


async def test_proxy_header_is_believed_from_the_trusted_proxy_only(root, nursery):
    trusting = await start(nursery, root, auth=AuthConfig(mode="proxy-header"), trust=("127.0.0.1",))
    hdr = [(b"X-Forwarded-User", b"alice")]
    assert await handshake_status(trusting.port, "/ws", hdr) == 101
    assert await handshake_status(trusting.port, "/ws") == 403, "no header: no user"
    wary = await start(nursery, root + "-b", auth=AuthConfig(mode="proxy-header"), trust=("10.9.9.9",))
    assert await handshake_status(wary.port, "/ws", hdr) == 403, "anyone can send the header"
    for trust in ((), ("*",)):
        with pytest.raises(ValueError, match="forwarded-allow-ips"):
            make_authenticator(AuthConfig(mode="proxy-header"), "", trust)


SECRET = "a-secret-of-at-least-thirty-two-characters!"


async def test_jwt_checks_signature_expiry_audience_issuer_and_the_algorithm(root, nursery, tmp_path):
    import time

    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    auth = AuthConfig(mode="jwt", jwt=JwtConfig(secret=SECRET, audience="chat", issuer="https://id.example",
                                                leeway=10))
    server = await start(nursery, root, auth=auth)
    now = int(time.time())
    good = {"sub": "alice", "aud": "chat", "iss": "https://id.example", "exp": now + 60}

    async def status(claims: dict[str, object], key: object = SECRET, alg: str = "HS256", bearer: bool = False) -> int | None:
        token = jwt.encode(claims, key, algorithm=alg)  # type: ignore[arg-type]
        if bearer:
            return await handshake_status(server.port, "/ws", [(b"Authorization", f"Bearer {token}".encode())])
        return await handshake_status(server.port, f"/ws?token={token}")
    assert await status(good) == 101
    assert await status(good, bearer=True) == 101
    assert await status({**good, "exp": now - 5}) == 101, "within the leeway"
    assert await status({**good, "exp": now - 60}) == 403, "expired"
    assert await status({k: v for k, v in good.items() if k != "exp"}) == 403, "exp is required"
    assert await status({**good, "aud": "other"}) == 403
    assert await status({**good, "iss": "https://evil.example"}) == 403
    assert await status(good, key="another-secret-of-at-least-thirty-two-chars") == 403
    assert await status(good, key=None, alg="none") == 403
    # public keys: RS256 from a JWKS file, and no HS256 forged with the public key
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]}))
    rs = await start(nursery, root + "-rs", auth=AuthConfig(mode="jwt", jwt=JwtConfig(jwks_file=str(tmp_path / "jwks.json"))))
    token = jwt.encode({k: v for k, v in good.items() if k != "aud"}, private, algorithm="RS256", headers={"kid": "k1"})
    assert await handshake_status(rs.port, f"/ws?token={token}") == 101
    pem = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    import hmac as _hmac
    import base64
    head = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": "k1"}).encode()).rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(good).encode()).rstrip(b"=")
    sig = base64.urlsafe_b64encode(_hmac.new(pem, head + b"." + body, "sha256").digest()).rstrip(b"=")
    forged = (head + b"." + body + b"." + sig).decode()
    assert await handshake_status(rs.port, f"/ws?token={forged}") == 403, "HS256 signed with the public key"


async def test_a_bearer_header_wins_over_the_urls_token(root, nursery):
    """A JWT in both places: the Authorization header's is the credential,
    valid or not (the URL's is not a fallback); a header that is not
    `Bearer` leaves the URL's."""
    import time

    import jwt
    server = await start(nursery, root, auth=AuthConfig(mode="jwt", jwt=JwtConfig(secret=SECRET)))
    exp = int(time.time()) + 600

    def token(sub: str, key: str = SECRET) -> str:
        return jwt.encode({"sub": sub, "exp": exp}, key, algorithm="HS256")
    bad = token("alice", key="another-secret-of-at-least-thirty-two-chars")
    assert await handshake_status(server.port, f"/ws?token={token('bob')}",
                                  [(b"Authorization", f"Bearer {bad}".encode())]) == 403, "no fallback to the URL"
    assert await handshake_status(server.port, f"/ws?token={bad}",
                                  [(b"Authorization", f"Bearer {token('alice')}".encode())]) == 101
    assert await handshake_status(server.port, f"/ws?token={token('bob')}",
                                  [(b"Authorization", b"Basic Ym9iOnNlY3JldA==")]) == 101, "not a bearer: the URL's"
    async with open_websocket("127.0.0.1", server.port, f"/ws?token={token('bob')}", use_ssl=False,
                              extra_headers=[(b"Authorization", f"Bearer {token('alice')}".encode())]) as ws:
        await ws.send_message(json.dumps({"action": "create_session", "title": "whose?", "request_id": 1}))
        sid = json.loads(await ws.get_message())["data"]["session"]["id"]
    for sub, rows in (("alice", [sid]), ("bob", [])):
        async with open_client("127.0.0.1", server.port, token(sub)) as c:
            assert [r["id"] for r in (await c.request("list_sessions"))["rows"]] == rows, sub


def test_user_ids_are_nfc_keep_their_case_and_refuse_whitespace_around_and_control_characters(tmp_path):
    from sessionlog_store.server.edge.auth import TokensFile, user_id
    assert user_id("Ame\u0301lie") == user_id("Am\u00e9lie") == "Am\u00e9lie", "one user however é is spelled"
    assert user_id("Alice") == "Alice" != user_id("alice"), "case is kept: two users"
    assert user_id("alice smith") == "alice smith" and user_id("alice@example.com") == "alice@example.com"
    for bad in ("", " alice", "alice ", "alice\n", "\talice", "ali\x00ce", "ali\x7fce", "ali\u0085ce",
                "alice\u200b", "\u202ealice", "ali\u2028ce", "\u00a0alice", "x" * 201, "ali\ud800ce"):
        assert user_id(bad) is None, repr(bad)
    assert user_id("x" * 200) == "x" * 200
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"token-of-amelie-0123": "Ame\u0301lie"}))
    table = TokensFile(str(path))
    from sessionlog_store.server.edge.http import Request
    req = Request(method="GET", target="/ws?token=token-of-amelie-0123", headers={})
    cred = table.authenticate(req, False)
    assert cred is not None and cred.user == "Am\u00e9lie", "recorded as owners are compared: NFC"
    path.write_text(json.dumps({"token-of-bob-0123456": "bob "}))
    with pytest.raises(ValueError, match="bad user id"):
        TokensFile(str(path))
    assert AuthConfig(mode="tokens-file", admins=("Ame\u0301lie",)).admins == ("Am\u00e9lie",)
    with pytest.raises(ValueError, match="--admin"):
        AuthConfig(mode="tokens-file", admins=("carol\n",))


async def test_a_jwt_sub_is_one_user_however_its_unicode_is_spelled_and_a_bad_one_is_refused(root, nursery):
    import time

    import jwt
    server = await start(nursery, root, auth=AuthConfig(mode="jwt", jwt=JwtConfig(secret=SECRET)))
    exp = int(time.time()) + 600

    def token(sub: str) -> str:
        return jwt.encode({"sub": sub, "exp": exp}, SECRET, algorithm="HS256")
    async with open_client("127.0.0.1", server.port, token("Ame\u0301lie")) as decomposed:
        sid = (await decomposed.request("create_session"))["session"]["id"]
    async with open_client("127.0.0.1", server.port, token("Am\u00e9lie")) as composed:
        assert [r["id"] for r in (await composed.request("list_sessions"))["rows"]] == [sid]
    async with open_client("127.0.0.1", server.port, token("AM\u00c9LIE")) as shouting:
        assert (await shouting.request("list_sessions"))["rows"] == [], "another case, another user"
    for bad in (" Am\u00e9lie", "Am\u00e9lie\u200b", "Am\u00e9\nlie", ""):
        assert await handshake_status(server.port, f"/ws?token={token(bad)}") == 403, repr(bad)
    first = json.loads(read_logs(root)[sid].split(b"\n")[0])
    assert first["owner"] == "Am\u00e9lie"


# -- review findings -------------------------------------------------------------

async def test_a_project_never_points_into_the_data_root_nor_at_the_home(root, nursery, tmp_path):
    """Review finding: with the home as the project root and the data root
    under it, a project on `<root>/sessions/<id>` told whether that session
    existed."""
    server = await start_users(nursery, root, tmp_path, project_roots=(str(tmp_path),), home=str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    async with user(server, "bob") as bob:
        bob_sid = (await bob.request("create_session"))["session"]["id"]
    async with user(server, "alice") as alice:
        answers = {json.dumps({k: v for k, v in (await error_of(alice, "create_project", name="x", path=p)).items()
                               if k != "request_id"})
                   for p in (os.path.join(root, "sessions", bob_sid), os.path.join(root, "sessions", FAKE), root,
                             os.path.join(root, "sessions"), str(tmp_path / "home"), str(tmp_path))}  # (holds the root)
        assert len(answers) == 1 and '"bad_path"' in answers.pop()


async def test_a_revoked_token_and_an_expired_jwt_end_their_open_connections(root, nursery, tmp_path):
    import time

    import jwt
    server = await start_users(nursery, root, tmp_path)
    async with user(server, "alice") as alice, user(server, "bob") as bob:
        await alice.request("list_sessions")
        (tmp_path / "tokens.json").write_text(json.dumps({TOKENS["bob"]: "bob"}))  # alice's token removed
        server.reload_auth()
        with trio.fail_after(10):
            while not alice.ws.closed:
                await trio.sleep(0.01)
        assert alice.ws.closed.code == 1008
        await bob.request("list_sessions")  # still his
    assert await handshake_status(server.port, f"/ws?token={TOKENS['alice']}") == 403
    auth = AuthConfig(mode="jwt", jwt=JwtConfig(secret=SECRET, leeway=0))
    js = await start(nursery, root + "-jwt", auth=auth)
    token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 2}, SECRET, algorithm="HS256")
    async with open_client("127.0.0.1", js.port, token) as c:
        await c.request("list_sessions")
        with trio.fail_after(10):
            while not c.ws.closed:
                await trio.sleep(0.05)
        assert c.ws.closed.code == 1008
    with_aud = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60, "aud": "another-app"}, SECRET,
                          algorithm="HS256")
    assert await handshake_status(js.port, f"/ws?token={with_aud}") == 403, "a token for another audience"


async def test_limits_hold_across_connections_reconnects_and_races(root, nursery, tmp_path):
    server = await start_users(nursery, root, tmp_path, speed=3.0,
                               limits=Limits(running=1, frames_per_second=2, burst=3, frame_bytes=500,
                                             connections=2, projects=1))
    async with user(server, "alice") as a1, user(server, "alice") as a2:
        assert await handshake_status(server.port, f"/ws?token={TOKENS['alice']}") == 429, "a third connection"
        results = []

        async def chat(c: Client) -> None:
            try:
                results.append((await c.request("chat", content="race"))["reply_id"])
            except ServerError as e:
                results.append(e.code)
        async with trio.open_nursery() as n:
            n.start_soon(chat, a1)
            n.start_soon(chat, a2)
        assert sorted(r if r == "limit_running" else "ok" for r in results) == ["limit_running", "ok"]
        assert len(read_logs(root)) == 1, "the refused chat wrote no session"
        (tmp_path / "p1").mkdir()
        (tmp_path / "p2").mkdir()
        await trio.sleep(1.5)
        await a1.request("create_project", name="one", path=str(tmp_path / "p1"))
        assert (await error_of(a1, "create_project", name="two", path=str(tmp_path / "p2")))["code"] == "limit_projects"
        for _ in range(6):  # too large frames take tokens too
            await a1.ws.send_message(json.dumps({"action": "list_running", "pad": "x" * 600}))
        with trio.fail_after(10):
            await a1.wait_for(lambda f: f["type"] == "error" and f["data"]["code"] == "rate_limited")
    async with user(server, "alice") as again:  # a new connection brings no fresh burst (of 3)...
        for i in range(4):
            await again.ws.send_message(json.dumps({"action": "list_running", "request_id": 100 + i}))
        with trio.fail_after(15):
            while len([f for f in again.pushes if f.get("request_id") in range(100, 104)]) < 4:
                await trio.sleep(0.05)
        answers = [f for f in again.pushes if f.get("request_id") in range(100, 104)]
        # ...nor a fresh refusal: a fresh bucket of 3 would have refused the 4th
        # frame; alice, told already and still over her rate, is read at it
        assert [f["type"] for f in answers] == ["running_list"] * 4, answers


async def test_a_flood_is_refused_once_and_then_read_at_the_rate(root, nursery, tmp_path):
    """40 frames at once, burst 10: the first frame past the burst is answered
    `rate_limited`, and every later one waits for its token and is handled
    (not every other one refused). Each frame takes a token, so the last
    answer cannot come before (40 - 10) / rate seconds: a lower bound that
    load only makes longer."""
    rate, burst, n = 20.0, 10, 40
    server = await start_users(nursery, root, tmp_path, limits=Limits(frames_per_second=rate, burst=burst))
    async with user(server, "alice") as alice:
        began = trio.current_time()
        for i in range(n):
            await alice.ws.send_message(json.dumps({"action": "list_running", "request_id": i}))
        with trio.fail_after(30):
            while len([f for f in alice.pushes if isinstance(f.get("request_id"), int)]) < n:
                await trio.sleep(0.02)
        took = trio.current_time() - began
        answers = [f for f in alice.pushes if isinstance(f.get("request_id"), int)]
        assert [f["request_id"] for f in answers] == list(range(n)), "answered in the order sent"
        refused = [f["request_id"] for f in answers if f["type"] == "error"]
        assert len(refused) == 1 and refused[0] >= burst, refused
        assert answers[refused[0]]["data"]["code"] == "rate_limited"
        assert all(f["type"] == "running_list" for f in answers if f["request_id"] != refused[0])
        assert took >= (n - burst - 1) / rate, took
        # a second wave while still over the rate: read at the rate, not told again
        for i in range(n, n + 5):
            await alice.ws.send_message(json.dumps({"action": "list_running", "request_id": i}))
        with trio.fail_after(30):
            while len([f for f in alice.pushes if isinstance(f.get("request_id"), int)]) < n + 5:
                await trio.sleep(0.02)
        assert [f["type"] for f in alice.pushes if isinstance(f.get("request_id"), int)][n:] == ["running_list"] * 5
    assert server.quotas.refused["rate_limited"] == 1


def test_the_registry_cap_is_per_owner():
    from sessionlog_store.projections.maintenance import MaintenanceConfig, plan_maintenance
    from sessionlog_store.projections.session import SessionMeta
    rows = [SessionMeta(id=f"a{i}", owner="alice", archived=True, message_count=1, updated_at=i) for i in range(5)]
    rows += [SessionMeta(id=f"b{i}", owner="bob", archived=True, message_count=1, updated_at=100 + i) for i in range(2)]
    plan = plan_maintenance(rows, now=200.0, cfg=MaintenanceConfig(empty_shell_age=0, archive_ttl=0, max_sessions=3))
    assert plan.over_capacity == ["a0", "a1"], "alice's many sessions never push out bob's"


async def test_sighup_rereads_the_tokens_file_of_a_real_server(root, tmp_path):
    import re
    import signal
    import subprocess
    import sys

    from .conftest import ROOT as REPO
    path = tokens_file(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "sessionlog_store", "serve", "--root", root, "--port", "0",
                             "--auth", "tokens-file", "--tokens-file", path, "--admin", "carol"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def port_of() -> int:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "server ended"
            if "serving http://" in line:
                assert "token" not in line.split("(")[0], "no token in the URL of a many-user server"
                return int(re.search(r"http://[^/]+:(\d+)/", line).group(1))  # type: ignore[union-attr]
    try:
        with trio.fail_after(60):
            port = await trio.to_thread.run_sync(port_of)
            async with open_client("127.0.0.1", port, TOKENS["alice"]) as alice:
                await alice.request("create_session", title="before the reload")
                Path(path).write_text(json.dumps({"dave-token-0123456789ab": "dave", TOKENS["bob"]: "bob"}))
                proc.send_signal(signal.SIGHUP)
                while not alice.ws.closed:  # alice's token is gone: so is her connection
                    await trio.sleep(0.05)
            async with open_client("127.0.0.1", port, "dave-token-0123456789ab") as dave:
                assert (await dave.request("list_sessions"))["rows"] == []
            assert await handshake_status(port, f"/ws?token={TOKENS['alice']}") == 403
        proc.send_signal(signal.SIGTERM)
        _, err = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
        assert proc.returncode == 0, err
        assert "tokens file reloaded" in err and TOKENS["alice"] not in err
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_second_review_findings_caps_hold_under_races_and_admins_get_no_pushes(root, nursery, tmp_path, caplog):
    server = await start_users(nursery, root, tmp_path, limits=Limits(connections=2, projects=2, frame_bytes=500))
    statuses = []

    async def connect() -> None:
        try:
            async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKENS['alice']}", use_ssl=False):
                statuses.append(101)
                await trio.sleep(1.0)
        except HandshakeError as e:
            statuses.append(getattr(e, "status_code", None))
    async with trio.open_nursery() as n:
        for _ in range(12):
            n.start_soon(connect)
    assert statuses.count(101) == 2 and statuses.count(429) == 10, statuses
    caplog.set_level(logging.WARNING, logger="sessionlog.audit")
    async with user(server, "alice") as alice, user(server, "carol", record=True) as carol:
        results = []

        async def make(i: int) -> None:
            d = tmp_path / f"p{i}"
            d.mkdir()
            try:
                await alice.request("create_project", name=f"p{i}", path=str(d))
                results.append("ok")
            except ServerError as e:
                results.append(e.code)
        async with trio.open_nursery() as n:
            for i in range(8):
                n.start_soon(make, i)
        assert results.count("ok") == 2 and results.count("limit_projects") == 6, results
        sid = (await alice.request("create_session", title="alice only"))["session"]["id"]
        await alice.request("rename_session", session_id=sid, title="still alice only")
        await carol.request("list_projects")
        assert any("list_projects" in r.getMessage() for r in caplog.records), "an admin's project list is logged"
        await trio.sleep(0.2)
        assert carol.frames is not None and not any(sid in f for f in carol.frames if '"list_projects"' not in f), \
            "an admin is pushed nothing of others': it reads by asking, and each ask is logged"
        await alice.ws.send_message("x" * 3000)  # over 4x the frame limit: the connection ends, unread
        with trio.fail_after(10):
            while not alice.ws.closed:
                await trio.sleep(0.02)
        assert alice.ws.closed.code == 1009


async def test_a_key_taken_out_of_the_jwks_ends_its_connections(root, nursery, tmp_path):
    import time

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    def jwks(*keys: tuple[str, object]) -> None:
        (tmp_path / "jwks.json").write_text(json.dumps({"keys": [
            {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k.public_key())), "kid": kid, "alg": "RS256"}  # type: ignore[attr-defined]
            for kid, k in keys]}))
    k1, k2 = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    jwks(("k1", k1), ("k2", k2))
    server = await start(nursery, root, auth=AuthConfig(mode="jwt", jwt=JwtConfig(jwks_file=str(tmp_path / "jwks.json"))))
    exp = int(time.time()) + 600
    t1 = jwt.encode({"sub": "alice", "exp": exp}, k1, algorithm="RS256", headers={"kid": "k1"})
    t2 = jwt.encode({"sub": "bob", "exp": exp}, k2, algorithm="RS256", headers={"kid": "k2"})
    async with open_client("127.0.0.1", server.port, t1) as a, open_client("127.0.0.1", server.port, t2) as b:
        jwks(("k2", k2))  # k1 withdrawn
        server.reload_auth()
        with trio.fail_after(10):
            while not a.ws.closed:
                await trio.sleep(0.02)
        await b.request("list_sessions")
    assert await handshake_status(server.port, f"/ws?token={t1}") == 403


async def test_the_token_is_read_from_one_place_and_its_subprotocol_is_never_echoed(root, nursery, tmp_path):
    """Issue 26 item 5: the page's token travels in a subprotocol, not in a
    URL. Header, then subprotocol, then URL, with no fallback from a refused
    one to a later one; the server selects sessionlog.v1 and never echoes
    the token's subprotocol; a subprotocol that does not decode is refused
    like a wrong token; ?token= still works for scripts."""
    import base64
    server = await start_users(nursery, root, tmp_path)
    alice, bob = TOKENS["alice"], TOKENS["bob"]

    def proto(token: str) -> str:
        return "sessionlog.token." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")

    async def who(path: str, protocols: list[str] | None = None,
                  headers: list[tuple[bytes, bytes]] | None = None) -> tuple[str | None, int]:
        """(the subprotocol the server selected, the sessions listed) or raises."""
        async with open_websocket("127.0.0.1", server.port, path, use_ssl=False, subprotocols=protocols,
                                  extra_headers=headers) as ws:
            await ws.send_message(json.dumps({"action": "list_sessions", "request_id": 1}))
            return ws.subprotocol, len(json.loads(await ws.get_message())["data"]["rows"])

    async with open_client("127.0.0.1", server.port, alice) as c:  # the Python client: the subprotocol
        await c.request("create_session", title="alice's")
    assert await who("/ws", ["sessionlog.v1", proto(alice)]) == ("sessionlog.v1", 1)
    assert await who("/ws", [proto(alice)]) == (None, 1), "nothing selected when v1 is not offered"
    assert await who(f"/ws?token={alice}") == (None, 1), "scripts: ?token= as before"
    # the subprotocol before the URL, and no fallback from a refused one
    assert await who(f"/ws?token={alice}", ["sessionlog.v1", proto(bob)]) == ("sessionlog.v1", 0)
    for bad in ("sessionlog.token.!!!", "sessionlog.token.", proto(alice[:-1])):
        assert await handshake_status_with(server.port, f"/ws?token={alice}", [bad]) == 403, bad
    # a bearer header before the subprotocol
    assert await who("/ws", ["sessionlog.v1", proto(alice)],
                     [(b"Authorization", f"Bearer {bob}".encode())]) == ("sessionlog.v1", 0)


async def handshake_status_with(port: int, path: str, protocols: list[str]) -> int | None:
    try:
        async with open_websocket("127.0.0.1", port, path, use_ssl=False, subprotocols=protocols):
            return 101
    except HandshakeError as e:
        return getattr(e, "status_code", None)
