// sessionlog's page: no build step, no dependencies. One WebSocket to /ws on
// the same origin; every piece of state comes from the server (list_sessions,
// load_session, msg_update pushes, broadcasts). Re-join after a reload or a
// dropped socket: load_session, then subscribe_msg for every running message
// with the content the page already has (offset), patching on each msg_update.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const BRANDS = { wechat: "WeChat", discord: "Discord", slack: "Slack", telegram: "Telegram", whatsapp: "WhatsApp" };
const $ = (id) => document.getElementById(id);

const state = {
  ws: null, online: false, backoff: 250, nextId: 1, waiting: new Map(),
  sessions: new Map(),        // id -> row
  projects: [],
  view: "active",
  current: null,              // session id, or null for a draft
  messages: new Map(),        // msg_id -> message (current session)
  order: [],                  // msg ids of the current branch, in order
  subscribed: new Set(),
  draftProject: "default",
};
window.sessionlog = state;    // for tests and the curious

// -- the socket --------------------------------------------------------------

function connect() {
  // Relative to the page, so that it works under any path prefix (--root-path).
  const url = new URL("ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = `?token=${encodeURIComponent(TOKEN)}`;
  url.hash = "";
  const ws = new WebSocket(url.href);
  state.ws = ws;
  ws.onopen = () => { state.online = true; state.backoff = 250; showConn(); rejoinAll(); };
  ws.onmessage = (ev) => onFrame(JSON.parse(ev.data));
  ws.onclose = () => {
    if (state.ws !== ws) return;
    state.online = false; showConn();
    for (const [, p] of state.waiting) p.reject(new Error("connection lost"));
    state.waiting.clear();
    state.subscribed.clear();
    setTimeout(connect, state.backoff);
    state.backoff = Math.min(state.backoff * 2, 5000);
  };
}

function request(action, fields = {}) {
  return new Promise((resolve, reject) => {
    if (!state.online) { reject(new Error("offline")); return; }
    const id = state.nextId++;
    state.waiting.set(id, { resolve, reject });
    state.ws.send(JSON.stringify({ action, request_id: id, ...fields }));
  });
}

function onFrame(f) {
  const waiter = f.request_id !== undefined ? state.waiting.get(f.request_id) : undefined;
  if (waiter) {
    state.waiting.delete(f.request_id);
    if (f.type === "error") waiter.reject(Object.assign(new Error(f.data.message), { code: f.data.code }));
    else waiter.resolve(f.data);
    return;
  }
  if (f.data && typeof f.data.rev === "string") state.rev = f.data.rev;  // the session list's position
  switch (f.type) {
    case "msg_update": return patch(f.data);
    case "message_created": return addMessage(f.data.session_id, f.data.message);
    case "session_created": state.sessions.set(f.data.session.id, f.data.session); return renderSidebar();
    case "session_updated": {
      const row = state.sessions.get(f.data.id);
      const { rev, ...fields } = f.data;
      if (row) Object.assign(row, fields);
      renderSidebar();
      if (f.data.id === state.current) renderHeader();
      return;
    }
    case "session_deleted":
      state.sessions.delete(f.data.session_id);
      if (f.data.session_id === state.current) openDraft();
      return renderSidebar();
    case "head_moved":  // another tab switched branches: show the same branch here
      if (f.data.session_id === state.current) openSession(state.current, { keep: true });
      return;
    case "projects_list": state.projects = f.data.projects; return renderProject();
    case "error": return showError(f.data.message);
  }
}

async function rejoinAll() {
  try {
    // After a reconnect, ask only for what changed while away (exact resume of
    // the list); the server answers with a full list when it cannot.
    const list = await request("list_sessions", state.rev ? { include_archived: true, limit: 1000, since: state.rev }
                                                          : { include_archived: true, limit: 1000 });
    if (list.changes) {
      for (const ch of list.changes) onFrame(ch);
    } else {
      state.sessions = new Map(list.rows.map((r) => [r.id, r]));
    }
    state.rev = list.rev;
    renderSidebar();
    state.projects = (await request("list_projects")).projects;
    renderProject();
    const sid = state.current || new URLSearchParams(location.hash.slice(1)).get("s");
    if (sid && state.sessions.has(sid)) await openSession(sid, { keep: true });
    else if (!state.current) openDraft();
  } catch (e) { showError(e.message); }
}

// -- sessions and messages ---------------------------------------------------------

async function openSession(sid, { keep = false } = {}) {
  const had = keep && sid === state.current ? state.messages : new Map();
  state.current = sid;
  history.replaceState(null, "", `${location.pathname}${location.search}#s=${sid}`);
  const loaded = await request("load_session", { session_id: sid });
  if (state.current !== sid) return;
  state.sessions.set(sid, loaded.session);
  state.messages = new Map();
  state.order = [];
  for (const m of loaded.messages) {
    const mine = had.get(m.msg_id);
    // Keep what the page already has when it is the same text plus more.
    if (mine && m.status === "running" && mine.content.length > m.content.length && mine.content.startsWith(m.content)) {
      m.content = mine.content;
    }
    state.messages.set(m.msg_id, m);
    state.order.push(m.msg_id);
  }
  state.subscribed.clear();
  for (const m of loaded.messages) if (isOpen(m)) await subscribe(m);
  renderAll();
}

async function subscribe(m) {
  const key = m.msg_id;
  if (state.subscribed.has(key)) return;
  state.subscribed.add(key);
  try {
    await request("subscribe_msg", { session_id: state.current, msg_id: m.msg_id, offset: m.content.length });
  } catch (e) { state.subscribed.delete(key); if (e.code !== "unknown_message") showError(e.message); }
}

function isOpen(m) { return m.status === "running" || m.status === "pending"; }

function addMessage(sid, m) {
  if (sid !== state.current || state.messages.has(m.msg_id)) return;
  state.messages.set(m.msg_id, m);
  if (!m.caller && m.parent_id !== undefined) {
    // a new conversational node becomes head: the branch is root..parent, then it
    const i = state.order.indexOf(m.parent_id);
    if (m.parent_id && i >= 0) {
      const keep = new Set(state.order.slice(0, i + 1));
      state.order = state.order.filter((id) => keep.has(id) || state.messages.get(id)?.caller);
    }
  }
  state.order.push(m.msg_id);
  if (isOpen(m)) subscribe(m);
  renderMessages();
}

function patch(u) {
  if (u.session_id !== state.current) return;
  const m = state.messages.get(u.msg_id);
  if (!m) return;
  if (u.offset > m.content.length) { openSession(state.current, { keep: true }); return; }  // never expected
  m.content = m.content.slice(0, u.offset) + u.content_delta;
  m.status = u.status;
  if (u.tree !== null && u.tree !== undefined) m.metadata = { ...m.metadata, context_tree: u.tree };
  if (u.aborted_reason) m.metadata = { ...m.metadata, aborted_reason: u.aborted_reason };
  if (u.error) m.error = u.error;
  if (!isOpen(m)) state.subscribed.delete(m.msg_id);
  renderMessage(m);
}

function openDraft() {
  state.current = null;
  state.messages = new Map();
  state.order = [];
  history.replaceState(null, "", `${location.pathname}${location.search}`);
  renderAll();
}

// -- rendering -----------------------------------------------------------------

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}

