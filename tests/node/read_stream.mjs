// Read a Durable Streams stream with the protocol's official TypeScript
// client (@durable-streams/client), as an app would: one JSON line on stdout
// per chunk the client hands over ({text, offset, closed}), then
// {"end": true, text, offset}. Stops once the stream is closed, or, with
// STOP_AFTER, once that many characters arrived (the reader's cut).
//   node read_stream.mjs <url> <token> <live: sse | long-poll | false> [offset]
import { stream } from "@durable-streams/client"

const [url, token, liveArg, offset] = process.argv.slice(2)
const live = liveArg === "false" ? false : liveArg
const stopAfter = process.env.STOP_AFTER ? Number(process.env.STOP_AFTER) : Infinity
const res = await stream({ url, offset: offset || undefined, live, headers: { Authorization: `Bearer ${token}` } })
let text = ""
let last = offset ?? null
await new Promise((resolve, reject) => {
  const unsubscribe = res.subscribeText(async (chunk) => {
    text += chunk.text
    last = chunk.offset
    process.stdout.write(JSON.stringify({ text: chunk.text, offset: chunk.offset, closed: chunk.streamClosed }) + "\n")
    if (chunk.streamClosed || text.length >= stopAfter || (live === false && chunk.upToDate)) {
      unsubscribe()
      res.cancel()
      resolve()
    }
  })
  res.closed?.catch?.(reject)
})
process.stdout.write(JSON.stringify({ end: true, text, offset: last }) + "\n")
process.exit(0)
