// Reading a message's text (or any text stream of the server) through the
// Durable Streams protocol's own client, with exact resume built in: a cut
// connection, a restarted server or a 5xx is read again from the last offset
// handed over, with backoff, for as long as it takes; the caller sees one
// gapless text.
import { DurableStreamError, FetchError, stream } from "@durable-streams/client"
import { ApiError } from "./errors.js"

/** A piece of the text and where it ends: pass `offset` back to resume (in
 * another process too). The last chunk of an ended message has `closed` and
 * its `status` (`done`, `error`, `aborted`). */
export interface Chunk {
  text: string
  offset: string
  closed: boolean
  status?: "done" | "error" | "aborted"
  /** The server lost a tail it had sent (it crashed before that tail was
   * durable: docs/PROTOCOL.md): this chunk starts again from the stream's
   * start. Drop the text you had: `text = chunk.restart ? chunk.text : text + chunk.text`. */
  restart?: true
}

export interface ReadOptions {
  /** Where to start: `-1` (the default) is the start, `now` the current end, else an offset handed over before. */
  offset?: string
  /** `sse` (the default) or `long-poll` to follow the tail; `false` reads what is there and ends. */
  live?: "sse" | "long-poll" | false
  signal?: AbortSignal
}

export interface Transport {
  headers: () => Record<string, string>
  fetch: typeof globalThis.fetch
}

const BACKOFF = { initialDelay: 100, maxDelay: 5000, multiplier: 2 }

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const t = setTimeout(() => { signal?.removeEventListener("abort", stop); resolve() }, ms)
    const stop = () => { clearTimeout(t); reject(signal!.reason) }
    signal?.addEventListener("abort", stop, { once: true })
  })
}

/** A refusal the server means (4xx but 408/429): said to the caller, not retried. */
function refusal(e: unknown): ApiError | null {
  const status = e instanceof FetchError ? e.status : e instanceof DurableStreamError ? e.status : undefined
  if (status === undefined || status < 400 || status >= 500 || status === 408 || status === 429) return null
  // Our `{"error": {code, message}}`: a FetchError holds it parsed (`json`)
  // or as text, a DurableStreamError in `details`.
  let body: unknown = e instanceof FetchError ? (e.json ?? e.text) : (e as DurableStreamError).details
  if (typeof body === "string") {
    try { body = JSON.parse(body) } catch { /* not our JSON */ }
  }
  const error = (body as { error?: { code?: string; message?: string } } | undefined)?.error
  return new ApiError(status, error?.code ?? `http_${status}`, error?.message ?? (e as Error).message)
}

type Item = { chunk: Chunk } | { end: true } | { error: unknown }

/** One read of the stream (one `stream()` session of the protocol's client),
 * as an async iterator of its chunks; ends with the stream's closure, with
 * catch-up's end when not live, or with an error. */
async function* once(url: string, t: Transport, offset: string, live: "sse" | "long-poll" | false,
                     signal: AbortSignal): AsyncGenerator<Item> {
  const items: Item[] = []
  let wake: (() => void) | null = null
  const push = (i: Item) => { items.push(i); wake?.(); wake = null }
  // (a controller per read: the protocol's client leaves its listeners on the signal it is given)
  const mine = new AbortController()
  const abort = () => mine.abort(signal.reason)
  signal.addEventListener("abort", abort, { once: true })
  let res
  try {
    res = await stream({ url, offset, live, headers: t.headers(), fetch: t.fetch, signal: mine.signal,
                         backoffOptions: BACKOFF, warnOnHttp: false })
  } catch (e) {
    signal.removeEventListener("abort", abort)
    throw e
  }
  const unsubscribe = res.subscribeText((c) => {
    push({ chunk: { text: c.text, offset: c.offset, closed: c.streamClosed } })
    if (c.streamClosed || (live === false && c.upToDate)) push({ end: true })
  })
  // (`closed` can settle before the last chunks reach the subscriber: the end waits for them)
  res.closed.then(() => setTimeout(() => push({ end: true }), 0), (error) => push({ error }))
  try {
    for (;;) {
      while (items.length) {
        const i = items.shift()!
        yield i
        if (!("chunk" in i)) return
      }
      await new Promise<void>((r) => { wake = r })
    }
  } finally {
    unsubscribe()
    res.cancel()
    signal.removeEventListener("abort", abort)
    mine.abort()
  }
}

/** The closure's status, which the protocol's client does not hand over: a HEAD of the ended stream says it. */
async function closure(url: string, t: Transport): Promise<Chunk["status"]> {
  const r = await t.fetch(url, { method: "HEAD", headers: t.headers() })
  const s = r.headers.get("Stream-Status")
  return s === "done" || s === "error" || s === "aborted" ? s : undefined
}

/** Read `url` from `offset` to its closure (or, not live, to its current end). */
export async function* readText(url: string, t: Transport, opts: ReadOptions = {}): AsyncGenerator<Chunk> {
  const live = opts.live === undefined ? "sse" : opts.live
  const inner = new AbortController()
  const abort = () => inner.abort(opts.signal?.reason)
  opts.signal?.addEventListener("abort", abort, { once: true })
  let offset = opts.offset ?? "-1"
  let delay = BACKOFF.initialDelay
  let delivered = false  // (a refused offset after a delivery is a tail the server lost)
  let restart = false
  try {
    for (;;) {
      let ended = false
      try {
        for await (const item of once(url, t, offset, live, inner.signal)) {
          if ("error" in item) throw item.error
          if ("end" in item) { ended = true; break }
          const c = item.chunk
          offset = c.offset
          delay = BACKOFF.initialDelay
          if (restart) c.restart = true
          if (c.closed) {
            c.status = await closure(url, t)
            yield c
            return
          }
          if (c.text || restart) {
            restart = false
            delivered = true
            yield c
          }
        }
      } catch (e) {
        if (inner.signal.aborted) throw opts.signal?.reason ?? e
        const r = refusal(e)
        if (r?.code === "bad_offset" && delivered) {
          offset = "-1"
          restart = true
        } else if (r) throw r
        ended = false  // cut: read again from the last offset
      }
      if (ended && live === false) return
      await sleep(delay * (0.5 + Math.random() / 2), inner.signal)
      delay = Math.min(delay * 2, BACKOFF.maxDelay)
    }
  } finally {
    opts.signal?.removeEventListener("abort", abort)
    inner.abort()
  }
}
