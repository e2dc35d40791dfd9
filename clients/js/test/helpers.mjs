// A real `sessionlog serve` for the tests (a subprocess on 127.0.0.1, port
// 0), a TCP proxy that can cut every connection through it, and waiting on
// events (never on time alone).
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import net from "node:net"
import { tmpdir } from "node:os"
import path from "node:path"
import { fileURLToPath } from "node:url"

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..")
const PYTHON = process.env.SESSIONLOG_PYTHON || "python3"
export const TOKEN = "js-client-test-token"

/** A TCP proxy on 127.0.0.1 to `target()`'s port; `cut()` drops every connection through it. */
export async function cuttingProxy(target) {
  const pairs = new Set()
  const server = net.createServer((a) => {
    const b = net.connect(target(), "127.0.0.1")
    const pair = [a, b]
    pairs.add(pair)
    a.pipe(b); b.pipe(a)
    const end = () => { a.destroy(); b.destroy(); pairs.delete(pair) }
    a.on("error", end); b.on("error", end); a.on("close", end); b.on("close", end)
  })
  await new Promise((r) => server.listen(0, "127.0.0.1", r))
  return {
    port: server.address().port,
    cut() {
      const n = pairs.size
      for (const [a, b] of pairs) { a.resetAndDestroy?.() ?? a.destroy(); b.destroy() }
      pairs.clear()
      return n
    },
    close: () => new Promise((r) => { for (const [a, b] of pairs) { a.destroy(); b.destroy() } server.close(r) }),
  }
}

/** `sessionlog serve` in a process of its own; `restart()` keeps its data and port. */
export class Serve {
  /** `held`: on a disk whose writes wait while the file `this.hold` exists (tests/held_serve.py). */
  constructor({ extra = [], allowedHosts = [], held = false } = {}) {
    this.dir = mkdtempSync(path.join(tmpdir(), "sl-js-"))
    this.held = held
    this.hold = path.join(this.dir, "hold")
    this.extra = extra
    this.allowedHosts = allowedHosts
    this.port = 0
    this.proc = null
  }

  get base() { return `http://127.0.0.1:${this.port}` }
  get ws() { return `ws://127.0.0.1:${this.port}/ws` }

  async start() {
    const runner = this.held ? [path.join(ROOT, "tests", "held_serve.py")]
                             : ["-m", "sessionlog_store"]
    const args = [...runner, "serve", "--root", path.join(this.dir, "data"), "--port", String(this.port),
                  "--token", TOKEN, "--agent-speed", "25", ...this.allowedHosts.flatMap((h) => ["--allowed-host", h]),
                  ...this.extra]
    const proc = spawn(PYTHON, args, { env: { ...process.env, PYTHONPATH: ROOT, PYTHONUNBUFFERED: "1",
                                              SESSIONLOG_HOLD: this.hold },
                                       stdio: ["ignore", "pipe", "pipe"] })
    this.proc = proc
    let err = ""
    proc.stderr.on("data", (d) => { err = (err + d).slice(-4000) })
    this.port = await new Promise((resolve, reject) => {
      let out = ""
      proc.stdout.on("data", (d) => {
        out += d
        const m = /serving http:\/\/127\.0\.0\.1:(\d+)/.exec(out)
        if (m) resolve(Number(m[1]))
      })
      proc.on("exit", (code) => reject(new Error(`serve ended (${code}) before serving: ${err}`)))
    })
    return this
  }

  async kill(signal = "SIGKILL") {
    const p = this.proc
    if (!p || p.exitCode !== null || p.signalCode !== null) return
    const ended = new Promise((r) => p.once("exit", r))
    p.kill(signal)
    await ended
  }

  async restart(signal = "SIGKILL") {
    await this.kill(signal)
    await this.start()
  }

  async close() {
    await this.kill("SIGTERM")
    rmSync(this.dir, { recursive: true, force: true })
  }
}

/** Wait until `pred()` holds (checked on every tick of `every` ms), at most `within` ms. */
export async function until(pred, { within = 30000, every = 20, what = "condition" } = {}) {
  const deadline = Date.now() + within
  for (;;) {
    if (await pred()) return
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, every))
  }
}
