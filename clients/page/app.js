// sessionlog's page, on the TypeScript client (clients/js/: its
// SocketClient keeps the one WebSocket to /ws up, settles every request,
// keeps the session list live and resumes it with `since`, and resumes each
// followed message exactly by offset). Bundled by esbuild into
// sessionlog_store/server/edge/static/app.js (`python dev.py page`; the
// bundle is committed, and a test checks it is this source's). Vendored
// markdown-it, DOMPurify and highlight.js (static/vendor/, with their
// licenses) are globals. Every piece of state comes from the server
// (list_sessions, load_session, msg_update pushes, broadcasts). Re-join after
// a reload or a dropped socket: load_session, then follow every running
// message from the content the page already has (offset), patching on each
// msg_update. Messages are updated in place (a selection survives a stream):
// a node is built once per message and only its changed parts are touched.
import { SocketClient } from "../js/src/index.ts";

// The token comes in the URL once, in its fragment (`#token=`, which no
// browser sends to a server or a proxy; `?token=` is read too), then lives in
// this tab's sessionStorage: the address bar (history, bookmarks,
// screenshots) does not keep it. The socket carries it in a subprotocol,
// never in a URL (a proxy's access log would keep it).
const TOKEN_KEY = "sessionlog-token";
let TOKEN = (() => {
  const q = new URLSearchParams(location.search);
  const h = new URLSearchParams(location.hash.slice(1));
  const given = h.get("token") ?? q.get("token");
  if (given === null) return sessionStorage.getItem(TOKEN_KEY) || "";
  sessionStorage.setItem(TOKEN_KEY, given);
  q.delete("token");
  h.delete("token");
  const rest = q.toString(), frag = h.toString();
  history.replaceState(null, "", `${location.pathname}${rest ? "?" + rest : ""}${frag ? "#" + frag : ""}`);
  return given;
})();
const BRANDS = { wechat: "WeChat", discord: "Discord", slack: "Slack", telegram: "Telegram", whatsapp: "WhatsApp" };
const $ = (id) => document.getElementById(id);
const KIND_WORDS = { llm_reply: "writing a reply", tool_call: "using a tool", agentic_fn: "working through steps",
                     task_spawn: "starting a task", merge: "merging" };
// Why a reply ended early, in words a user knows (the log keeps the server's reason).
const REASON_WORDS = {
  "stopped by user": "Stopped.",
  "worker restart": "Interrupted: the server restarted while writing this reply. Retry to write it again.",
  "server shutdown": "Interrupted: the server was shut down while writing this reply. Retry to write it again.",
  "producer lost": "Interrupted: the app writing this reply went quiet. Retry to write it again.",
  "stalled": "Interrupted: the reply stopped arriving. Retry to write it again.",
};
function stoppedByUser(m) { return m.status === "aborted" && (m.metadata?.aborted_reason || m.error) === "stopped by user"; }
const EMPTY_CHAT = "Start a conversation. Replies stream in; reload or lose the network at any moment, nothing is lost.";

// Relative to the page, so that it works under any path prefix (--root-path).
function socketUrl() {
  const url = new URL("ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = "";
  url.hash = "";
  return url.href;
}
// The token goes in a subprotocol (the client's), never in a URL: a proxy's access log would keep it.
const client = new SocketClient({ url: socketUrl(), token: TOKEN, followSessions: false });
const request = (action, fields = {}) => client.request(action, fields);

const state = {
  client,
  get online() { return client.online; },
  get everOpened() { return client.everOpened; },
  get sessions() { return client.sessions; },  // id -> row, kept live by the client
  follows: new Map(),         // msg_id -> the client's subscription (messages of the current session)
  projects: [],
  view: "active",
  search: "",
  current: null,              // session id, or null for a draft (a draft has no id until its first message)
  messages: new Map(),        // msg_id -> message (current session)
  order: [],                  // msg ids of the current branch, in order
  nodes: new Map(),           // msg_id -> its element
  dirty: new Set(),           // msg ids whose node is behind their message (drawn on the next frame)
  running: [],                // list_running, across sessions
  draftProject: "default",
  renameFor: null,            // the session a rename field is open for
  renameFrom: null,           // what had the focus when the rename opened (it gets it back)
  rowFocus: null,             // the chat row last focused (the list's one Tab stop)
  refocus: null,              // a branch switch under way: {msgId, key} of the control to focus when drawn
  parsed: 0,                  // characters of Markdown parsed so far
};
window.sessionlog = state;    // for tests and the curious

// -- Markdown, sanitized ---------------------------------------------------------

const md = window.markdownit({
  html: false, linkify: true, breaks: false,
  highlight: (code, lang) => {
    if (lang && window.hljs?.getLanguage(lang)) {
      try { return window.hljs.highlight(code, { language: lang, ignoreIllegals: true }).value; } catch { /* plain */ }
    }
    return "";
  },
});
// A table cell's alignment as a class (the sanitizer drops every style attribute).
for (const rule of ["th_open", "td_open"]) {
  md.renderer.rules[rule] = (tokens, i, opts, env, self) => {
    const t = tokens[i], align = /text-align:\s*(left|right|center)/.exec(t.attrGet("style") || "");
    t.attrs = (t.attrs || []).filter(([k]) => k !== "style");
    if (align) t.attrJoin("class", `align-${align[1]}`);
    return self.renderToken(tokens, i, opts);
  };
}

// Math: $$…$$ and \[…\] on lines of their own, \(…\) and $…$ inside a line
// (a $ opens only before a non-space and closes after one, not before a
// digit: "$5 and $10" stays text). Marked here, typeset by KaTeX, which is
// loaded the first time a reply has math (static/vendor/katex/).
md.block.ruler.before("fence", "math_block", (st, start, end, silent) => {
  const first = st.src.slice(st.bMarks[start] + st.tShift[start], st.eMarks[start]).trim();
  const open = first.startsWith("$$") ? "$$" : first.startsWith("\\[") ? "\\[" : null;
  if (!open) return false;
  const close = open === "$$" ? "$$" : "\\]";
  let body = first.slice(2), line = start, found = false;
  if (body.trimEnd().endsWith(close) && body.trim().length > 2) { body = body.trimEnd().slice(0, -2); found = true; }
  while (!found && ++line < end) {
    const text = st.src.slice(st.bMarks[line] + st.tShift[line], st.eMarks[line]);
    if (text.trimEnd().endsWith(close)) { body += "\n" + text.trimEnd().slice(0, -2); found = true; } else body += "\n" + text;
  }
  if (!found) return false;
  if (silent) return true;
  const t = st.push("math_block", "div", 0);
  t.content = body.trim(); t.map = [start, line + 1]; t.block = true;
  st.line = line + 1;
  return true;
}, { alt: ["paragraph"] });
md.inline.ruler.after("escape", "math_inline", (st, silent) => {
  const src = st.src, at = st.pos;
  let open, close;
  if (src.startsWith("\\(", at)) { open = "\\("; close = "\\)"; }
  else if (src[at] === "$" && src[at + 1] !== "$" && src[at + 1] && !/\s/.test(src[at + 1])) { open = "$"; close = "$"; }
  else return false;
  let end = src.indexOf(close, at + open.length);
  while (close === "$" && end > 0 && (/\s/.test(src[end - 1]) || /\d/.test(src[end + 1] || ""))) end = src.indexOf("$", end + 1);
  if (end < 0) return false;
  if (!silent) { const t = st.push("math_inline", "span", 0); t.content = src.slice(at + open.length, end); }
  st.pos = end + close.length;
  return true;
});
md.renderer.rules.math_inline = (tokens, i) => `<span class="math" data-tex="${md.utils.escapeHtml(tokens[i].content)}">${md.utils.escapeHtml(tokens[i].content)}</span>`;
md.renderer.rules.math_block = (tokens, i) => `<div class="math display" data-tex="${md.utils.escapeHtml(tokens[i].content)}">${md.utils.escapeHtml(tokens[i].content)}</div>\n`;

let katexLoading = null;
function typeset(box) {
  const todo = [...box.querySelectorAll(".math:not(.typeset)")];
  if (!todo.length) return;
  if (!window.katex) {
    katexLoading ??= new Promise((ok, fail) => {
      document.head.append(el("link", { rel: "stylesheet", href: "static/vendor/katex/katex.min.css" }));
      const sc = el("script", { src: "static/vendor/katex/katex.min.js" });
      sc.onload = ok; sc.onerror = fail;
      document.head.append(sc);
    });
    katexLoading.then(() => typeset(box), () => { katexLoading = null; });
    return;
  }
  for (const n of todo) {
    try { window.katex.render(n.dataset.tex, n, { displayMode: n.classList.contains("display"), throwOnError: false, trust: false }); }
    catch { /* left as its source */ }
    n.classList.add("typeset");
  }
}

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") { node.setAttribute("target", "_blank"); node.setAttribute("rel", "noopener noreferrer"); }
});
const PURIFY = { RETURN_DOM_FRAGMENT: true, FORBID_TAGS: ["style", "svg", "math", "form", "input"], FORBID_ATTR: ["style"] };