function displayTitle(row) {
  const name = row.title || row.preview || "New chat";
  const brand = BRANDS[row.source];
  return brand ? [el("span", { class: "brand-prefix" }, `[${brand}] `), name] : [name];
}

function renderSidebar() {
  const ul = $("sessions");
  const rows = [...state.sessions.values()].filter((r) =>
    state.view === "all" || (state.view === "archived" ? r.archived : !r.archived));
  rows.sort((a, b) => (b.pinned - a.pinned) || (b.updated_at - a.updated_at) || (a.id < b.id ? -1 : 1));
  ul.replaceChildren(...rows.map((r) => el("li", {
      class: r.id === state.current ? "current" : "", "data-id": r.id, onclick: () => openSession(r.id) },
    el("div", { class: "row-title" }, r.pinned ? el("span", { class: "pin", title: "pinned" }, "★") : null, ...displayTitle(r),
      r.status === "running" ? el("span", { class: "badge running" }, "running") : null,
      r.archived ? el("span", { class: "badge archived" }, "archived") : null),
    el("div", { class: "row-preview" }, r.preview || "no messages yet"))));
  for (const b of $("views").children) b.classList.toggle("on", b.dataset.view === state.view);
}

function renderHeader() {
  const row = state.current ? state.sessions.get(state.current) : null;
  $("title").replaceChildren(...(row ? displayTitle(row) : ["New chat"]));
  $("actions").hidden = !row;
  if (row) {
    $("act-pin").textContent = row.pinned ? "Unpin" : "Pin";
    $("act-archive").textContent = row.archived ? "Unarchive" : "Archive";
  }
  renderProject();
}

