// The HTTP client: sessions and messages under /v1/ (docs/HTTP.md), a
// message's text read with exact resume (reading.ts), the session list
// followed with `since`, and the reply producer (producer.ts).
import { ApiError, refused } from "./errors.js"
import { Reply, type ReplyOptions } from "./producer.js"
import { readText, type Chunk, type ReadOptions, type Transport } from "./reading.js"
import type { Change, ChatAck, ReplyOpened, SessionChanges, SessionList, SessionLoaded, SessionRow } from "./types.js"

export interface ClientOptions {
  /** The server's address, e.g. `http://127.0.0.1:8765` (with its path prefix if it has one). */
  baseUrl: string
  /** The credential a WebSocket would carry: the server's token, a user's, or a JWT. */
  token: string
  /** Headers sent with every request (a proxy's, a tenant's). */
  headers?: Record<string, string>
  fetch?: typeof globalThis.fetch
}

export interface ListQuery {
  include_archived?: boolean
  archived?: boolean
  offset?: number
  limit?: number
  agent_id?: string
  source?: string
  status?: string
  pinned?: boolean
  unread?: boolean
  project_id?: string
}

export class Client implements Transport {
  readonly baseUrl: string
  readonly fetch: typeof globalThis.fetch
  #token: string
  #extra: Record<string, string>

  constructor(opts: ClientOptions) {
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "")
    this.#token = opts.token
    this.#extra = opts.headers ?? {}
    this.fetch = opts.fetch ?? globalThis.fetch.bind(globalThis)
  }

  /** The headers of every request: the credential, `Accept`, the extra ones. */
  headers = (): Record<string, string> => ({ ...this.#extra, Authorization: `Bearer ${this.#token}` })

  url(path: string): string {
    return `${this.baseUrl}/v1/${path.replace(/^\/+/, "")}`
  }

  /** One API request: its JSON answer, or an ApiError with the server's code. */
  async request<T>(method: string, path: string, body?: unknown, query?: Record<string, unknown>): Promise<T> {
    const url = new URL(this.url(path))
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) url.searchParams.set(k, String(v))
    const headers: Record<string, string> = { ...this.headers() }
    if (body !== undefined) headers["Content-Type"] = "application/json"
    const r = await this.fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) })
    if (!r.ok) throw await refused(r)
    return (r.status === 204 ? undefined : await r.json()) as T
  }

  // -- sessions ------------------------------------------------------------------

  listSessions(query: ListQuery = {}): Promise<SessionList> {
    return this.request("GET", "sessions", undefined, query as Record<string, unknown>)
  }

  /** The list's changes after `since` (a `rev`), or the whole list (`relist`) when the server cannot say them exactly. */
  sessionChanges(since: string, query: ListQuery = {}): Promise<SessionChanges | SessionList> {
    return this.request("GET", "sessions", undefined, { ...query, since })
  }

  /** The session list, kept live: first every row (as `session_created`
   * changes, `relist` first), then each change as it is seen, asked for with
   * `since` every `intervalMs`. A restart of the server (its `rev` unknown)
   * starts again with `relist` and every row. Ends when `signal` aborts. */
  async *followSessions(opts: { intervalMs?: number; signal?: AbortSignal } & ListQuery = {}):
      AsyncGenerator<Change | { type: "relist"; data: { rows: SessionRow[] } }> {
    const { intervalMs = 1000, signal, ...query } = opts
    let rev: string | null = null
    let delay = 100
    while (!signal?.aborted) {
      let answer: SessionList | SessionChanges
      try {
        answer = rev === null ? await this.listSessions({ include_archived: true, ...query })
                              : await this.sessionChanges(rev, { include_archived: true, ...query })
        delay = 100
      } catch (e) {
        if (e instanceof ApiError && e.status < 500 && e.status !== 429) throw e
        await pause(delay, signal)
        delay = Math.min(delay * 2, 5000)
        continue
      }
      if (answer.type === "sessions_list") yield { type: "relist", data: { rows: answer.rows } }
      else for (const ch of answer.changes) yield ch
      rev = answer.rev
      await pause(intervalMs, signal)
    }
  }

  async createSession(fields: { title?: string; project_id?: string; agent_id?: string; source?: string } = {}):
      Promise<SessionRow> {
    return (await this.request<{ session: SessionRow }>("POST", "sessions", fields)).session
  }

  getSession(sessionId: string, opts: { msg_id?: string } = {}): Promise<SessionLoaded> {
    return this.request("GET", `sessions/${enc(sessionId)}`, undefined, opts)
  }

  async updateSession(sessionId: string, patch: { title?: string; regenerate_title?: boolean; archived?: boolean;
                      pinned?: boolean; unread?: boolean; project_id?: string }): Promise<Record<string, unknown>> {
    return (await this.request<{ changed: Record<string, unknown> }>("PATCH", `sessions/${enc(sessionId)}`, patch)).changed
  }

  async deleteSession(sessionId: string): Promise<void> {
    await this.request("DELETE", `sessions/${enc(sessionId)}`)
  }

  /** A finished message, durable when this resolves (a user's by default). */
  async addMessage(sessionId: string, content: string, opts: { role?: string; kind?: string; parent_id?: string;
                   metadata?: Record<string, unknown> } = {}): Promise<string> {
    return (await this.request<{ msg_id: string }>("POST", `sessions/${enc(sessionId)}/messages`,
                                                   { content, ...opts })).msg_id
  }

  /** A user's message and the server's own agent's reply (a new session without `session_id`). */
  chat(content: string, opts: { session_id?: string; project_id?: string; agent_id?: string; source?: string } = {}):
      Promise<ChatAck> {
    return this.request("POST", "chat", { content, ...opts })
  }

  /** A user's Stop: the reply ends `aborted`, "stopped by user", wherever it streams. */
  async stop(sessionId: string, msgId: string): Promise<void> {
    await this.request("POST", `sessions/${enc(sessionId)}/messages/${enc(msgId)}/stop`)
  }

  // -- streams -------------------------------------------------------------------

  /** A message's text from `offset` to its end, live by default (SSE at the
   * tail; `live: "long-poll"` where a proxy buffers SSE), resumed by itself
   * after a cut: one gapless text. */
  readMessage(sessionId: string, msgId: string, opts: ReadOptions = {}): AsyncGenerator<Chunk> {
    return readText(this.url(`stream/sessions/${enc(sessionId)}/messages/${enc(msgId)}`), this, opts)
  }

  /** Open a reply for this backend to produce (docs/HTTP.md: Producing a reply
   * from outside the server): its placeholder is durable when this resolves. */
  async reply(sessionId: string, opts: ReplyOptions = {}): Promise<Reply> {
    const { intervalMs, producerId, ...fields } = opts
    const opened = await this.request<ReplyOpened>("POST", `sessions/${enc(sessionId)}/replies`, fields)
    return new Reply(this, opened, { intervalMs, producerId })
  }

  /** Run `body` as a reply's producer: `done` when it returns, `error` (with its
   * message) when it throws (and the error goes on), nothing more when a Stop ended it. */
  async produce<T>(sessionId: string, body: (reply: Reply) => Promise<T>, opts: ReplyOptions = {}): Promise<T> {
    const reply = await this.reply(sessionId, opts)
    return reply.run(body)
  }
}

export function enc(s: string): string {
  return encodeURIComponent(s)
}

function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms)
    function done() { clearTimeout(t); signal?.removeEventListener("abort", done); resolve() }
    signal?.addEventListener("abort", done, { once: true })
  })
}
