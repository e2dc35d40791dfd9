// The WebSocket client (docs/PROTOCOL.md): one connection, kept up by itself
// (reconnect with backoff, a heartbeat that notices a dead network), requests
// that always settle, the session list kept live and resumed exactly with
// `since` after a reconnect, and message subscriptions resumed exactly by
// offset: each subscriber sees one gapless text.
import { ApiError, ConnectionLost } from "./errors.js"
import type { Change, MsgUpdate, SessionChanges, SessionList, SessionRow } from "./types.js"
import { TERMINAL } from "./types.js"

/** The protocol's major version, offered as a subprotocol. */
export const PROTOCOL = "sessionlog.v1"

export interface SocketOptions {
  /** `ws://host:port/ws` (a page: relative to its own address). */
  url: string
  token: string
  /** The WebSocket class (default: the global one; Node 20: `--experimental-websocket` or the `ws` package). */
  WebSocket?: typeof globalThis.WebSocket
  /** Silence after which a ping goes out; twice it is a lost connection (ms, default 15000). */
  heartbeatMs?: number
  /** A request without an answer for this long is refused (ms, default 60000). */
  requestTimeoutMs?: number
  /** What `list_sessions` asks for (default: archived ones too, 1000 rows). */
  listQuery?: Record<string, unknown>
  /** Follow the session list (default true). */
  followSessions?: boolean
}

export interface MessageSubscription {
  readonly sessionId: string
  readonly msgId: string
  /** The characters delivered so far (the offset a resume asks from). */
  readonly offset: number
  /** Its last status; a terminal one ends the subscription. */
  readonly status: string
  close(): void
}

type Events = {
  open: () => void
  close: (info: { everOpened: boolean; failedOpens: number }) => void
  /** A push that is not a request's answer (msg_update included), after the client's own bookkeeping. */
  push: (frame: { type: string; data: any }) => void
  /** The session list changed (`sessions` holds it). */
  sessions: () => void
  /** An error the server sent outside any request. */
  error: (e: ApiError) => void
}

interface Waiter { resolve: (v: any) => void; reject: (e: Error) => void }

interface Sub {
  sessionId: string
  msgId: string
  offset: number
  status: string
  onUpdate: (u: MsgUpdate) => void
  closed: boolean
}

/** The token in a subprotocol (never in a URL: a proxy's log would keep it): UTF-8, unpadded base64url. */
export function tokenProtocol(token: string): string {
  let bin = ""
  for (const b of new TextEncoder().encode(token)) bin += String.fromCharCode(b)
  return "sessionlog.token." + btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "")
}

export class SocketClient {
  readonly url: string
  online = false
  everOpened = false
  failedOpens = 0
  /** The session list (id → row), kept live. */
  sessions = new Map<string, SessionRow>()
  /** The list's position (`rev`): a reconnect asks for what changed after it. */
  rev: string | null = null

