// The HTTP client against a real `sessionlog serve`: sessions and messages,
// the list followed with `since`, a reader cut mid-stream and across a server
// restart (one gapless text), the producer (batched appends, a tool call,
// tokens, done / error) and a Stop reaching a silent producer.
import assert from "node:assert/strict"
import { after, before, describe, test } from "node:test"
import { ApiError, Client } from "../dist/index.js"
import { rmSync, writeFileSync } from "node:fs"
import { Serve, TOKEN, cuttingProxy, until } from "./helpers.mjs"

describe("Client over HTTP", () => {
  let serve, proxy, sl
  before(async () => {
    proxy = await cuttingProxy(() => serve.port)
    serve = new Serve({ allowedHosts: [`127.0.0.1:${proxy.port}`], extra: ["--producer-timeout", "3"] })
    await serve.start()
    sl = new Client({ baseUrl: serve.base, token: TOKEN })
  })
  after(async () => { await proxy.close(); await serve.close() })

  test("sessions and messages; a refusal is an ApiError with the server's code", async () => {
    const row = await sl.createSession({ title: "from node" })
    assert.equal(row.title, "from node")
    const mid = await sl.addMessage(row.id, "hello")
    const loaded = await sl.getSession(row.id)
    assert.deepEqual(loaded.messages.map((m) => [m.msg_id, m.content, m.status]), [[mid, "hello", "done"]])
    assert.deepEqual(await sl.updateSession(row.id, { pinned: true }), { pinned: true })
    const list = await sl.listSessions()
    assert.ok(list.rows.some((r) => r.id === row.id && r.pinned))
    await sl.deleteSession(row.id)
    await assert.rejects(sl.getSession(row.id), (e) => e instanceof ApiError && e.status === 404 && e.code === "unknown_session")
    await assert.rejects(sl.getSession("../etc"), (e) => e instanceof ApiError && e.code === "invalid_session_id")
    // a stream read's refusal carries the server's code too
    const read = async (sid, mid, offset) => { for await (const _ of sl.readMessage(sid, mid, { offset, live: false })) {} }
    await assert.rejects(read(row.id, mid, "-1"), (e) => e instanceof ApiError && e.status === 404 && e.code === "unknown_session")
    const wrong = new Client({ baseUrl: serve.base, token: "wrong" })
    await assert.rejects(wrong.listSessions(), (e) => e instanceof ApiError && e.status === 401)
  })

  test("the session list followed with since: a create, a rename and a delete, in order", async () => {
    const ac = new AbortController()
    const seen = []
    let ready
    const listed = new Promise((r) => { ready = r })
    const following = (async () => {
      for await (const ch of sl.followSessions({ intervalMs: 50, signal: ac.signal })) {
        seen.push(ch)
        if (ch.type === "relist") ready()
        if (ch.type === "session_deleted") ac.abort()
      }
    })()
    await listed
    const row = await sl.createSession({ title: "one" })
    await sl.updateSession(row.id, { title: "two" })
    await sl.deleteSession(row.id)
    await following
    const mine = seen.filter((c) => c.type !== "relist" && (c.data.id ?? c.data.session?.id ?? c.data.session_id) === row.id)
    assert.deepEqual(mine.map((c) => c.type), ["session_created", "session_updated", "session_deleted"])
    assert.equal(mine[1].data.title, "two")
  })

  for (const live of ["sse", "long-poll"]) {
    test(`a reader (${live}) cut mid-stream again and again reads one gapless text`, async () => {
      const ack = await sl.chat("write me something long")
      const reader = new Client({ baseUrl: `http://127.0.0.1:${proxy.port}`, token: TOKEN })
      let text = ""
      let cuts = 0
      let last
      for await (const c of reader.readMessage(ack.session_id, ack.reply_id, { live })) {
        text += c.text
        last = c
        if (text.length > 20 * (cuts + 1) && cuts < 4 && !c.closed) cuts += proxy.cut() > 0 ? 1 : 0
      }
      assert.ok(cuts >= 2, `cut ${cuts} times`)
      assert.equal(last.closed, true)
      assert.equal(last.status, "done")
      const stored = (await sl.getSession(ack.session_id)).messages.find((m) => m.msg_id === ack.reply_id)
      assert.equal(text, stored.content)
      // and from an offset handed over: exactly the rest
      const half = []
      for await (const c of sl.readMessage(ack.session_id, ack.reply_id, { live: false })) half.push(c)
      const mid = half[0]
      assert.equal(mid.text, stored.content)
      let rest = ""
      for await (const c of sl.readMessage(ack.session_id, ack.reply_id, { offset: mid.offset, live: false })) rest += c.text
      assert.equal(rest, "")
    })
  }

  test("a producer: batched writes, a tool call with its result, tokens, done", async () => {
    const row = await sl.createSession()
    await sl.addMessage(row.id, "search it")
    let replyId
    await sl.produce(row.id, async (r) => {
      replyId = r.replyId
      for (const w of ["Let ", "me ", "look."]) r.write(w)
      const call = await r.toolCall("search", { callId: "call_1", arguments: '{"q":"durable"}' })
      call.write("3 results")
      await call.close()
      r.write(" Found 3.")
      await r.tokens({ input: 12, output: 5 })
    })
    const loaded = await sl.getSession(row.id)
    const reply = loaded.messages.find((m) => m.msg_id === replyId)
    assert.equal(reply.content, "Let me look. Found 3.")
    assert.equal(reply.status, "done")
    assert.deepEqual(reply.tokens, { input: 12, output: 5 })
    const call = loaded.messages.find((m) => m.kind === "tool_call")
    assert.equal(call.content, "3 results")
    assert.equal(call.status, "done")
    assert.equal(call.caller, replyId)
    assert.deepEqual([call.metadata.tool, call.metadata.tool_call_id, call.metadata.arguments],
                     ["search", "call_1", '{"q":"durable"}'])
    // in the log, the text written before the call comes before it (the call's place in the reply)
    const log = await (await fetch(sl.url(`stream/sessions/${row.id}?offset=-1`), { headers: sl.headers() })).json()
    const order = log.map((r) => r.event).filter((e) => (e.type === "p" && e.m === replyId && e.d) ||
                                                       (e.type === "message_created" && e.kind === "tool_call"))
    assert.deepEqual(order.map((e) => e.type === "p" ? e.d : "tool"), ["Let me look.", "tool", " Found 3."])
  })

  test("a producer that throws ends its reply error with the message, and the error goes on", async () => {
    const row = await sl.createSession()
    let replyId
    await assert.rejects(sl.produce(row.id, async (r) => {
      replyId = r.replyId
      r.write("half an answer")
      throw new Error("model went away")
    }), /model went away/)
    const reply = (await sl.getSession(row.id)).messages.find((m) => m.msg_id === replyId)
    assert.equal(reply.status, "error")
    assert.equal(reply.content, "half an answer")
    assert.match(reply.error, /model went away/)
  })

  test("a Stop reaches a producer that writes nothing, and its writes are dropped", async () => {
    const row = await sl.createSession()
    const r = await sl.reply(row.id, { intervalMs: 100 })
    r.write("before the stop")
    await until(async () => (await sl.getSession(row.id)).messages.some((m) => m.content === "before the stop"),
                { what: "the first append" })
    const stopped = new Promise((resolve) => r.stopped.addEventListener("abort", resolve, { once: true }))
    await sl.stop(row.id, r.replyId)
    await stopped
    assert.equal(r.ended.status, "aborted")
    r.write("after the stop")
    await r.close()
    const reply = (await sl.getSession(row.id)).messages.find((m) => m.msg_id === r.replyId)
    assert.equal(reply.status, "aborted")
    assert.equal(reply.content, "before the stop")
  })

  test("a read from past a message's end is refused bad_offset", async () => {
    const row = await sl.createSession()
    const mid = await sl.addMessage(row.id, "short")
    let offset
    for await (const c of sl.readMessage(row.id, mid, { live: false })) offset = c.offset
    const beyond = String(Number(offset.slice(0, 16)) + 5).padStart(16, "0") + offset.slice(16)
    const read = async () => { for await (const _ of sl.readMessage(row.id, mid, { offset: beyond, live: false })) {} }
    await assert.rejects(read(), (e) => e instanceof ApiError && e.status === 400 && e.code === "bad_offset")
  })

  test("a reader across a server restart (SIGKILL mid-reply) ends with exactly the stored text", async () => {
    const ack = await sl.chat("a long one please")
    let text = ""
    let last
    let restarted = false
    for await (const c of sl.readMessage(ack.session_id, ack.reply_id)) {
      text = c.restart ? c.text : text + c.text  // a tail sent but never durable is taken back
      last = c
      if (!restarted && text.length > 30) {
        restarted = true
        await serve.restart()
      }
    }
    assert.ok(restarted)
    assert.equal(last.status, "aborted")
    const stored = (await sl.getSession(ack.session_id)).messages.find((m) => m.msg_id === ack.reply_id)
    assert.equal(stored.status, "aborted")
    assert.equal(text, stored.content)
  })

  test("a tail the server sent and then lost in a crash is taken back (Chunk.restart); the text ends as stored", async () => {
    const held = new Serve({ held: true })
    await held.start()
    try {
      const c = new Client({ baseUrl: held.base, token: TOKEN })
      const ack = await c.chat("a long one please")
      let text = ""
      let restarts = 0
      let last
      for await (const ch of c.readMessage(ack.session_id, ack.reply_id)) {
        if (ch.restart) restarts += 1
        text = ch.restart ? ch.text : text + ch.text
        last = ch
        if (!held.stalled && text.length > 20) {
          writeFileSync(held.hold, "")  // the disk stalls: what is sent from now on is not written
          held.stalled = true
          held.sentAtStall = text.length
        }
        if (held.stalled && !held.restarted && text.length > held.sentAtStall + 10) {  // sent past the stall: crash
          held.restarted = true
          await held.kill()
          rmSync(held.hold, { force: true })
          await held.start()
        }
      }
      assert.ok(held.restarted)
      assert.equal(restarts, 1, "the lost tail was taken back once")
      assert.equal(last.status, "aborted")
      const stored = (await c.getSession(ack.session_id)).messages.find((m) => m.msg_id === ack.reply_id)
      assert.equal(text, stored.content)
    } finally {
      await held.close()
    }
  })
})
