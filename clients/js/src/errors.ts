// Errors that say whose fault it is: the server's refusal (ApiError, with the
// API's own code: docs/HTTP.md, docs/PROTOCOL.md), or the connection's.

/** The server refused a request: `status` (HTTP; 0 over the WebSocket), the
 * API's `code` (`unknown_session`, `reply_running`...) and its message. */
export class ApiError extends Error {
  readonly status: number
  readonly code: string
  constructor(status: number, code: string, message: string) {
    super(`${code}: ${message}`)
    this.name = "ApiError"
    this.status = status
    this.code = code
  }
}

/** The connection is gone (a request in flight when it went, or one made while
 * offline): nothing says whether the server carried it out; the client
 * reconnects by itself. */
export class ConnectionLost extends Error {
  constructor(message = "connection lost") {
    super(message)
    this.name = "ConnectionLost"
  }
}

/** Read an HTTP refusal's `{"error": {code, message}}` body. */
export async function refused(r: Response): Promise<ApiError> {
  let code = "http_" + r.status
  let message = r.statusText || "refused"
  try {
    const body = (await r.json()) as { error?: { code?: string; message?: string } }
    if (body?.error?.code) code = body.error.code
    if (body?.error?.message) message = body.error.message
  } catch {
    /* not our JSON (a proxy's page): the status says it */
  }
  return new ApiError(r.status, code, message)
}