  #opts: Required<Omit<SocketOptions, "WebSocket" | "listQuery">> & Pick<SocketOptions, "listQuery">
  #WS: typeof globalThis.WebSocket
  #ws: WebSocket | null = null
  #token: string
  #backoff = 250
  #nextId = 1
  #waiting = new Map<number, Waiter>()
  #subs = new Map<string, Sub>()
  #listeners: { [K in keyof Events]: Set<Events[K]> } = {
    open: new Set(), close: new Set(), push: new Set(), sessions: new Set(), error: new Set(),
  }
  #lastFrameAt = 0
  #timer: ReturnType<typeof setInterval> | null = null
  #retry: ReturnType<typeof setTimeout> | null = null
  #stopped = false
  #lose: (() => void) | null = null

  constructor(opts: SocketOptions) {
    this.url = opts.url
    this.#token = opts.token
    this.#WS = opts.WebSocket ?? globalThis.WebSocket
    this.#opts = { heartbeatMs: 15000, requestTimeoutMs: 60000, followSessions: true, ...opts }
  }

  /** Listen; returns the function that stops listening. */
  on<K extends keyof Events>(type: K, fn: Events[K]): () => void {
    this.#listeners[type].add(fn)
    return () => this.#listeners[type].delete(fn)
  }

  #emit<K extends keyof Events>(type: K, ...args: Parameters<Events[K]>): void {
    for (const fn of this.#listeners[type]) (fn as (...a: Parameters<Events[K]>) => void)(...args)
  }

  /** Connect, and keep reconnecting until `close()`. */
  start(): this {
    this.#stopped = false
    if (!this.#ws && !this.#retry) this.#connect()  // (started already: nothing more)
    const hb = this.#opts.heartbeatMs
    this.#timer ??= setInterval(() => {
      if (!this.online) return
      const quiet = Date.now() - this.#lastFrameAt
      if (quiet > 2 * hb) this.#lose?.()
      else if (quiet > hb) this.request("list_running").catch(() => { /* lost: handled by lose */ })
    }, hb / 3)
    return this
  }

  /** Stop for good: the connection closes, requests in flight are refused. */
  close(): void {
    this.#stopped = true
    if (this.#timer) clearInterval(this.#timer)
    if (this.#retry) clearTimeout(this.#retry)
    this.#timer = this.#retry = null
    this.#lose?.()
  }

  /** Drop the connection now (e.g. the browser went offline): it reconnects. */
  drop(): void {
    this.#lose?.()
  }

  /** Reconnect at once (a new token was given), not after the backoff. */
  reconnect(): void {
    if (this.#stopped) return
    if (this.#retry) clearTimeout(this.#retry)
    this.#retry = null
    this.#backoff = 0
    if (this.#lose) this.#lose()
    else this.#connect()
  }

  /** Change the credential (the next connection uses it). */
  setToken(token: string): void {
    this.#token = token
  }

  #connect(): void {
    const ws = new this.#WS(this.url, [PROTOCOL, tokenProtocol(this.#token)])
    let opened = false
    this.#ws = ws
    ws.onopen = () => {
      this.#lastFrameAt = Date.now()
      opened = true
      this.everOpened = true
      this.failedOpens = 0
      this.online = true
      this.#backoff = 250
      for (const s of this.#subs.values()) this.#subscribe(s)
      if (this.#opts.followSessions) this.refreshSessions().catch(() => { /* lost: retried on the next open */ })
      this.#emit("open")
    }
    ws.onmessage = (ev: MessageEvent) => {
      this.#lastFrameAt = Date.now()
      this.#onFrame(JSON.parse(String(ev.data)))
    }
    const lose = () => {
      if (this.#ws !== ws) return
      this.#ws = null
      this.#lose = null
      try { ws.close() } catch { /* closing already */ }
      this.online = false
      for (const [, w] of this.#waiting) w.reject(new ConnectionLost())
      this.#waiting.clear()
      if (!opened) this.failedOpens += 1
      this.#emit("close", { everOpened: this.everOpened, failedOpens: this.failedOpens })
      if (this.#stopped) return
      this.#retry = setTimeout(() => { this.#retry = null; if (!this.#stopped) this.#connect() }, this.#backoff)
      this.#backoff = Math.min(Math.max(this.#backoff * 2, 250), 5000)
    }
    ws.onclose = lose
    // (a browser follows an error with a close; Node 20's WebSocket may not, for a refused connection)
    ws.onerror = lose
    this.#lose = lose
  }

  /** One action: its answer's `data`, an ApiError with the server's code, or
   * ConnectionLost. Always settles (at the latest after `requestTimeoutMs`). */
  request<T = any>(action: string, fields: Record<string, unknown> = {}): Promise<T> {
    return new Promise((resolve, reject) => {
      if (!this.online || !this.#ws) return reject(new ConnectionLost("offline: reconnecting…"))
      const id = this.#nextId++
      const timer = setTimeout(() => {
        if (this.#waiting.delete(id)) reject(new ConnectionLost("no answer from the server"))
      }, this.#opts.requestTimeoutMs)
      this.#waiting.set(id, {
        resolve: (v) => { clearTimeout(timer); resolve(v) },
        reject: (e) => { clearTimeout(timer); reject(e) },
      })
      this.#ws.send(JSON.stringify({ action, request_id: id, ...fields }))
    })
  }

  #onFrame(f: { type: string; request_id?: number; data: any }): void {
    let rid = f.request_id
    if (f.type === "error" && rid === undefined && this.#waiting.size) {
      // A frame the server could not read (too large) is answered without
      // its id; frames are answered in order, so it is the oldest request's.
      rid = this.#waiting.keys().next().value
    }
    const waiter = rid !== undefined ? this.#waiting.get(rid) : undefined
    if (waiter) {
      this.#waiting.delete(rid!)
      if (f.type === "error") waiter.reject(new ApiError(0, f.data.code, f.data.message))
      else waiter.resolve(f.data)
      return
    }
    if (f.type === "msg_update") this.#update(f.data as MsgUpdate)
    else if (f.type === "session_created" || f.type === "session_updated" || f.type === "session_deleted") {
      this.#applyChange(f as Change)
      this.#emit("sessions")
    } else if (f.type === "error") this.#emit("error", new ApiError(0, f.data.code, f.data.message))
    this.#emit("push", f)
  }

  // -- the session list ---------------------------------------------------------

  #applyChange(ch: Change): void {
    const d = ch.data
    if (typeof d.rev === "string") this.rev = d.rev
    if (ch.type === "session_created") this.sessions.set(d.session.id, d.session)
    else if (ch.type === "session_deleted") this.sessions.delete(d.session_id)
    else {
      const row = this.sessions.get(d.id)
      const { rev: _rev, ...fields } = d
      if (row) Object.assign(row, fields)
    }
  }

  /** Ask for the list: after a reconnect only what changed since `rev` (exact
   * resume), or all of it when the server cannot say (a restart). */
  async refreshSessions(): Promise<void> {
    const query = { include_archived: true, limit: 1000, ...this.#opts.listQuery }
    const list = await this.request<SessionList | SessionChanges>("list_sessions",
                                                                   this.rev ? { ...query, since: this.rev } : query)
    if ("changes" in list) for (const ch of list.changes) this.#applyChange(ch)
    else this.sessions = new Map(list.rows.map((r) => [r.id, r]))
    this.rev = list.rev
    this.#emit("sessions")
  }

  // -- message subscriptions ------------------------------------------------------

  /** Follow a message from `offset` (the characters you have). `onUpdate` gets
   * each `msg_update` trimmed to exactly what is new (`offset` where its
   * `content_delta` starts: the end of what was delivered), across
   * reconnects, until a terminal status. Apply each as the protocol says,
   * `content = content.slice(0, offset) + content_delta`: after a server
   * crash, a tail that was delivered but never durable is taken back by an
   * update whose `offset` is below what was delivered. Subscribing again to the same message
   * with another offset replaces the subscription. */
  subscribeMessage(sessionId: string, msgId: string,
                   opts: { offset?: number; onUpdate: (u: MsgUpdate) => void }): MessageSubscription {
    const key = `${sessionId}/${msgId}`
    const had = this.#subs.get(key)
    const offset = opts.offset ?? 0
    if (had && had.offset === offset) {
      had.onUpdate = opts.onUpdate
      return this.#handle(key, had)
    }
    if (had) had.closed = true
    const s: Sub = { sessionId, msgId, offset, status: "running", onUpdate: opts.onUpdate, closed: false }
    this.#subs.set(key, s)
    if (this.online) this.#subscribe(s)
    return this.#handle(key, s)
  }

  /** Is this message followed? */
  isSubscribed(sessionId: string, msgId: string): boolean {
    return this.#subs.has(`${sessionId}/${msgId}`)
  }

  #handle(key: string, s: Sub): MessageSubscription {
    const client = this
    return {
      sessionId: s.sessionId, msgId: s.msgId,
      get offset() { return s.offset },
      get status() { return s.status },
      close() {
        if (s.closed) return
        s.closed = true
        if (client.#subs.get(key) === s) client.#subs.delete(key)
        if (client.online) client.request("unsubscribe_msg", { session_id: s.sessionId, msg_id: s.msgId }).catch(() => {})
      },
    }
  }

  #subscribe(s: Sub): void {
    this.request("subscribe_msg", { session_id: s.sessionId, msg_id: s.msgId, offset: s.offset }).catch((e) => {
      if (this.#subs.get(`${s.sessionId}/${s.msgId}`) !== s) return
      if (e instanceof ApiError && e.code === "bad_offset" && s.offset > 0) {
        // The server has less than was delivered: it crashed before the tail
        // shown was durable (docs/PROTOCOL.md: a progress update may be ahead
        // of durable_seq). Read it all again: the next update starts at 0 and
        // takes the lost tail back (content = content[:offset] + delta).
        s.offset = 0
        this.#subscribe(s)
        return
      }
      // Unknown (deleted) or refused: the subscription ends; lost: resubscribed on the next open.
      if (e instanceof ApiError) {
        this.#subs.delete(`${s.sessionId}/${s.msgId}`)
        s.closed = true
        this.#emit("error", e)
      }
    })
  }

  #update(u: MsgUpdate): void {
    const key = `${u.session_id}/${u.msg_id}`
    const s = this.#subs.get(key)
    if (!s || s.closed) return
    const end = u.offset + u.content_delta.length
    if (u.offset > s.offset) {  // a gap (cannot happen on one connection): ask again from what we have
      this.#subscribe(s)
      return
    }
    const delta = u.content_delta.slice(s.offset - u.offset)
    if (end < s.offset) {
      if (!TERMINAL.has(u.status)) return  // all of it delivered already
    }
    const fresh: MsgUpdate = { ...u, offset: s.offset, content_delta: end < s.offset ? "" : delta }
    s.offset = Math.max(s.offset, end)
    s.status = u.status
    if (TERMINAL.has(u.status)) {
      s.closed = true
      this.#subs.delete(key)
    }
    s.onUpdate(fresh)
  }
}