// What a screen reader should say of some Markdown: its words, not its syntax.
function plainText(text) {
  const frag = DOMPurify.sanitize(md.render(text), PURIFY);
  for (const b of frag.querySelectorAll("p, li, h1, h2, h3, h4, h5, h6, pre, tr, blockquote")) b.append(" ");
  return frag.textContent.replace(/\s+/g, " ").trim();
}
state.plainText = plainText;

// `env.references`: link reference definitions known before `text` (it adds its own).
function markdownBlocks(text, env = {}) {
  if (!text) return [];
  state.parsed += text.length;  // (what the page has parsed: a test checks it grows with the text, not per frame)
  const frag = DOMPurify.sanitize(md.render(text, env), PURIFY);
  // task lists: "[ ]" / "[x]" opening an item is a checkbox (made here, after the sanitizer)
  for (const li of frag.querySelectorAll("li")) {
    const first = li.firstChild?.nodeName === "P" ? li.firstChild.firstChild : li.firstChild;
    const m = first?.nodeType === 3 && /^\[( |x|X)\]\s/.exec(first.textContent);
    if (!m) continue;
    first.textContent = first.textContent.slice(m[0].length);
    first.before(el("input", { type: "checkbox", disabled: true, checked: m[1] !== " ", "aria-label": m[1] !== " " ? "done" : "to do" }));
    li.classList.add("task");
  }
  for (const t of frag.querySelectorAll("table, pre")) t.tabIndex = 0;  // (wide ones scroll sideways: so can the keyboard)
  // images from elsewhere are blocked (the page's policy loads nothing from other sites): say so, with a link
  for (const img of frag.querySelectorAll("img")) {
    let host = "";
    try { host = new URL(img.getAttribute("src") || "", location.href).host; } catch { /* no address */ }
    const what = img.getAttribute("alt") || "an image";
    const link = img.getAttribute("src") && /^https?:/.test(img.getAttribute("src"))
      ? el("a", { href: img.getAttribute("src"), target: "_blank", rel: "noopener noreferrer" }, "open it") : null;
    img.replaceWith(el("span", { class: "img-blocked" }, `Image not shown: ${what}${host ? ` (from ${host})` : ""}`, link ? " · " : "", link));
  }
  return [...frag.childNodes].filter((n) => n.nodeType === 1 || n.textContent.trim());
}

// Render into `box` touching only the top-level blocks that changed: the
// blocks above the one being written keep their nodes (and any selection).
// A block that holds the user's selection is left as it is while the
// selection lasts (the text it gains shows once the selection goes).
//
// A streaming reply is parsed from its last finished block only: the text
// up to a safe cut (below) is parsed once, its blocks kept, and each frame
// parses and sanitises the unfinished tail. A 50 KB reply costs a frame
// what its last paragraph costs, not what the whole reply does.
//
// A link reference definition counts for the whole text, wherever it is
// (`[docs]: https://...` under the paragraph that says `[the docs][docs]`):
// each part is parsed knowing the definitions before it, and a definition
// the drawn blocks did not know draws them all again, once, knowing it.
function renderMarkdownInto(box, text, refs = null) {
  let done = box._md;  // {src, count, refs}: the finished text, its first `count` child nodes, the definitions they knew
  if (!done || !text.startsWith(done.src) || box.childNodes.length < done.count || refs) {
    done = { src: "", count: 0, refs: refs || {} };
  }
  const cut = safeCut(text, done.src.length);
  const env = { references: { ...done.refs } };
  const finished = markdownBlocks(text.slice(done.src.length, cut), env);
  const known = { ...env.references };  // (what this frame's finished blocks knew)
  const tail = markdownBlocks(text.slice(cut), env);
  if (!refs && Object.keys(env.references).some((k) => !(k in done.refs)) && (done.count || finished.length)) {
    const later = Object.keys(env.references).some((k) => !(k in known));  // (defined in the tail)
    const unknownBefore = Object.keys(known).some((k) => !(k in done.refs));  // (in this frame's finished part)
    if (later || (unknownBefore && done.count)) return renderMarkdownInto(box, text, env.references);
  }
  const fresh = [...finished, ...tail];
  const old = [...box.childNodes].slice(done.count);
  const sel = window.getSelection();
  const held = (n) => sel && sel.rangeCount > 0 && !sel.isCollapsed && sel.containsNode(n, true);
  box._pending = null;
  fresh.forEach((n, i) => {
    const html = n.outerHTML ?? n.textContent;
    if (i < old.length && old[i]._html === html) return;
    if (i < old.length && held(old[i])) { box._pending = text; heldBoxes.add(box); return; }  // later
    if (n.tagName === "PRE") n = codeBlock(n);
    n._html = html;
    if (i < old.length) old[i].replaceWith(n); else box.append(n);
  });
  for (const n of old.slice(fresh.length)) {
    if (held(n)) { box._pending = text; heldBoxes.add(box); } else n.remove();
  }
  // what is drawn is the text: the finished part moves on (not while a held block is behind)
  box._md = box._pending === null ? { src: text.slice(0, cut), count: done.count + finished.length, refs: known } : done;
}

// Where the text can be cut so that its two parts render as the whole does:
// after a blank line outside a fenced code block, before a line (complete,
// so its start is known) that neither continues a list or an indented block
// (it starts with no space) nor starts a list item (which would join the
// list above it). From `from`, which is such a cut (or 0); returns the last.
const FENCE = /^( {0,3})(`{3,}|~{3,})/;
const JOINS = /^(\s|[-+*]\s|\d{1,9}[.)]\s|[-+*]$|\d{1,9}[.)]$)/;
const BLANK = /^[ \t]*$/;  // (as markdown-it sees a blank line: a no-break space is text)
function safeCut(text, from) {
  let cut = from, fence = null, blank = false, at = from;
  for (;;) {
    const nl = text.indexOf("\n", at);
    if (nl < 0) return cut;  // an unfinished line: nothing is known of it yet
    const line = text.slice(at, nl);
    let f = FENCE.exec(line);
    if (f && f[2][0] === "`" && line.slice(f[0].length).includes("`")) f = null;  // (not a fence: CommonMark)
    if (f && f[1]) return cut;  // an indented fence (a list item's): where it ends depends on the list: no cut past it
    if (fence === "$$" || fence === "\\[") {  // a math block ends on the line that ends with its close
      if (line.trimEnd().endsWith(fence === "$$" ? "$$" : "\\]")) fence = null;
    } else if (fence) {
      if (f && f[2][0] === fence[0] && f[2].length >= fence.length && BLANK.test(line.slice(f[0].length))) fence = null;
    } else {
      if (blank && !BLANK.test(line) && !JOINS.test(line)) cut = at;
      const math = /^ {0,3}(\$\$|\\\[)/.exec(line);
      if (f) fence = f[2];
      else if (math) {
        const close = math[1] === "$$" ? "$$" : "\\]", rest = line.trim().slice(2);
        if (!(rest.trimEnd().endsWith(close) && rest.trim().length > 2)) fence = math[1];
      }
    }
    blank = !fence && BLANK.test(line);
    at = nl + 1;
  }
}

state.markdownBlocks = markdownBlocks;  // the whole text's blocks at once (a test compares)

const heldBoxes = new Set();
document.addEventListener("selectionchange", () => {
  for (const box of [...heldBoxes]) {
    heldBoxes.delete(box);
    if (box._pending != null && box.isConnected) keepBottom(() => { renderMarkdownInto(box, box._pending); typeset(box); });
  }
});

// A code block: a header bar (its language, Copy) above the code, which
// scrolls on its own under it.
function codeBlock(pre) {
  const lang = /language-([\w+#.-]+)/.exec(pre.querySelector("code")?.className || "")?.[1] || "code";
  return el("div", { class: "code" },
    el("div", { class: "code-head" }, el("span", { class: "code-lang" }, lang),
      copyButton(() => pre.querySelector("code")?.textContent ?? pre.textContent, lang === "code" ? " code" : ` ${lang} code`)),
    pre);
}

// Copy, and what (`more`, read to screen readers only): the name starts with what is shown.
function copyButton(text, more) {
  const shown = el("span", {}, "Copy");
  const b = el("button", { class: "copy", type: "button" }, shown, el("span", { class: "visually-hidden" }, more));
  b.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(text()); shown.textContent = "Copied"; } catch { shown.textContent = "Select and copy"; }
    setTimeout(() => { shown.textContent = "Copy"; }, 1500);
  });
  return b;
}

// -- the socket (the client keeps it up: reconnects, heartbeat, since) -----------

client.on("open", async () => {
  $("token-box").hidden = true; showConn();
  await rejoinAll();
  if (state.queued && state.online) sendQueued();
});

// What was sent offline goes now, to the chat it was written in. It is kept
// in the tab until then (a reload offline keeps it queued).
async function sendQueued() {
  const q = state.queued;
  setQueued(null);
  renderComposer();
  try {
    const ack = await request("chat", q.sid ? { content: q.text, session_id: q.sid } : { content: q.text, project_id: q.project });
    if (state.current === q.sid) await openSession(ack.session_id, { keep: ack.session_id === state.current });
    refreshRunning();
  } catch (e) {
    showError(`Not sent: ${e.message} (it is back in its chat's message box)`);
    if (state.current === q.sid) { $("input").value = $("input").value ? `${q.text}\n${$("input").value}` : q.text; growInput(); }
    else stashDraft(q.sid, q.text);  // not lost: the draft of its chat
  }
}
const QUEUED_KEY = "sessionlog-queued";
function setQueued(q) {
  state.queued = q;
  try { if (q) sessionStorage.setItem(QUEUED_KEY, JSON.stringify(q)); else sessionStorage.removeItem(QUEUED_KEY); } catch { /* kept in memory */ }
}
try { state.queued = JSON.parse(sessionStorage.getItem(QUEUED_KEY) || "null"); } catch { state.queued = null; }
function stashDraft(sid, text) {
  const key = DRAFT_KEY + (sid ?? "new"), had = sessionStorage.getItem(key);
  try { sessionStorage.setItem(key, had ? `${text}\n${had}` : text); } catch { /* full */ }
}
client.on("close", ({ failedOpens }) => { showConn(); if (failedOpens >= 3) checkRefused(); });
client.on("push", onFrame);
client.on("sessions", () => renderSidebar());
client.on("error", (e) => { if (e.code !== "unknown_message") showError(e.message); });
window.addEventListener("offline", () => client.drop());

