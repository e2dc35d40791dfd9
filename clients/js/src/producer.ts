// Producing a reply from a backend (docs/HTTP.md: Producing a reply from
// outside the server): its placeholder opened, the text appended through the
// Durable Streams protocol's idempotent producer (@durable-streams/client's
// IdempotentProducer: batched at the durability interval, exactly once across
// retries), token counts, the finalize (`done`; `error` with a message), and a
// user's Stop learnt within one interval by following the reply's own stream.
import { DurableStream, IdempotentProducer } from "@durable-streams/client"
import { readText, type Transport } from "./reading.js"
import type { ReplyOpened } from "./types.js"

export interface ReplyOptions {
  /** `llm_reply` (the default), `tool_call` or `agentic_fn`. */
  kind?: string
  parent_id?: string
  caller?: string
  role?: string
  metadata?: Record<string, unknown>
  /** How long writes are gathered into one append (ms; default 250, the durability bound). */
  intervalMs?: number
  /** The producer's stable id (default: a random one per reply). */
  producerId?: string
}

/** How a reply ended when this producer did not end it (a Stop, the producer timeout). */
export interface Ended { status: string; reason: string }

interface Api extends Transport {
  url(path: string): string
  request<T>(method: string, path: string, body?: unknown): Promise<T>
  reply(sessionId: string, opts?: ReplyOptions): Promise<Reply>
}

export class Reply {
  readonly sessionId: string
  readonly replyId: string
  /** The reply's Durable Streams URL. */
  readonly stream: string
  /** Aborted when the reply ended without this producer (a user's Stop, the
   * producer timeout): stop the model then. Writes are dropped from then on. */
  readonly stopped: AbortSignal
  /** Set with `stopped`: how the reply ended. */
  ended: Ended | null = null

  #api: Api
  #stop = new AbortController()
  #producer: IdempotentProducer
  #closeError: string | null = null
  #closing = false
  #watching: Promise<void>

  constructor(api: Api, opened: ReplyOpened, opts: { intervalMs?: number; producerId?: string } = {}) {
    this.#api = api
    this.sessionId = opened.session_id
    this.replyId = opened.reply_id
    this.stream = new URL(opened.stream, api.url("")).href
    this.stopped = this.#stop.signal
    // The close of an error carries its status and message: a header only
    // the last request (the one with Stream-Closed) gets.
    const fetchWithClose: typeof globalThis.fetch = (input, init) => {
      const h = new Headers(init?.headers)
      if (h.get("Stream-Closed") === "true" && this.#closeError !== null) {
        h.set("Stream-Status", "error")
        h.set("Stream-Error", this.#closeError)
      }
      return api.fetch(input, { ...init, headers: h })
    }
    const handle = new DurableStream({ url: this.stream, headers: api.headers(),
                                       contentType: "text/plain; charset=utf-8", fetch: fetchWithClose })
    this.#producer = new IdempotentProducer(handle, opts.producerId ?? crypto.randomUUID(), {
      lingerMs: opts.intervalMs ?? 250, maxInFlight: 1, fetch: fetchWithClose,
      onError: (e) => this.#refused(e),
    })
    this.#watching = this.#watch()
  }

  /** Buffer text: sent with the interval's append (dropped once stopped). */
  write(text: string): void {
    if (text && !this.stopped.aborted && !this.#closing) this.#producer.append(text)
  }

  /** The token totals so far (not increments). */
  async tokens(tokens: { input: number; output: number }): Promise<void> {
    if (this.stopped.aborted) return
    await this.#api.request("PATCH", `sessions/${encodeURIComponent(this.sessionId)}/replies/${encodeURIComponent(this.replyId)}`,
                            { tokens })
  }

  /** A tool call this reply makes, as a message of its own under it (its
   * arguments in its metadata, as the server's own agents record theirs):
   * write its result into it and close it. */
  async toolCall(tool: string, opts: { callId: string; arguments?: string; metadata?: Record<string, unknown> }):
      Promise<Reply> {
    // What this reply wrote before the call goes first (the call's place in the text)
    if (!this.stopped.aborted) await this.#producer.flush().catch((e) => this.#refused(e))
    return this.#api.reply(this.sessionId, {
      kind: "tool_call", caller: this.replyId, parent_id: this.replyId,
      metadata: { ...opts.metadata, tool, tool_call_id: opts.callId, arguments: opts.arguments ?? "" },
    })
  }

  /** Send what is buffered and end the reply: `done`, or `error` with `error`
   * as its message. Does nothing once it was stopped. */
  async close(opts: { error?: string } = {}): Promise<void> {
    if (this.#closing) return
    this.#closing = true
    try {
      if (!this.stopped.aborted) {
        if (opts.error !== undefined) this.#closeError = opts.error.replace(/[\r\n]+/g, " ").slice(0, 1000)
        try {
          await this.#producer.close()
        } catch (e) {
          this.#refused(e)
          if (!this.stopped.aborted) throw e
        }
      }
    } finally {
      this.#stop.abort(new Error("closed"))
      await this.#watching
    }
  }

  /** Run `body`, then close: `done` when it returns, `error` when it throws (the error goes on). */
  async run<T>(body: (reply: Reply) => Promise<T>): Promise<T> {
    let result: T
    try {
      result = await body(this)
    } catch (e) {
      await this.close({ error: e instanceof Error ? `${e.name}: ${e.message}` : String(e) })
      throw e
    }
    await this.close()
    return result
  }

  /** A refused append says the reply ended (409: stopped, swept). */
  #refused(e: unknown): void {
    const status = (e as { status?: number }).status
    if (status === 409 || (e as Error).name === "StreamClosedError") this.#ended({ status: "aborted", reason: String((e as Error).message) })
  }

  #ended(how: Ended): void {
    if (this.stopped.aborted) return
    this.ended = how
    this.#stop.abort(new Error(`reply ended: ${how.status} ${how.reason}`))
  }

  /** Follow the reply's own stream from its end: a closure this producer did
   * not make is a Stop (or the producer timeout). */
  async #watch(): Promise<void> {
    try {
      for await (const c of readText(this.stream, this.#api, { offset: "now", live: "sse", signal: this.stopped })) {
        if (c.closed && !this.#closing) this.#ended({ status: c.status ?? "aborted", reason: "" })
        if (c.closed) return
      }
    } catch { /* stopped, or closed by us */ }
  }
}
