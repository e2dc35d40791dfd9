// The API's shapes (docs/API.md, docs/HTTP.md; the server's msgspec types in
// server/edge/apitypes.py, what /v1/openapi.json is made from). The server
// only adds fields within a major version: a client ignores what it does not know.

export interface ProjectRef { id: string; name: string; path: string; path_missing: boolean }

/** A listed session: the 17 row fields, `damaged` for a quarantined one, `owner` in an admin's answers. */
export interface SessionRow {
  id: string
  agent_id: string
  source: string
  title: string
  status: string
  created_at: number
  updated_at: number
  pinned: boolean
  unread: boolean
  archived: boolean
  project_id: string | null
  message_count: number
  _user_titled: boolean
  _auto_titled: boolean
  _title_gen_count: number
  preview: string | null
  project: ProjectRef | null
  damaged?: string
  owner?: string
}

export interface SessionList { type: "sessions_list"; rows: SessionRow[]; total: number; rev: string; relist: boolean }

/** A change of the session list: a `session_created`, `session_updated` or `session_deleted` push. */
export interface Change { type: "session_created" | "session_updated" | "session_deleted"; data: Record<string, any> }

export interface SessionChanges { type: "sessions_changes"; since: string; rev: string; changes: Change[] }

export type MessageStatus = "pending" | "running" | "done" | "error" | "aborted"

export interface Message {
  msg_id: string
  role: string
  kind: string
  parent_id: string | null
  caller: string | null
  status: MessageStatus
  content: string
  started_at: number | null
  last_update_at: number
  created_at: number
  seq: number
  metadata: Record<string, any>
  error: string | null
  tokens: Record<string, number> | null
  siblings?: string[]
}

export interface SessionLoaded { session: SessionRow; messages: Message[]; head: string | null; seq: number; durable_seq: number }

export interface ChatAck { session_id: string; msg_id: string; reply_id: string }

export interface ReplyOpened { session_id: string; reply_id: string; stream: string; producer_timeout: number }

/** A `msg_update` push (docs/PROTOCOL.md): `content = content[:offset] + content_delta`. */
export interface MsgUpdate {
  session_id: string
  msg_id: string
  seq: number
  offset: number
  content_delta: string
  status: MessageStatus
  durable_seq: number
  tree?: unknown
  tokens?: Record<string, number>
  error?: string
  aborted_reason?: string
  more?: boolean
}

export const TERMINAL: ReadonlySet<string> = new Set(["done", "error", "aborted"])
