// A chat on the Vercel AI SDK's own React hook (useChat) and default
// transport: nothing here is sessionlog's but the endpoint's URL (and the
// credential sent to it). Resumable: `resume: true` re-joins a reply that
// streams while the page reloads; the chat's id is kept in the address.
import { useChat } from "@ai-sdk/react"
import { DefaultChatTransport } from "ai"
import { useMemo, useState } from "react"
import { createRoot } from "react-dom/client"

const params = new URLSearchParams(location.search)
const API = params.get("api") ?? "/api/chat"
const HEADERS = params.get("token") ? { Authorization: `Bearer ${params.get("token")}` } : {}

function chatId() {
  let id = params.get("chat")
  if (!id) {
    id = crypto.randomUUID().replaceAll("-", "")
    params.set("chat", id)
    history.replaceState(null, "", `?${params}`)
  }
  return id
}

function Part({ part }) {
  if (part.type === "text") return <p className="text">{part.text}</p>
  if (part.type === "dynamic-tool" || part.type.startsWith("tool-")) {
    const shown = part.output ?? part.errorText ?? part.input
    return (
      <details className="tool" data-state={part.state}>
        <summary>{part.toolName ?? part.type.slice(5)}</summary>
        <pre>{typeof shown === "string" ? shown : JSON.stringify(shown, null, 2)}</pre>
      </details>
    )
  }
  return null
}

function Chat({ id, initial }) {
  const [input, setInput] = useState("")
  const transport = useMemo(() => new DefaultChatTransport({ api: API, headers: HEADERS }), [])
  const { messages, sendMessage, status, error } = useChat({ id, messages: initial, resume: true, transport })
  return (
    <main>
      <ol id="messages">
        {messages.map((m) => (
          <li key={m.id} className={`msg ${m.role}`} data-id={m.id}>
            {m.parts.map((part, i) => <Part key={i} part={part} />)}
          </li>
        ))}
      </ol>
      <p id="status" data-status={status}>{status}</p>
      {error && <p id="error">{error.message}</p>}
      <form onSubmit={(e) => {
        e.preventDefault()
        if (input.trim()) sendMessage({ text: input })
        setInput("")
      }}>
        <input id="input" value={input} onChange={(e) => setInput(e.target.value)} placeholder="Say something…" />
        <button type="submit" disabled={status === "streaming" || status === "submitted"}>Send</button>
      </form>
    </main>
  )
}

// The chat's messages so far (the AI SDK leaves loading them to the app), then the hook.
const id = chatId()
const answer = await fetch(`${API}/${encodeURIComponent(id)}/messages`, { headers: HEADERS })
createRoot(document.getElementById("root")).render(<Chat id={id} initial={answer.ok ? await answer.json() : []} />)