// A socket that never opens while the page's server answers: the handshake
// is refused (a new token after a restart, most likely). Say what to do.
async function checkRefused() {
  try {
    const r = await fetch(new URL("static/app.js", location.href), { method: "HEAD", cache: "no-store" });
    if (r.ok && !state.online && $("token-box").hidden) { $("token-box").hidden = false; $("token-input").focus(); }
  } catch { /* the server is down: keep reconnecting */ }
}

// A push (the client has applied a session_* one to its list already, and
// sends each msg_update to its message's subscription: patch).
function onFrame(f) {
  switch (f.type) {
    case "message_created": return addMessage(f.data.session_id, f.data.message);
    case "session_updated":
      if (f.data.id === state.current) { renderHeader(); seen(); }
      if ("status" in f.data) refreshRunning();
      return;
    case "session_deleted":  // the open chat deleted elsewhere (another tab, the API): say so
      if (f.data.session_id === state.current) { showError("That chat no longer exists."); openDraft(); }
      refreshRunning();
      return;
    case "head_moved":  // another tab switched branches: show the same branch here
      if (f.data.session_id === state.current) openSession(state.current, { keep: true });
      return;
    case "projects_list": state.projects = f.data.projects; return renderProject();
  }
}

async function rejoinAll() {
  try {
    // After a reconnect, only what changed while away (the client asks with
    // `since`; the server answers with a full list when it cannot).
    await client.refreshSessions();
    state.projects = (await request("list_projects")).projects;
    renderProject();
    refreshRunning();
    const sid = state.wanted || state.current || new URLSearchParams(location.hash.slice(1)).get("s");
    if (sid && state.sessions.has(sid)) await openSession(sid, { keep: sid === state.current, push: false });
    else if (sid) { showError("That chat no longer exists."); openDraft(); }  // (deleted while this page was away)
    else if (!state.current) openDraft();
  } catch (e) { showError(e.message); }
}

// A row turns "running" as its reply's placeholder is written, a moment
// before the reply is listed as running: ask again until the two agree.
async function refreshRunning(tries = 10) {
  try { state.running = (await request("list_running")).running || []; } catch { return; }
  renderRunning();
  const listed = new Set(state.running.map((r) => r.session_id));
  const rows = [...state.sessions.values()].filter((r) => r.status === "running" && !r.damaged);
  if (tries > 0 && rows.some((r) => !listed.has(r.id))) setTimeout(() => refreshRunning(tries - 1), 300);
}

// -- sessions and messages ---------------------------------------------------------

// `push`: a chat the user opened gets its own history entry (Back and Forward
// move between chats); a re-join or a popstate replaces it.
async function openSession(sid, { keep = false, push = !keep } = {}) {
  const had = keep && sid === state.current ? state.messages : new Map();
  const before = state.current;
  if (!state.online && sid !== before) {  // offline: say so, stay, and open it when back
    state.wanted = sid;
    showError("Offline: this chat opens when the connection is back.");
    closeDrawer();
    return;
  }
  keepIfDeleting(sid);
  if (sid !== before) {
    closeRename();
    saveDraft();
    for (const f of state.follows.values()) f.close();
    state.follows.clear();
  }
  state.current = sid;
  state.wanted = null;
  go(`#s=${sid}`, push && sid !== before);
  closeDrawer();
  if (sid !== before) restoreDraft();
  let loaded;
  try {
    loaded = await request("load_session", { session_id: sid });
  } catch (e) {
    if (state.current !== sid) return;
    if (!state.online) { state.wanted = sid; showError(e.message); return; }  // (the socket went meanwhile: open it when back)
    // gone (deleted in another tab, an old address): say so, and show a new chat rather than another's messages
    showError(e.code === "unknown_session" ? "That chat no longer exists." : e.message);
    openDraft();
    return;
  }
  if (state.current !== sid) return;
  state.sessions.set(sid, loaded.session);
  if (!keep) state.nodes = new Map();
  state.messages = new Map();
  state.order = [];
  for (const m of loaded.messages) {
    const mine = had.get(m.msg_id);
    // Keep what the page already has when it is the same text plus more.
    if (mine && m.status === "running" && mine.content.length > m.content.length && mine.content.startsWith(m.content)) {
      m.content = mine.content;
    }
    m._said = mine?._said ?? m.content.length;  // what was there at load is not read out again
    state.messages.set(m.msg_id, m);
    state.dirty.add(m.msg_id);  // a kept node is brought up to date (only what changed is touched)
    state.order.push(m.msg_id);
  }
  for (const m of loaded.messages) if (isOpen(m)) subscribe(m);
  if (!keep) state.stick = true;  // another chat opens at its latest
  renderAll();
  seen();
}

// Follow a running message from the text the page has: the client resumes it
// exactly after every reconnect, and each update goes to patch.
function subscribe(m) {
  state.follows.set(m.msg_id, client.subscribeMessage(state.current, m.msg_id,
                                                      { offset: m.content.length, onUpdate: patch }));
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
    // its siblings now have one more branch
    for (const sib of m.siblings || []) {
      const s = state.messages.get(sib);
      if (s) { s.siblings = m.siblings; state.dirty.add(sib); }
    }
  }
  state.order.push(m.msg_id);
  if (isOpen(m)) subscribe(m);
  renderMessages();
  renderComposer();
}

function patch(u) {
  if (u.session_id !== state.current) return;
  const m = state.messages.get(u.msg_id);
  if (!m) return;
  if (u.offset > m.content.length) { openSession(state.current, { keep: true }); return; }  // never expected
  const wasOpen = isOpen(m);
  m.content = m.content.slice(0, u.offset) + u.content_delta;
  m.status = u.status;
  if (u.tree !== null && u.tree !== undefined) m.metadata = { ...m.metadata, context_tree: u.tree };
  if (u.aborted_reason) m.metadata = { ...m.metadata, aborted_reason: u.aborted_reason };
  if (u.error) m.error = u.error;
  if (!isOpen(m)) state.follows.delete(m.msg_id);
  announce(m);
  if (wasOpen && !isOpen(m)) { keepBottom(() => drawNode(m)); renderComposer(); return; }  // the end: at once
  state.dirty.add(m.msg_id);
  scheduleDraw();
}

// Tokens arrive many times a frame: draw once per frame.
let drawScheduled = false;
function scheduleDraw() {
  if (drawScheduled) return;
  drawScheduled = true;
  requestAnimationFrame(() => {
    drawScheduled = false;
    const dirty = [...state.dirty];
    state.dirty.clear();
    keepBottom(() => { for (const id of dirty) { const m = state.messages.get(id); if (m) drawNode(m); } });
  });
}