function renderMessages() {
  const box = $("messages");
  const nodes = state.order.map((id) => state.messages.get(id)).filter(Boolean).map(renderNode);
  if (!nodes.length) nodes.push(el("div", { id: "empty", class: "empty" },
    "Start a conversation. Replies stream in; reload or lose the network at any moment, nothing is lost."));
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  box.replaceChildren(...nodes);
  if (atBottom) box.scrollTop = box.scrollHeight;
}

function renderMessage(m) {
  const old = document.querySelector(`[data-msg="${CSS.escape(m.msg_id)}"]`);
  if (!old) return renderMessages();
  const box = $("messages");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  old.replaceWith(renderNode(m));
  if (atBottom) box.scrollTop = box.scrollHeight;
}

function renderTree(t) {
  if (!t || typeof t !== "object") return null;
  const kids = Array.isArray(t.children) ? t.children : [];
  return el("ul", { class: "tree" }, el("li", { class: t.status || "" }, String(t.name ?? "function"),
    kids.length ? el("ul", { class: "tree" }, ...kids.map((k) => el("li", { class: k.status || "" }, String(k.name ?? "")))) : null));
}

function renderNode(m) {
  const reason = m.metadata?.aborted_reason || m.error;
  const badge = m.status !== "done" ? el("span", { class: `badge ${m.status}` }, m.status) : null;
  if (m.caller) {
    const label = m.kind === "tool_call" ? `Tool call${m.metadata?.tool ? ": " + m.metadata.tool : ""}`
      : m.kind === "agentic_fn" ? `Agentic function${m.metadata?.function ? ": " + m.metadata.function : ""}`
      : m.kind === "relocate" ? "Project relocated" : m.kind;
    return el("div", { class: `block ${m.kind} ${m.status}`, "data-msg": m.msg_id, "data-status": m.status },
      el("div", { class: "head" }, label, badge),
      m.kind === "agentic_fn" ? renderTree(m.metadata?.context_tree) : null,
      el("pre", {}, m.content),
      reason && m.status !== "done" ? el("div", { class: "why" }, reason) : null);
  }
  const who = m.role === "user" ? "You" : m.role === "assistant" ? "Assistant" : m.role;
  const controls = [];
  if (m.role === "assistant" && isOpen(m)) controls.push(el("button", { class: "stop", onclick: () => act("stop", { msg_id: m.msg_id }) }, "Stop"));
  const why = (m.status === "aborted" || m.status === "error") ? el("div", { class: "why" },
    `${m.status === "aborted" ? "Aborted" : "Error"}: ${reason || "unknown"}`,
    m.role === "assistant" ? el("button", { class: "retry", onclick: () => retry(m.msg_id) }, "Retry") : null) : null;
  return el("div", { class: `msg ${m.role} ${m.status}`, "data-msg": m.msg_id, "data-status": m.status },
    el("div", { class: "who" }, who, badge),
    el("div", { class: "bubble" }, m.content),
    why, controls.length ? el("div", { class: "controls" }, ...controls) : null);
}

function currentProject() {
  const row = state.current ? state.sessions.get(state.current) : null;
  const pid = row ? (row.project_id || "default") : state.draftProject;
  return state.projects.find((p) => p.id === pid) || { id: pid, name: pid, path: "", path_missing: false };
}

