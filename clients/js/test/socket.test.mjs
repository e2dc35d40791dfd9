// The WebSocket client against a real `sessionlog serve`: the session list
// kept live and resumed with `since` after a cut, message subscriptions
// resumed exactly by offset across cuts and a server restart, Stop, and a
// refused handshake.
import assert from "node:assert/strict"
import { after, before, describe, test } from "node:test"
import { ApiError, Client, ConnectionLost, SocketClient } from "../dist/index.js"
import { rmSync, writeFileSync } from "node:fs"
import { Serve, TOKEN, cuttingProxy, until } from "./helpers.mjs"

/** Follow a message through `socket` to its end: {text, status, updates}. */
function follow(socket, sid, mid, offset = 0) {
  let text = ""
  let resolve
  const done = new Promise((r) => { resolve = r })
  const state = { updates: 0, text: () => text, done }
  socket.subscribeMessage(sid, mid, {
    offset,
    onUpdate(u) {
      // each update starts where the last ended, or (after a crash) takes back a tail that was never durable
      assert.ok(u.offset <= offset + text.length, "no gap")
      text = text.slice(0, u.offset - offset) + u.content_delta
      state.updates += 1
      if (["done", "error", "aborted"].includes(u.status)) resolve({ text, status: u.status, reason: u.aborted_reason })
    },
  })
  return state
}

describe("SocketClient", () => {
  let serve, proxy, http
  const sockets = []
  const open = (port, opts = {}) => {
    const s = new SocketClient({ url: `ws://127.0.0.1:${port}/ws`, token: TOKEN, heartbeatMs: 2000, ...opts }).start()
    sockets.push(s)
    return s
  }
  const opened = (s) => new Promise((r) => { if (s.online) r(); else { const off = s.on("open", () => { off(); r() }) } })
  before(async () => {
    proxy = await cuttingProxy(() => serve.port)
    serve = new Serve({ allowedHosts: [`127.0.0.1:${proxy.port}`] })
    await serve.start()
    http = new Client({ baseUrl: serve.base, token: TOKEN })
  })
  after(async () => { for (const s of sockets) s.close(); await proxy.close(); await serve.close() })

  test("the session list is live, and a change made while cut off arrives after the reconnect (since)", async () => {
    const s = open(proxy.port)
    await until(() => s.rev !== null, { what: "the first list" })
    const row = await http.createSession({ title: "seen live" })
    await until(() => s.sessions.get(row.id)?.title === "seen live", { what: "session_created" })
    const revBefore = s.rev
    const away = new Promise((r) => { const off = s.on("close", () => { off(); r() }) })
    proxy.cut()
    await away
    await http.updateSession(row.id, { title: "renamed while away" })
    const gone = await http.createSession({ title: "deleted while away" })
    await http.deleteSession(gone.id)
    await opened(s)
    await until(() => s.sessions.get(row.id)?.title === "renamed while away", { what: "the rename, after the reconnect" })
    assert.equal(s.sessions.has(gone.id), false)
    assert.notEqual(s.rev, revBefore)
  })

  test("a reply followed across cuts is one gapless text, equal to the stored one", async () => {
    const s = open(proxy.port)
    await opened(s)
    const ack = await s.request("chat", { content: "tell me a long story" })
    const f = follow(s, ack.session_id, ack.reply_id)
    let cuts = 0
    await until(async () => {
      if (f.text().length > 40 * (cuts + 1) && cuts < 3) {
        cuts += proxy.cut() > 0 ? 1 : 0
        await opened(s)
      }
      return cuts >= 3 || (await Promise.race([f.done.then(() => true), Promise.resolve(false)]))
    }, { what: "three cuts mid-reply" })
    const end = await f.done
    assert.ok(cuts >= 2, `cut ${cuts} times`)
    assert.equal(end.status, "done")
    const stored = (await http.getSession(ack.session_id)).messages.find((m) => m.msg_id === ack.reply_id)
    assert.equal(end.text, stored.content)
  })

  test("a server restart mid-reply (SIGKILL): resubscribed from its offset, it ends aborted with exactly the stored text", async () => {
    const s = open(serve.port)
    await opened(s)
    const ack = await s.request("chat", { content: "another long one" })
    const f = follow(s, ack.session_id, ack.reply_id)
    await until(() => f.text().length > 30, { what: "some text" })
    await serve.restart()
    const end = await f.done
    assert.equal(end.status, "aborted")
    const stored = (await http.getSession(ack.session_id)).messages.find((m) => m.msg_id === ack.reply_id)
    assert.equal(end.text, stored.content)
  })

  test("a stop during a graceful stop of the server (SIGTERM): the subscriber hears 'server shutdown', then reconnects", async () => {
    const s = open(serve.port)
    await opened(s)
    const ack = await s.request("chat", { content: "and one more" })
    const f = follow(s, ack.session_id, ack.reply_id)
    await until(() => f.text().length > 10, { what: "some text" })
    const stopping = serve.kill("SIGTERM")
    const end = await f.done
    await stopping
    assert.equal(end.status, "aborted")
    assert.equal(end.reason, "server shutdown")
    await assert.rejects(s.request("list_running"), ConnectionLost)
    await serve.start()
    await opened(s)
    const stored = (await http.getSession(ack.session_id)).messages.find((m) => m.msg_id === ack.reply_id)
    assert.equal(end.text, stored.content)
  })

  test("Stop ends the reply aborted, 'stopped by user'; refusals carry the server's code", async () => {
    const s = open(serve.port)
    await opened(s)
    const ack = await s.request("chat", { content: "stop me" })
    const f = follow(s, ack.session_id, ack.reply_id)
    await until(() => f.text().length > 0, { what: "the first text" })
    await s.request("stop", { session_id: ack.session_id, msg_id: ack.reply_id })
    const end = await f.done
    assert.deepEqual([end.status, end.reason], ["aborted", "stopped by user"])
    await assert.rejects(s.request("load_session", { session_id: "nope" }),
                         (e) => e instanceof ApiError && e.code === "unknown_session")
  })

  test("a wrong token: the handshake is refused, and the client says so by counting failed opens", async () => {
    const s = open(serve.port, { token: "wrong" })
    await until(() => s.failedOpens >= 2, { what: "two refused opens" })
    assert.equal(s.everOpened, false)
    s.close()
  })

  test("a tail the server sent and then lost in a crash is taken back by a lower offset; the text ends as stored", async () => {
    const held = new Serve({ held: true })
    await held.start()
    try {
      const s = open(held.port)
      await opened(s)
      const ack = await s.request("chat", { content: "a long one please" })
      const f = follow(s, ack.session_id, ack.reply_id)
      await until(() => f.text().length > 20, { what: "some text" })
      writeFileSync(held.hold, "")  // the disk stalls: what is sent from now on is not written
      const atStall = f.text().length
      await until(() => f.text().length > atStall + 10, { what: "text sent past the stall" })
      const sent = f.text().length
      await held.kill()
      rmSync(held.hold, { force: true })
      await held.start()
      const end = await f.done
      assert.equal(end.status, "aborted")
      const http2 = new Client({ baseUrl: held.base, token: TOKEN })
      const stored = (await http2.getSession(ack.session_id)).messages.find((m) => m.msg_id === ack.reply_id)
      assert.ok(stored.content.length < sent, "the crash lost a tail the subscriber was sent")
      assert.equal(end.text, stored.content)
    } finally {
      await held.close()
    }
  })
})