// Read finished paragraphs of a streaming reply to screen readers, once each.
function announce(m) {
  if (m.role !== "assistant" || m.caller) return;
  const said = m._said ?? 0;
  const upto = isOpen(m) ? m.content.lastIndexOf("\n\n") : m.content.length;
  if (upto <= said) return;
  const text = plainText(m.content.slice(said, upto));
  m._said = upto;
  if (text) $("announce").textContent = text;
  if (!isOpen(m)) {
    const end = m.status === "done" ? "Reply finished." : stoppedByUser(m) ? "Reply stopped."
      : m.status === "error" ? "Reply failed." : "Reply interrupted.";
    setTimeout(() => { $("announce").textContent = end; }, 50);
  }
}

function openDraft({ push = false } = {}) {
  closeRename();
  if (state.current !== null) { saveDraft(); state.current = null; restoreDraft(); }
  state.wanted = null;
  state.messages = new Map();
  state.order = [];
  state.nodes = new Map();
  state.stick = true;
  go("", push);
  renderAll();
}

// -- rendering -----------------------------------------------------------------

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}

function rowName(row) { return row.title || row.preview || "New chat"; }

function displayTitle(row) {
  const brand = BRANDS[row.source];
  return brand ? [el("span", { class: "brand-prefix" }, `[${brand}] `), rowName(row)] : [rowName(row)];
}

function ago(seconds) {
  if (!seconds) return "";
  const d = Date.now() / 1000 - seconds;
  if (d < 45) return "just now";
  if (d < 3600) return `${Math.round(d / 60)} min ago`;
  if (d < 86400) return `${Math.round(d / 3600)} h ago`;
  if (d < 86400 * 7) return `${Math.round(d / 86400)} d ago`;
  return new Date(seconds * 1000).toLocaleDateString();
}

function timeEl(seconds) {
  if (!seconds) return null;
  const at = new Date(seconds * 1000);
  return el("time", { datetime: at.toISOString(), title: at.toLocaleString() }, ago(seconds));
}

// The list is updated in place: a row keeps its element (and so the focus
// and the list's scroll) across every update, and only a row whose drawn
// fields changed is redrawn. One row is in the Tab order (roving tabindex):
// arrow keys, Home and End move through the list.
const rowNodes = new Map();   // session id -> its <li>
let noneNode = null;          // the "No chats…" line

function visibleRows() {
  const q = state.search.trim().toLowerCase();
  const rows = [...state.sessions.values()].filter((r) => !state.deleting.has(r.id)
    && (state.view === "all" || (state.view === "archived" ? r.archived : !r.archived))
    && (!q || rowName(r).toLowerCase().includes(q) || (r.preview || "").toLowerCase().includes(q)));
  rows.sort((a, b) => (b.pinned - a.pinned) || (b.updated_at - a.updated_at) || (a.id < b.id ? -1 : 1));
  return rows;
}

function rowNode(r) {
  let li = rowNodes.get(r.id);
  if (!li) {
    li = el("li", { "data-id": r.id },
      el("button", { class: "row", type: "button", tabindex: "-1", onclick: () => openSession(r.id) }),
      el("button", { class: "row-more", type: "button", tabindex: "-1", "aria-haspopup": "menu", "aria-expanded": "false",
                     "aria-controls": "menu", onclick: (ev) => openMenu(r.id, ev.currentTarget) }, "⋯"));
    rowNodes.set(r.id, li);
  }
  const current = r.id === state.current;
  const when = ago(r.updated_at);
  const sig = JSON.stringify([rowName(r), r.source, r.preview, r.pinned, r.status, r.archived, r.damaged, r.unread,
                              current, when, r.title]);
  if (li._sig === sig) return li;
  li._sig = sig;
  li.className = `${current ? "current" : ""}${r.unread ? " unread" : ""}`;
  const b = li.firstChild;
  if (current) b.setAttribute("aria-current", "page"); else b.removeAttribute("aria-current");
  li.lastChild.setAttribute("aria-label", `Actions for ${rowName(r)}`);
  b.title = r.title && r.preview ? r.preview : "";  // (one line a row: the first message on hover)
  b.replaceChildren(
    el("span", { class: "row-title" }, r.unread ? el("span", { class: "dot", "aria-hidden": "true" }) : null,
      r.unread ? el("span", { class: "visually-hidden" }, "New reply: ") : null,
      r.pinned ? el("span", { class: "pin", "aria-label": "pinned" }, "★ ") : null,
      ...displayTitle(r),
      r.status === "running" ? el("span", { class: "badge running" }, "running") : null,
      r.archived ? el("span", { class: "badge archived" }, "archived") : null,
      r.damaged ? el("span", { class: "badge error" }, "damaged") : null),
    el("span", { class: "row-time" }, when));
  return li;
}

// Rows under headers by when they last changed (pinned ones first), as the
// day is where the page runs.
function groupOf(r, now = Date.now()) {
  if (r.pinned) return "Pinned";
  const day = new Date(now); day.setHours(0, 0, 0, 0);
  const t = r.updated_at * 1000, start = day.getTime(), DAY = 86400000;
  return t >= start ? "Today" : t >= start - DAY ? "Yesterday" : t >= start - 7 * DAY ? "Previous 7 days"
    : t >= start - 30 * DAY ? "Previous 30 days" : "Older";
}
state.groupOf = groupOf;
const groupNodes = new Map();  // label -> its header <li>
function groupNode(label) {
  let li = groupNodes.get(label);
  if (!li) { li = el("li", { class: "group" }, el("h2", {}, label)); groupNodes.set(label, li); }
  return li;
}

// Only the first rows are drawn (a page of PAGE more each time the list's
// end scrolls into view): a long list costs what is on screen.
const PAGE = 100;
state.drawn = PAGE;
let moreNode = null;
function moreRows() {
  if (!moreNode) {
    moreNode = el("li", { class: "more-rows" }, el("button", { type: "button", class: "link", tabindex: "-1",
      onclick: () => { state.drawn += PAGE; renderSidebar(); } }, "Show more chats"));
    new IntersectionObserver((seen) => {
      if (seen.some((e) => e.isIntersecting)) { state.drawn += PAGE; renderSidebar(); }
    }, { root: $("session-panel"), rootMargin: "200px" }).observe(moreNode);
  }
  return moreNode;
}

function renderSidebar() {
  const ul = $("sessions");
  const focused = document.activeElement;
  for (const [id, li] of rowNodes) if (!state.sessions.has(id)) { rowNodes.delete(id); li.remove(); }
  const rows = visibleRows();
  const want = [];
  let group = null;
  const now = Date.now();
  for (const r of rows.slice(0, state.drawn)) {
    const g = groupOf(r, now);
    if (g !== group) { want.push(groupNode(g)); group = g; }
    want.push(rowNode(r));
  }
  if (rows.length > state.drawn) want.push(moreRows());
  if (!want.length) {
    const q = state.search.trim();
    const why = !state.everOpened ? "Not connected yet: your chats show here once the page reaches the server."
      : q ? `No chats match “${q}”.` : state.view === "archived" ? "No archived chats."
      : state.view === "all" ? "No chats yet." : "No chats yet: write a message to start one.";
    noneNode ??= el("li", { class: "none" });
    if (noneNode.textContent !== why) noneNode.textContent = why;
    want.push(noneNode);
  }
  const at = focused && ul.contains(focused) ? [...ul.querySelectorAll("button.row")].indexOf(focused.closest("li")?.firstChild) : -1;
  want.forEach((n, i) => { if (ul.children[i] !== n) ul.insertBefore(n, ul.children[i] || null); });
  while (ul.children.length > want.length) ul.lastChild.remove();
  if (focused && focused !== document.activeElement && focused.isConnected) focused.focus({ preventScroll: true });
  else if (at >= 0 && !focused.isConnected) {  // its row went (archived, deleted): the row now in its place
    const rows = ul.querySelectorAll("button.row");
    (rows[Math.min(at, rows.length - 1)] || $("search")).focus({ preventScroll: true });
  }
  rovingStop();
  for (const b of $("views").children) {
    const on = b.dataset.view === state.view;
    b.setAttribute("aria-selected", String(on));
    b.tabIndex = on ? 0 : -1;
    if (on) $("session-panel").setAttribute("aria-labelledby", b.id);
  }
}

// The one row in the Tab order: the focused one, else the last one focused,
// else the open chat's, else the first.
function rovingStop() {
  const rows = [...$("sessions").querySelectorAll("button.row")];
  const pick = rows.find((b) => b === document.activeElement)
    || rows.find((b) => b.parentNode.dataset.id === state.rowFocus)
    || rows.find((b) => b.parentNode.dataset.id === state.current) || rows[0];
  for (const b of rows) { const t = b === pick ? 0 : -1; if (b.tabIndex !== t) b.tabIndex = t; }
  return pick;
}