function renderProject() {
  const row = state.current ? state.sessions.get(state.current) : null;
  const frozen = row && row.message_count > 0;
  const p = currentProject();
  const chip = $("project-chip"), picker = $("project-picker");
  chip.hidden = !frozen;
  picker.hidden = !!frozen;
  chip.textContent = `${p.name}${p.path ? " — " + p.path : ""}`;
  chip.title = p.path;
  chip.className = `chip${frozen ? " frozen" : ""}${p.path_missing ? " missing" : ""}`;
  picker.replaceChildren(...state.projects.map((q) => el("option", { value: q.id }, `${q.name}${q.path_missing ? " (missing)" : ""}`)));
  picker.value = p.id;
  picker.classList.toggle("missing", !!p.path_missing);
  $("locate").hidden = !(p.path_missing && !p.is_default && row);
  if ($("locate").hidden) $("locate-input").hidden = true;
}

function renderAll() { renderSidebar(); renderHeader(); renderMessages(); }

function showConn() {
  const c = $("conn");
  c.textContent = state.online ? "live" : "reconnecting…";
  c.className = `conn ${state.online ? "online" : "offline"}`;
}

function showError(msg) {
  $("error").textContent = msg || "";
  if (msg) setTimeout(() => { if ($("error").textContent === msg) $("error").textContent = ""; }, 6000);
}

// -- actions -------------------------------------------------------------------------

async function act(action, fields = {}) {
  try { return await request(action, { session_id: state.current, ...fields }); }
  catch (e) { showError(e.message); return null; }
}

async function retry(msgId) {
  const r = await act("retry", { msg_id: msgId });
  if (r) await openSession(state.current, { keep: true });
}

async function send(text) {
  if (!text.trim()) return;
  try {
    const fields = { content: text };
    if (state.current) fields.session_id = state.current; else fields.project_id = state.draftProject;
    const ack = await request("chat", fields);
    $("input").value = "";
    await openSession(ack.session_id, { keep: ack.session_id === state.current });
  } catch (e) { showError(e.message); }
}

$("send-form").addEventListener("submit", (ev) => { ev.preventDefault(); send($("input").value); });
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); send($("input").value); }
});
$("new-chat").addEventListener("click", async () => {
  try {
    const r = await request("create_session", { project_id: state.draftProject });
    state.sessions.set(r.session.id, r.session);
    await openSession(r.session.id);
  } catch (e) { showError(e.message); }
});
for (const b of $("views").children) b.addEventListener("click", () => { state.view = b.dataset.view; renderSidebar(); });
$("act-rename").addEventListener("click", () => {
  const input = $("title-input");
  input.value = state.sessions.get(state.current)?.title || "";
  input.hidden = false; $("title").hidden = true; input.focus(); input.select();
});
$("title-input").addEventListener("keydown", async (ev) => {
  if (ev.key !== "Enter" && ev.key !== "Escape") return;
  const input = $("title-input");
  input.hidden = true; $("title").hidden = false;
  if (ev.key === "Enter" && input.value.trim()) await act("rename_session", { title: input.value.trim() });
});
$("act-regenerate").addEventListener("click", () => act("rename_session", { regenerate: true }));
$("act-pin").addEventListener("click", () => act("set_pinned", { pinned: !state.sessions.get(state.current)?.pinned }));
$("act-archive").addEventListener("click", () => act("set_archived", { archived: !state.sessions.get(state.current)?.archived }));
$("act-delete").addEventListener("click", async (ev) => {
  const b = ev.currentTarget;
  if (!b.classList.contains("confirm")) {
    b.classList.add("confirm"); b.textContent = "Confirm delete";
    setTimeout(() => { b.classList.remove("confirm"); b.textContent = "Delete"; }, 4000);
    return;
  }
  b.classList.remove("confirm"); b.textContent = "Delete";
  await act("delete_session");
});
$("project-picker").addEventListener("change", async (ev) => {
  const pid = ev.target.value;
  if (!state.current) { state.draftProject = pid; renderProject(); return; }
  await act("set_session_project", { project_id: pid });
});
$("locate").addEventListener("click", () => { const i = $("locate-input"); i.hidden = false; i.focus(); });
$("locate-input").addEventListener("keydown", async (ev) => {
  if (ev.key !== "Enter") return;
  const r = await act("relocate_project", { project_id: currentProject().id, path: ev.target.value.trim() });
  if (r) { ev.target.hidden = true; ev.target.value = ""; await openSession(state.current, { keep: true }); }
});

renderAll();
connect();
