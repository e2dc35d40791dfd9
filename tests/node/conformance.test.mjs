// The Durable Streams server conformance suite against one server:
// DS_BASE_URL (a live `sessionlog serve --streams-anonymous`), or, with
// DS_REFERENCE=1, the protocol's Node reference server started here.
import { afterAll } from "vitest"
import { runConformanceTests } from "@durable-streams/server-conformance-tests"
import { DurableStreamTestServer } from "@durable-streams/server"

let baseUrl = process.env.DS_BASE_URL
if (process.env.DS_REFERENCE === "1") {
  const server = new DurableStreamTestServer({ port: 0, longPollTimeout: 500 })
  baseUrl = await server.start()
  afterAll(async () => { await server.stop() })
}
if (!baseUrl) throw new Error("set DS_BASE_URL or DS_REFERENCE=1")
runConformanceTests({ baseUrl })