$("sessions").addEventListener("focusin", (ev) => {
  const li = ev.target.closest("li[data-id]");
  if (li) { state.rowFocus = li.dataset.id; rovingStop(); }
});
$("sessions").addEventListener("keydown", (ev) => {
  const more = ev.target.closest("li")?.querySelector(".row-more");
  if (ev.key === "ArrowRight" && ev.target.matches("button.row") && more?.offsetParent) { ev.preventDefault(); more.focus(); return; }
  if (ev.key === "ArrowLeft" && ev.target === more) { ev.preventDefault(); ev.target.previousSibling.focus(); return; }
  const keys = { ArrowDown: 1, ArrowUp: -1, Home: -Infinity, End: Infinity };
  if (!(ev.key in keys) || ev.altKey || ev.ctrlKey || ev.metaKey) return;
  const rows = [...$("sessions").querySelectorAll("button.row")];
  if (!rows.length) return;
  ev.preventDefault();
  const i = rows.indexOf(document.activeElement.closest("li")?.querySelector("button.row"));
  const step = keys[ev.key];
  const j = Number.isFinite(step) ? Math.max(0, Math.min(rows.length - 1, i + step)) : step < 0 ? 0 : rows.length - 1;
  rows[j].focus();
  rows[j].scrollIntoView({ block: "nearest" });
});

function renderRunning() {
  const btn = $("running-btn"), list = $("running-list");
  const n = state.running.length;
  btn.hidden = n === 0;
  btn.textContent = `${n} running`;
  if (!n) { list.hidden = true; btn.setAttribute("aria-expanded", "false"); }
  list.replaceChildren(...state.running.map((r) => {
    const row = state.sessions.get(r.session_id);
    return el("li", {}, el("button", { type: "button", class: "row", onclick: () => { list.hidden = true;
      btn.setAttribute("aria-expanded", "false"); openSession(r.session_id); } },
      `${row ? rowName(row) : r.session_id} · ${KIND_WORDS[r.kind] || r.kind.replaceAll("_", " ")}`));
  }));
}

function renderHeader() {
  const row = state.current ? state.sessions.get(state.current) : null;
  $("title").replaceChildren(...(row ? displayTitle(row) : ["New chat"]));
  document.title = row ? `${rowName(row)} — sessionlog` : "New chat — sessionlog";
  $("more").hidden = !row;
  if (!row && state.menuFor === null) closeMenu();
  renderProject();
}

// The chat follows a streaming reply while its reader is at the bottom, and
// stays where the reader scrolled to otherwise: any scroll up (wheel, touch,
// keys, the scrollbar) lets go, and reaching the bottom again holds on. A
// "Jump to latest" button shows while away from the bottom.
state.stick = true;
let lastTop = 0;
function fromBottom() { const b = $("messages"); return b.scrollHeight - b.scrollTop - b.clientHeight; }
function keepBottom(fn) {
  fn();
  if (state.stick) { const box = $("messages"); box.scrollTop = box.scrollHeight; lastTop = box.scrollTop; }
  renderJump();
}
function toBottom(smooth = false) {
  state.stick = true;
  const box = $("messages");
  box.scrollTo({ top: box.scrollHeight, behavior: smooth && !matchMedia("(prefers-reduced-motion: reduce)").matches ? "smooth" : "auto" });
  renderJump();
}
function renderJump() {
  const away = !state.stick && fromBottom() > 80;
  if ($("jump").hidden === away) $("jump").hidden = !away;
}
$("messages").addEventListener("scroll", () => {
  const box = $("messages");
  if (fromBottom() <= 4) state.stick = true;
  else if (box.scrollTop < lastTop - 1) state.stick = false;  // the reader went up
  lastTop = box.scrollTop;
  renderJump();
}, { passive: true });
$("messages").addEventListener("wheel", (ev) => { if (ev.deltaY < 0) state.stick = false; }, { passive: true });
$("jump").addEventListener("click", () => { toBottom(true); $("input").focus({ preventScroll: true }); });

// A chat whose reply ended while its reader was elsewhere is unread (the
// server flags it as the reply ends); the chat on screen is read.
function seen() {
  const row = state.current && state.sessions.get(state.current);
  if (row?.unread && document.visibilityState === "visible" && state.online) {
    row.unread = false;  // (at once here; the server's answer comes to every tab)
    request("set_unread", { session_id: row.id, unread: false }).catch(() => { row.unread = true; });
    renderSidebar();
  }
}
document.addEventListener("visibilitychange", seen);

// The list in branch order, reusing each message's node: nodes that stay are
// never detached (a detached node loses the user's selection).
// A reply's tool calls and agentic functions are drawn inside it, after its
// text and before its controls, in the order they ran.
function renderMessages() {
  const box = $("messages");
  const inside = new Map();  // a reply's node -> its blocks' nodes
  const want = [];
  for (const m of state.order.map((id) => state.messages.get(id)).filter(Boolean)) {
    let node = state.nodes.get(m.msg_id);
    if (!node) { node = buildNode(m); state.nodes.set(m.msg_id, node); } else if (state.dirty.has(m.msg_id)) drawNode(m);
    const host = m.caller && m.kind !== "relocate" ? state.nodes.get(m.caller) : null;
    if (host?.querySelector(":scope > .tools")) { if (!inside.has(host)) inside.set(host, []); inside.get(host).push(node); }
    else want.push(node);
  }
  for (const [host, blocks] of inside) {
    const tools = host.querySelector(":scope > .tools");
    blocks.forEach((n, i) => { if (tools.children[i] !== n) tools.insertBefore(n, tools.children[i] || null); });
  }
  if (!want.length) want.push(el("div", { id: "empty", class: "empty" }, EMPTY_CHAT));
  keepBottom(() => {
    const have = [...box.children];
    if (have.length === want.length && have.every((n, i) => n === want[i])) return;
    for (const n of have) if (!want.includes(n)) n.remove();
    want.forEach((n, i) => { if (box.children[i] !== n) box.insertBefore(n, box.children[i] || null); });
  });
  if (state.refocus && focusLost()) focusControl(state.refocus.msgId, state.refocus.key);
}

// A tool call or an agentic function in one line, as people say it.
function blockLabel(m) {
  const open = isOpen(m);
  if (m.kind === "tool_call") {
    const tool = m.metadata?.tool;
    if (tool === "search") return open ? "Searching…" : "Searched";
    return tool ? (open ? `Using ${tool}…` : `Used ${tool}`) : (open ? "Using a tool…" : "Used a tool");
  }
  if (m.kind === "agentic_fn") {
    const kids = Array.isArray(m.metadata?.context_tree?.children) ? m.metadata.context_tree.children : [];
    const done = kids.filter((k) => k.status === "done").length;
    const steps = kids.length ? ` (${open ? `${done} of ${kids.length}` : kids.length} steps)` : "";
    return open ? `Working through steps…${steps}` : `Worked through steps${steps}`;
  }
  return m.kind === "relocate" ? "Project relocated" : m.kind.replaceAll("_", " ");
}

function renderTree(t) {
  if (!t || typeof t !== "object") return null;
  const kids = Array.isArray(t.children) ? t.children : [];
  return el("ul", { class: "tree" }, el("li", { class: t.status || "" }, String(t.name ?? "function"),
    kids.length ? el("ul", { class: "tree" }, ...kids.map((k) => el("li", { class: k.status || "" }, String(k.name ?? "")))) : null));
}

function buildNode(m) {
  // a tool call or an agentic function: one line that opens (a <details>), inside its reply
  const node = m.caller
    ? el("details", { class: "block", "data-msg": m.msg_id },
        el("summary", { class: "head" }), el("div", { class: "tree-box" }), el("pre", { class: "text" }), el("div", { class: "meta" }))
    : el("article", { class: "msg", "data-msg": m.msg_id },
        el("div", { class: "who" }), el("div", { class: "bubble" }), el("div", { class: "tools" }), el("div", { class: "meta" }));
  node._content = null;
  drawNode(m, node);
  return node;
}

// Bring a message's node up to date, touching only what changed.
function drawNode(m, node = state.nodes.get(m.msg_id)) {
  if (!node) return;
  state.dirty.delete(m.msg_id);
  const stopped = stoppedByUser(m);
  node.className = (m.caller ? `block ${m.kind} ${m.status}` : `msg ${m.role} ${m.status}`) + (stopped ? " stopped" : "");
  node.dataset.status = m.status;
  const reason = m.metadata?.aborted_reason || m.error;
  const word = stopped ? "stopped" : m.status === "aborted" ? "interrupted" : m.status === "error" ? "failed" : m.status;
  const badge = m.status !== "done" ? el("span", { class: `badge ${stopped ? "stopped" : m.status}` }, word) : null;
  if (m.caller) {
    node.querySelector(".head").replaceChildren(blockLabel(m), badge && m.status !== "running" ? badge : "");
    const tree = m.kind === "agentic_fn" ? renderTree(m.metadata?.context_tree) : null;
    node.querySelector(".tree-box").replaceChildren(...(tree ? [tree] : []));
    const pre = node.querySelector(".text");
    pre.hidden = !!tree;  // the steps once: as the tree when there is one, else as their text
    if (pre.textContent !== m.content) {
      if (m.content.startsWith(pre.textContent)) pre.append(m.content.slice(pre.textContent.length));
      else pre.textContent = m.content;
    }
    node.querySelector(":scope > .meta").replaceChildren(...(reason && m.status !== "done"
      ? [el("div", { class: stopped ? "why stopped" : "why" }, REASON_WORDS[reason] || reason)] : []));
    return;
  }
  const who = m.role === "user" ? "You" : m.role === "assistant" ? "Assistant" : m.role;
  node.querySelector(":scope > .who").replaceChildren(who, " ", timeEl(m.started_at) || "", badge || "");
  const bubble = node.querySelector(":scope > .bubble");
  if (node._content !== m.content) {
    if (m.role === "assistant") { renderMarkdownInto(bubble, m.content); typeset(bubble); }
    else bubble.textContent = m.content;
    node._content = m.content;
  }
  const meta = node.querySelector(":scope > .meta");
  const key = meta.contains(document.activeElement) && document.activeElement.dataset.key;
  meta.replaceChildren(...metaParts(m, reason));
  if (key) focusControl(m.msg_id, key);  // a redrawn control keeps the focus
}

// Focus a message's control by its key (prev, next, stop, retry); a
// disabled one hands the focus to its neighbour, never to the page.
function focusControl(msgId, key) {
  const node = state.nodes.get(msgId);
  const order = { prev: ["prev", "next"], next: ["next", "prev"], stop: ["stop", "retry"], retry: ["retry", "stop"] }[key] || [key];
  for (const k of order) {
    const b = node?.querySelector(`:scope > .meta [data-key="${k}"]`);
    if (b && !b.disabled) { b.focus({ preventScroll: true }); return true; }
  }
  return false;
}

function metaParts(m, reason) {
  const out = [];
  if (m.status === "aborted" || m.status === "error") {
    const words = m.status === "error" ? `Failed: ${reason || "the reply could not be written"}`
      : REASON_WORDS[reason] || `Interrupted: ${reason || "it ended early"}`;
    out.push(el("div", { class: stoppedByUser(m) ? "why stopped" : "why" }, words));
  }
  const controls = [];
  const sibs = m.siblings || [];
  if (sibs.length > 1) {
    const i = sibs.indexOf(m.msg_id);
    controls.push(el("span", { class: "branches", role: "group", "aria-label": "versions of this reply" },
      el("button", { type: "button", "aria-label": "previous version", disabled: i <= 0, "data-key": "prev",
                     onclick: () => switchBranch(sibs[i - 1], "prev") }, "‹"),
      el("span", { class: "branch-pos" }, `${i + 1}/${sibs.length}`),
      el("button", { type: "button", "aria-label": "next version", disabled: i >= sibs.length - 1, "data-key": "next",
                     onclick: () => switchBranch(sibs[i + 1], "next") }, "›")));
  }
  if (m.role === "assistant" && !isOpen(m) && m.content) {
    const copy = copyButton(() => m.content, " the whole reply (Markdown)");
    copy.dataset.key = "copy";
    controls.push(copy);
  }
  if (m.role === "assistant" && isOpen(m)) {
    controls.push(el("button", { class: "stop", type: "button", "data-key": "stop",
                                 onclick: () => act("stop", { msg_id: m.msg_id }) }, "Stop"));
  } else if (m.role === "assistant") {
    controls.push(el("button", { class: "retry", type: "button", "data-key": "retry", onclick: () => retry(m.msg_id) },
      m.status === "done" ? "Regenerate" : "Retry"));
  }
  if (controls.length) out.push(el("div", { class: "controls" }, ...controls));
  return out;
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
  chip.replaceChildren(`Project: ${p.name}`, ...(p.path ? [el("span", { class: "chip-path" }, ` · ${p.path}`)] : []),
    ...(p.path_missing ? [" (folder not found)"] : []));
  chip.title = frozen ? `This chat stays in the project ${p.name}${p.path ? " (" + p.path + ")" : ""}` : p.path;
  chip.className = `chip${frozen ? " frozen" : ""}${p.path_missing ? " missing" : ""}`;
  picker.replaceChildren(...state.projects.map((q) => el("option", { value: q.id }, `${q.name}${q.path_missing ? " (missing)" : ""}`)));
  picker.value = p.id;
  picker.classList.toggle("missing", !!p.path_missing);
  $("locate").hidden = !(p.path_missing && !p.is_default && row);
  if ($("locate").hidden) $("locate-input").hidden = true;
}

function runningReply() {
  for (const id of state.order) {
    const m = state.messages.get(id);
    if (m && m.role === "assistant" && !m.caller && isOpen(m)) return m;
  }
  return null;
}

// Send turns into Stop while this chat's reply streams. Offline one can
// still type, and Send queues the message: it goes once the connection is
// back (Send again takes it back); nothing can be stopped from here.
function renderComposer() {
  const running = state.online && runningReply();
  const send = $("send");
  send.textContent = running ? "Stop" : state.queued ? "Unqueue" : "Send";
  send.classList.toggle("danger", !!running);
  send.classList.toggle("queued", !!state.queued);
  send.disabled = state.sending || (!state.online && !!runningReply());
  send.title = state.queued ? "Take the queued message back into the box" : "";
  $("queued-note").hidden = !state.queued;
  if (state.queued) $("queued-note").textContent = `Offline: “${state.queued.text.trim().slice(0, 80)}” is queued and goes when the connection is back.`;
  if (state.online && $("input").dataset.refocus) {
    delete $("input").dataset.refocus;
    if (document.activeElement === document.body) $("input").focus();
  }
}

function renderAll() { renderSidebar(); renderHeader(); renderMessages(); renderComposer(); }

function showConn() {
  const c = $("conn");
  c.textContent = state.online ? "live" : "reconnecting…";
  c.className = `conn ${state.online ? "online" : "offline"}`;
  document.body.classList.toggle("offline", !state.online);
  const banner = $("offline-banner");
  banner.hidden = state.online || !state.everOpened;
  banner.textContent = "Connection lost: reconnecting… You can keep typing: a message you send now goes when the connection is back, and what the server wrote meanwhile shows then.";
  renderSidebar();  // (its empty line says why)
  renderComposer();
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

async function switchBranch(msgId, key) {
  // (the session's push may draw the new branch before the reload below: its
  // drawing puts the focus back at once, not a round trip later)
  const mine = state.refocus = key ? { msgId, key } : null;
  try {
    const r = await act("switch_branch", { msg_id: msgId });
    if (r) await openSession(state.current, { keep: true });
  } finally {
    if (state.refocus === mine) state.refocus = null;  // (not a later switch's)
  }
  // (where the user put the focus meanwhile, it stays)
  if (key && focusLost() && !focusControl(msgId, key)) $("input").focus();  // the button pressed went with its branch
}
function focusLost() { return !document.activeElement || document.activeElement === document.body; }

async function send(text) {
  if (!state.online) {  // queued for the chat it was written in (or taken back): it goes when the connection is
    if (state.queued) {  // taken back, before what was typed since
      const q = state.queued, typed = $("input").value;
      setQueued(null);
      if (q.sid !== state.current) stashDraft(q.sid, q.text);
      else $("input").value = typed ? `${q.text}\n${typed}` : q.text;
    } else if (text.trim() && !runningReply()) {
      setQueued({ text, sid: state.current, project: state.draftProject });
      $("input").value = "";
      saveDraft();
    }
    growInput();
    renderComposer();
    return;
  }
  if (runningReply()) {
    // the second click of a double click on Send is not a Stop
    if (state.sendClicks < 2) act("stop", { msg_id: runningReply().msg_id });
    return;
  }
  if (!text.trim() || state.sending) return;  // one message at a time: a double Enter makes no second chat
  state.sending = true; renderComposer();
  try {
    const fields = { content: text };
    if (state.current) fields.session_id = state.current; else fields.project_id = state.draftProject;
    const ack = await request("chat", fields);
    $("input").value = "";
    growInput();
    saveDraft();
    await openSession(ack.session_id, { keep: ack.session_id === state.current });
    refreshRunning();
  } catch (e) { showError(e.message); }
  finally { state.sending = false; renderComposer(); }
}

function growInput() {
  const t = $("input");
  t.style.height = "auto";
  t.style.height = `${Math.min(t.scrollHeight + 2, 200)}px`;
}

function newChat() { openDraft({ push: true }); closeDrawer(); $("input").focus(); }

// The address holds the open chat (`#s=<id>`); Back and Forward move between chats.
function go(hash, push) {
  const url = `${location.pathname}${location.search}${hash}`;
  if (url === location.pathname + location.search + location.hash) return;
  if (push) history.pushState(null, "", url); else history.replaceState(null, "", url);
}
addEventListener("popstate", () => {
  const sid = new URLSearchParams(location.hash.slice(1)).get("s");
  if (sid && sid !== state.current) openSession(sid, { push: false });
  else if (!sid && state.current !== null) openDraft();
});

// A draft per chat (and one for a new chat), kept in this tab (a reload keeps it).
const DRAFT_KEY = "sessionlog-draft:";
function saveDraft() {
  const key = DRAFT_KEY + (state.current ?? "new"), text = $("input").value;
  try { if (text) sessionStorage.setItem(key, text); else sessionStorage.removeItem(key); } catch { /* full: not kept */ }
}
function restoreDraft() {
  $("input").value = sessionStorage.getItem(DRAFT_KEY + (state.current ?? "new")) || "";
  growInput();
}
addEventListener("pagehide", saveDraft);

function openDrawer() {
  document.body.classList.add("drawer-open");
  $("scrim").hidden = false;
  $("menu-btn").setAttribute("aria-expanded", "true");
  rovingStop()?.focus();
}

function closeDrawer() {
  if (!document.body.classList.contains("drawer-open")) return;
  document.body.classList.remove("drawer-open");
  $("scrim").hidden = true;
  $("menu-btn").setAttribute("aria-expanded", "false");
}

function closeRename() {
  $("title-input").hidden = true; $("title").hidden = false; state.renameFor = null; state.renameFrom = null;
}

// A destructive or overriding action asks once: its button is armed (says
// what a second click does) for a few seconds, or until Escape.
function arm(b, label) {
  b.classList.add("confirm"); b.dataset.label = b.textContent; b.textContent = label;
  b._disarm = setTimeout(() => disarm(b), 4000);
}
function disarm(b) {
  if (!b.classList.contains("confirm")) return;
  clearTimeout(b._disarm); b.classList.remove("confirm"); b.textContent = b.dataset.label;
}

$("send-form").addEventListener("submit", (ev) => {
  ev.preventDefault(); send($("input").value); state.sendClicks = 0;
});
$("send").addEventListener("click", (ev) => { state.sendClicks = ev.detail; });  // 2: a double click's second
$("input").addEventListener("keydown", (ev) => {
  if (ev.isComposing || ev.keyCode === 229) return;  // an IME is composing: Enter picks a candidate
  if (ev.key === "Enter" && !ev.shiftKey && !TOUCH.matches) {
    ev.preventDefault(); if (!runningReply() && !state.sending) send($("input").value);
  }
});
// On a touch screen Enter is a new line (as on every phone's messenger): the Send button sends.
const TOUCH = matchMedia("(pointer: coarse)");
function placeholder() {
  $("input").placeholder = TOUCH.matches ? "Message…" : "Message… (Enter to send, Shift+Enter for a new line)";
}
TOUCH.addEventListener("change", placeholder);
placeholder();
$("input").addEventListener("input", growInput);
document.querySelector(".skip-link").addEventListener("click", (ev) => {  // the address keeps its #s=
  ev.preventDefault(); closeDrawer(); $("input").focus();
});
$("new-chat").addEventListener("click", newChat);
$("search").addEventListener("input", (ev) => { state.search = ev.target.value; state.drawn = PAGE; renderSidebar(); searchMessages(); });

// -- search through what was said: the server's full-text index, as you type --

let searchTimer = null, searchSeq = 0;
function searchMessages() {
  clearTimeout(searchTimer);
  const q = state.search.trim();
  if (q.length < 2) { searchSeq++; renderHits(null); return; }
  searchTimer = setTimeout(async () => {
    const mine = ++searchSeq;
    try {
      const found = await request("search", { query: state.search, limit: 20 });
      if (mine === searchSeq) renderHits(found);  // (an older answer never replaces a newer one)
    } catch (e) { if (mine === searchSeq) renderHits({ hits: [], failed: e.message }); }
  }, 150);
}

// A snippet with its matches marked (ranges in code points), as text nodes: nothing in it is markup.
function marked(snippet, marks) {
  const chars = Array.from(snippet), out = [];
  let at = 0;
  for (const [a, b] of marks) {
    if (a > at) out.push(chars.slice(at, a).join(""));
    out.push(el("mark", {}, chars.slice(a, b).join("")));
    at = b;
  }
  if (at < chars.length) out.push(chars.slice(at).join(""));
  return out;
}

function renderHits(found) {
  const box = $("hits-box"), ul = $("hits");
  box.hidden = !found;
  if (!found) { ul.replaceChildren(); return; }
  const who = { user: "You", assistant: "Reply", tool: "Tool" };
  const items = found.hits.map((h) => el("li", {},
    el("button", { class: "hit", type: "button", onclick: () => openHit(h) },
      el("span", { class: "hit-title" }, h.title || "Untitled chat", h.archived ? el("span", { class: "badge archived" }, "archived") : null),
      el("span", { class: "hit-snippet" }, el("span", { class: "hit-who" }, `${who[h.role] || h.role}: `), ...marked(h.snippet, h.marks)))));
  if (!items.length) {
    items.push(el("li", { class: "none" }, found.failed ? `Search failed: ${found.failed}`
      : found.indexing ? "Nothing yet: the search index is still being built." : "No message says that."));
  }
  ul.replaceChildren(...items);
}

async function openHit(h) {
  await openSession(h.session_id);
  const node = state.nodes.get(h.msg_id);
  if (!node) { showError("That message is on another version of the chat (‹ › under a reply)."); return; }
  state.stick = false;
  node.scrollIntoView({ block: "center" });
  node.classList.add("found");
  setTimeout(() => node.classList.remove("found"), 2000);
}
for (const b of $("views").children) b.addEventListener("click", () => { state.view = b.dataset.view; state.drawn = PAGE; renderSidebar(); });
$("views").addEventListener("keydown", (ev) => {  // arrow keys move between tabs
  if (ev.key !== "ArrowRight" && ev.key !== "ArrowLeft") return;
  const tabs = [...$("views").children];
  const i = tabs.findIndex((t) => t.dataset.view === state.view);
  const next = tabs[(i + (ev.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
  state.view = next.dataset.view; state.drawn = PAGE; renderSidebar(); next.focus();
});
$("running-btn").addEventListener("click", () => {
  const list = $("running-list");
  list.hidden = !list.hidden;
  $("running-btn").setAttribute("aria-expanded", String(!list.hidden));
});
$("menu-btn").addEventListener("click", () => (document.body.classList.contains("drawer-open") ? closeDrawer() : openDrawer()));
$("scrim").addEventListener("click", closeDrawer);
matchMedia("(max-width: 720px)").addEventListener("change", (e) => { if (!e.matches) closeDrawer(); });
$("help-btn").addEventListener("click", () => $("help").showModal());
$("act-rename").addEventListener("click", async () => {
  const sid = state.menuFor;
  closeMenu();
  if (sid !== state.current) await openSession(sid);  // (from a row's menu: the chat opens, its title is edited)
  const input = $("title-input");
  state.renameFor = state.current;
  state.renameFrom = $("more");
  input.value = state.sessions.get(state.current)?.title || "";
  input.hidden = false; $("title").hidden = true; input.focus(); input.select();
});
$("title-input").addEventListener("blur", closeRename);
$("title-input").addEventListener("keydown", async (ev) => {
  if (ev.key !== "Enter" && ev.key !== "Escape") return;
  ev.stopPropagation();
  ev.preventDefault();  // the Enter must not go on to press the button the focus returns to
  const input = $("title-input");
  const sid = state.renameFor;
  const title = input.value.trim();
  const back = state.renameFrom;
  closeRename();
  if (back?.isConnected && back.offsetParent !== null) back.focus(); else $("input").focus();  // never the body
  if (ev.key === "Enter" && title && sid) {
    try { await request("rename_session", { session_id: sid, title }); } catch (e) { showError(e.message); }
  }
});
$("act-regenerate").addEventListener("click", (ev) => {
  const sid = state.menuFor;
  const b = ev.currentTarget;
  if (state.sessions.get(sid)?._user_titled && !b.classList.contains("confirm")) { arm(b, "Replace your title?"); return; }  // a title the user typed: ask first
  closeMenu(true);
  act("rename_session", { session_id: sid, regenerate: true });
});
$("act-pin").addEventListener("click", () => {
  const sid = state.menuFor;
  closeMenu(true);
  act("set_pinned", { session_id: sid, pinned: !state.sessions.get(sid)?.pinned });
});
$("act-archive").addEventListener("click", async () => {
  const sid = state.menuFor, archived = !state.sessions.get(sid)?.archived;
  closeMenu(true);
  if (await act("set_archived", { session_id: sid, archived })) {
    toast(archived ? "Chat archived." : "Chat restored from the archive.",
          { undo: () => act("set_archived", { session_id: sid, archived: !archived }) });
  }
});
// Delete takes effect when its toast ends (Undo keeps the chat): its few
// seconds, longer while the pointer or the focus is on it, or at once when
// another toast takes its place or the page closes.
$("act-delete").addEventListener("click", () => {
  const sid = state.menuFor;
  const wasOpen = sid === state.current;
  closeMenu(!wasOpen);
  state.deleting.add(sid);
  if (wasOpen) { openDraft({ push: true }); $("input").focus(); }
  renderSidebar();
  toast("Chat deleted.", { undo: () => { keepChat(sid); if (wasOpen) openSession(sid); }, end: () => reallyDelete(sid) });
});
state.deleting = new Set();  // chats whose delete waits for its toast to end
const UNDO_MS = 6000;
function keepChat(sid) {
  state.deleting.delete(sid);
  renderSidebar();
}
async function reallyDelete(sid) {
  if (!state.deleting.has(sid)) return;
  state.deleting.delete(sid);
  if (!(await act("delete_session", { session_id: sid })) && state.sessions.has(sid)) renderSidebar();  // (refused: back)
}
addEventListener("pagehide", () => {
  for (const sid of state.deleting) {
    fetch(new URL(`v1/sessions/${encodeURIComponent(sid)}`, location.href),
          { method: "DELETE", keepalive: true, headers: { Authorization: `Bearer ${TOKEN}` } });
  }
  state.deleting.clear();
});

// A toast: what just happened, with Undo for a few seconds (longer while
// the pointer or the focus is on it). `end` runs when it goes without an
// Undo: its time is up, or another toast takes its place.
let toastTimer = null, toastEnd = null;
function toast(text, { undo, end = null }) {
  const box = $("toast");
  clearTimeout(toastTimer);
  const before = toastEnd;
  toastEnd = end;
  before?.();
  const finish = (undone) => {
    clearTimeout(toastTimer);
    box.hidden = true;
    const e = toastEnd;
    toastEnd = null;
    if (undone) undo(); else e?.();
  };
  box.replaceChildren(el("span", {}, text), el("button", { type: "button", class: "undo", onclick: () => finish(true) }, "Undo"));
  box.hidden = false;
  const wait = () => { toastTimer = setTimeout(() => (box.matches(":hover, :focus-within") ? wait() : finish(false)), UNDO_MS); };
  wait();
}
// Opening a chat whose delete waits (Back, a link): it is kept, as with Undo.
function keepIfDeleting(sid) {
  if (!state.deleting.has(sid)) return;
  keepChat(sid);
  if (toastEnd) { clearTimeout(toastTimer); toastEnd = null; $("toast").hidden = true; }
}

// -- the chat's actions: one "⋯" menu (the header's, and each row's on a desktop) --

// Open the menu for session `sid` under its trigger; the focus goes to its first item.
function openMenu(sid, trigger) {
  const row = state.sessions.get(sid);
  if (!row) return;
  closeMenu();
  state.menuFor = sid;
  state.menuFrom = trigger;
  $("act-pin").textContent = row.pinned ? "Unpin" : "Pin";
  $("act-archive").textContent = row.archived ? "Unarchive" : "Archive";
  const menu = $("menu");
  menu.hidden = false;
  trigger.setAttribute("aria-expanded", "true");
  const r = trigger.getBoundingClientRect();
  const w = menu.offsetWidth, h = menu.offsetHeight;
  menu.style.left = `${Math.max(8, Math.min(r.right - w, innerWidth - w - 8))}px`;
  menu.style.top = `${r.bottom + 4 + h > innerHeight ? Math.max(8, r.top - h - 4) : r.bottom + 4}px`;
  menu.querySelector("[role=menuitem]").focus();
}

// Close it; `back`: the focus returns to what opened it.
function closeMenu(back = false) {
  const menu = $("menu");
  if (menu.hidden) return;
  for (const b of menu.querySelectorAll("button.confirm")) disarm(b);
  menu.hidden = true;
  const from = state.menuFrom;
  from?.setAttribute("aria-expanded", "false");
  state.menuFor = null; state.menuFrom = null;
  if (back && from?.isConnected) from.focus();
}
state.menuFor = null;

$("more").addEventListener("click", (ev) => {
  if (!$("menu").hidden && state.menuFrom === ev.currentTarget) closeMenu(true); else openMenu(state.current, ev.currentTarget);
});
$("menu").addEventListener("keydown", (ev) => {  // a menu's keys: arrows, Home, End, Tab leaves it
  const items = [...$("menu").querySelectorAll("[role=menuitem]")];
  const i = items.indexOf(document.activeElement);
  const to = { ArrowDown: i + 1, ArrowUp: i - 1, Home: 0, End: items.length - 1 }[ev.key];
  if (to !== undefined) { ev.preventDefault(); items[(to + items.length) % items.length].focus(); }
  else if (ev.key === "Tab") { ev.preventDefault(); closeMenu(true); }
});
document.addEventListener("pointerdown", (ev) => {  // a press outside closes it
  if (!$("menu").hidden && !$("menu").contains(ev.target) && ev.target !== state.menuFrom) closeMenu();
});
addEventListener("resize", () => closeMenu());
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
$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  TOKEN = $("token-input").value.trim();
  sessionStorage.setItem(TOKEN_KEY, TOKEN);
  $("token-box").hidden = true;
  client.setToken(TOKEN);
  client.failedOpens = 0;
  client.reconnect();
});
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Tab" && document.body.classList.contains("drawer-open")) {  // focus stays in the open drawer
    const items = [$("menu-btn"), ...$("sidebar").querySelectorAll("button, input, select, [tabindex='0']")]
      .filter((n) => !n.disabled && n.offsetParent !== null && n.getAttribute("tabindex") !== "-1");
    const i = items.indexOf(document.activeElement);
    const next = items[(i + (ev.shiftKey ? items.length - 1 : 1) + items.length) % items.length];
    if (next) { ev.preventDefault(); next.focus(); }
    return;
  }
  const typing = /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement?.tagName || "");
  if (ev.key === "/" && !typing && !ev.ctrlKey && !ev.metaKey && !ev.altKey) {
    ev.preventDefault(); closeDrawer(); $("input").focus(); return;
  }
  if (ev.ctrlKey && ev.shiftKey && (ev.key === "O" || ev.key === "o")) { ev.preventDefault(); newChat(); return; }
  if (ev.ctrlKey && ev.key === "/") { ev.preventDefault(); $("help").showModal(); return; }
  if (ev.key === "Escape" && ev.shiftKey) { ev.preventDefault(); $("input").focus(); return; }
  if (ev.key === "Escape" && !$("help").open) onEscape(ev);
});
// Escape cancels the nearest thing, and only that: an armed confirmation, the
// search, the drawer. It stops a reply only from the composer (as the Stop
// button does): a user clearing a search or backing out of a Delete never
// loses the reply they are waiting for.
function onEscape(ev) {
  const at = document.activeElement;
  const armed = document.querySelector("button.confirm");
  if (armed) { ev.preventDefault(); disarm(armed); return; }
  if (!$("menu").hidden) { ev.preventDefault(); closeMenu(true); return; }
  if (at === $("search") && (state.search || at.value)) {
    ev.preventDefault(); at.value = ""; state.search = ""; renderSidebar(); searchMessages(); return;
  }
  if (document.body.classList.contains("drawer-open")) { closeDrawer(); $("menu-btn").focus(); return; }
  const m = runningReply();
  if (m && at === $("input")) { ev.preventDefault(); act("stop", { msg_id: m.msg_id }); }
}
setInterval(() => {  // relative times stay true
  for (const t of document.querySelectorAll("#messages time")) {
    t.textContent = ago(Date.parse(t.getAttribute("datetime")) / 1000);
  }
}, 30000);

$("input").dataset.refocus = "1";  // focus goes to the composer on load, once it is enabled
renderAll();
showConn();
client.start();
