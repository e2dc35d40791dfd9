// Built from clients/page/app.js and the TypeScript client (clients/js/) by esbuild: `python3 dev.py page`. Do not edit.
(() => {
  var __defProp = Object.defineProperty;
  var __typeError = (msg) => {
    throw TypeError(msg);
  };
  var __defNormalProp = (obj, key, value) => key in obj ? __defProp(obj, key, { enumerable: true, configurable: true, writable: true, value }) : obj[key] = value;
  var __publicField = (obj, key, value) => __defNormalProp(obj, typeof key !== "symbol" ? key + "" : key, value);
  var __accessCheck = (obj, member, msg) => member.has(obj) || __typeError("Cannot " + msg);
  var __privateGet = (obj, member, getter) => (__accessCheck(obj, member, "read from private field"), getter ? getter.call(obj) : member.get(obj));
  var __privateAdd = (obj, member, value) => member.has(obj) ? __typeError("Cannot add the same private member more than once") : member instanceof WeakSet ? member.add(obj) : member.set(obj, value);
  var __privateSet = (obj, member, value, setter) => (__accessCheck(obj, member, "write to private field"), setter ? setter.call(obj, value) : member.set(obj, value), value);
  var __privateMethod = (obj, member, method) => (__accessCheck(obj, member, "access private method"), method);
  var __privateWrapper = (obj, member, setter, getter) => ({
    set _(value) {
      __privateSet(obj, member, value, setter);
    },
    get _() {
      return __privateGet(obj, member, getter);
    }
  });

  // clients/js/src/errors.ts
  var ApiError = class extends Error {
    constructor(status, code, message) {
      super(`${code}: ${message}`);
      __publicField(this, "status");
      __publicField(this, "code");
      this.name = "ApiError";
      this.status = status;
      this.code = code;
    }
  };
  var ConnectionLost = class extends Error {
    constructor(message = "connection lost") {
      super(message);
      this.name = "ConnectionLost";
    }
  };

  // clients/js/src/types.ts
  var TERMINAL = /* @__PURE__ */ new Set(["done", "error", "aborted"]);

  // clients/js/src/socket.ts
  var PROTOCOL = "sessionlog.v1";
  function tokenProtocol(token) {
    let bin = "";
    for (const b of new TextEncoder().encode(token)) bin += String.fromCharCode(b);
    return "sessionlog.token." + btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }
  var _opts, _WS, _ws, _token, _backoff, _nextId, _waiting, _subs, _listeners, _lastFrameAt, _timer, _retry, _stopped, _lose, _SocketClient_instances, emit_fn, connect_fn, onFrame_fn, applyChange_fn, handle_fn, subscribe_fn, update_fn;
  var SocketClient = class {
    constructor(opts) {
      __privateAdd(this, _SocketClient_instances);
      __publicField(this, "url");
      __publicField(this, "online", false);
      __publicField(this, "everOpened", false);
      __publicField(this, "failedOpens", 0);
      /** The session list (id → row), kept live. */
      __publicField(this, "sessions", /* @__PURE__ */ new Map());
      /** The list's position (`rev`): a reconnect asks for what changed after it. */
      __publicField(this, "rev", null);
      __privateAdd(this, _opts);
      __privateAdd(this, _WS);
      __privateAdd(this, _ws, null);
      __privateAdd(this, _token);
      __privateAdd(this, _backoff, 250);
      __privateAdd(this, _nextId, 1);
      __privateAdd(this, _waiting, /* @__PURE__ */ new Map());
      __privateAdd(this, _subs, /* @__PURE__ */ new Map());
      __privateAdd(this, _listeners, {
        open: /* @__PURE__ */ new Set(),
        close: /* @__PURE__ */ new Set(),
        push: /* @__PURE__ */ new Set(),
        sessions: /* @__PURE__ */ new Set(),
        error: /* @__PURE__ */ new Set()
      });
      __privateAdd(this, _lastFrameAt, 0);
      __privateAdd(this, _timer, null);
      __privateAdd(this, _retry, null);
      __privateAdd(this, _stopped, false);
      __privateAdd(this, _lose, null);
      this.url = opts.url;
      __privateSet(this, _token, opts.token);
      __privateSet(this, _WS, opts.WebSocket ?? globalThis.WebSocket);
      __privateSet(this, _opts, { heartbeatMs: 15e3, requestTimeoutMs: 6e4, followSessions: true, ...opts });
    }
    /** Listen; returns the function that stops listening. */
    on(type, fn) {
      __privateGet(this, _listeners)[type].add(fn);
      return () => __privateGet(this, _listeners)[type].delete(fn);
    }
    /** Connect, and keep reconnecting until `close()`. */
    start() {
      __privateSet(this, _stopped, false);
      if (!__privateGet(this, _ws) && !__privateGet(this, _retry)) __privateMethod(this, _SocketClient_instances, connect_fn).call(this);
      const hb = __privateGet(this, _opts).heartbeatMs;
      __privateGet(this, _timer) ?? __privateSet(this, _timer, setInterval(() => {
        var _a;
        if (!this.online) return;
        const quiet = Date.now() - __privateGet(this, _lastFrameAt);
        if (quiet > 2 * hb) (_a = __privateGet(this, _lose)) == null ? void 0 : _a.call(this);
        else if (quiet > hb) this.request("list_running").catch(() => {
        });
      }, hb / 3));
      return this;
    }
    /** Stop for good: the connection closes, requests in flight are refused. */
    close() {
      var _a;
      __privateSet(this, _stopped, true);
      if (__privateGet(this, _timer)) clearInterval(__privateGet(this, _timer));
      if (__privateGet(this, _retry)) clearTimeout(__privateGet(this, _retry));
      __privateSet(this, _timer, __privateSet(this, _retry, null));
      (_a = __privateGet(this, _lose)) == null ? void 0 : _a.call(this);
    }
    /** Drop the connection now (e.g. the browser went offline): it reconnects. */
    drop() {
      var _a;
      (_a = __privateGet(this, _lose)) == null ? void 0 : _a.call(this);
    }
    /** Reconnect at once (a new token was given), not after the backoff. */
    reconnect() {
      if (__privateGet(this, _stopped)) return;
      if (__privateGet(this, _retry)) clearTimeout(__privateGet(this, _retry));
      __privateSet(this, _retry, null);
      __privateSet(this, _backoff, 0);
      if (__privateGet(this, _lose)) __privateGet(this, _lose).call(this);
      else __privateMethod(this, _SocketClient_instances, connect_fn).call(this);
    }
    /** Change the credential (the next connection uses it). */
    setToken(token) {
      __privateSet(this, _token, token);
    }
    /** One action: its answer's `data`, an ApiError with the server's code, or
     * ConnectionLost. Always settles (at the latest after `requestTimeoutMs`). */
    request(action, fields = {}) {
      return new Promise((resolve, reject) => {
        if (!this.online || !__privateGet(this, _ws)) return reject(new ConnectionLost("offline: reconnecting…"));
        const id = __privateWrapper(this, _nextId)._++;
        const timer = setTimeout(() => {
          if (__privateGet(this, _waiting).delete(id)) reject(new ConnectionLost("no answer from the server"));
        }, __privateGet(this, _opts).requestTimeoutMs);
        __privateGet(this, _waiting).set(id, {
          resolve: (v) => {
            clearTimeout(timer);
            resolve(v);
          },
          reject: (e) => {
            clearTimeout(timer);
            reject(e);
          }
        });
        __privateGet(this, _ws).send(JSON.stringify({ action, request_id: id, ...fields }));
      });
    }
    /** Ask for the list: after a reconnect only what changed since `rev` (exact
     * resume), or all of it when the server cannot say (a restart). */
    async refreshSessions() {
      const query = { include_archived: true, limit: 1e3, ...__privateGet(this, _opts).listQuery };
      const list = await this.request(
        "list_sessions",
        this.rev ? { ...query, since: this.rev } : query
      );
      if ("changes" in list) for (const ch of list.changes) __privateMethod(this, _SocketClient_instances, applyChange_fn).call(this, ch);
      else this.sessions = new Map(list.rows.map((r) => [r.id, r]));
      this.rev = list.rev;
      __privateMethod(this, _SocketClient_instances, emit_fn).call(this, "sessions");
    }
    // -- message subscriptions ------------------------------------------------------
    /** Follow a message from `offset` (the characters you have). `onUpdate` gets
     * each `msg_update` trimmed to exactly what is new (`offset` where its
     * `content_delta` starts: the end of what was delivered), across
     * reconnects, until a terminal status. Apply each as the protocol says,
     * `content = content.slice(0, offset) + content_delta`: after a server
     * crash, a tail that was delivered but never durable is taken back by an
     * update whose `offset` is below what was delivered. Subscribing again to the same message
     * with another offset replaces the subscription. */
    subscribeMessage(sessionId, msgId, opts) {
      const key = `${sessionId}/${msgId}`;
      const had = __privateGet(this, _subs).get(key);
      const offset = opts.offset ?? 0;
      if (had && had.offset === offset) {
        had.onUpdate = opts.onUpdate;
        return __privateMethod(this, _SocketClient_instances, handle_fn).call(this, key, had);
      }
      if (had) had.closed = true;
      const s = { sessionId, msgId, offset, status: "running", onUpdate: opts.onUpdate, closed: false };
      __privateGet(this, _subs).set(key, s);
      if (this.online) __privateMethod(this, _SocketClient_instances, subscribe_fn).call(this, s);
      return __privateMethod(this, _SocketClient_instances, handle_fn).call(this, key, s);
    }
    /** Is this message followed? */
    isSubscribed(sessionId, msgId) {
      return __privateGet(this, _subs).has(`${sessionId}/${msgId}`);
    }
  };
  _opts = new WeakMap();
  _WS = new WeakMap();
  _ws = new WeakMap();
  _token = new WeakMap();
  _backoff = new WeakMap();
  _nextId = new WeakMap();
  _waiting = new WeakMap();
  _subs = new WeakMap();
  _listeners = new WeakMap();
  _lastFrameAt = new WeakMap();
  _timer = new WeakMap();
  _retry = new WeakMap();
  _stopped = new WeakMap();
  _lose = new WeakMap();
  _SocketClient_instances = new WeakSet();
  emit_fn = function(type, ...args) {
    for (const fn of __privateGet(this, _listeners)[type]) fn(...args);
  };
  connect_fn = function() {
    const ws = new (__privateGet(this, _WS))(this.url, [PROTOCOL, tokenProtocol(__privateGet(this, _token))]);
    let opened = false;
    __privateSet(this, _ws, ws);
    ws.onopen = () => {
      __privateSet(this, _lastFrameAt, Date.now());
      opened = true;
      this.everOpened = true;
      this.failedOpens = 0;
      this.online = true;
      __privateSet(this, _backoff, 250);
      for (const s of __privateGet(this, _subs).values()) __privateMethod(this, _SocketClient_instances, subscribe_fn).call(this, s);
      if (__privateGet(this, _opts).followSessions) this.refreshSessions().catch(() => {
      });
      __privateMethod(this, _SocketClient_instances, emit_fn).call(this, "open");
    };
    ws.onmessage = (ev) => {
      __privateSet(this, _lastFrameAt, Date.now());
      __privateMethod(this, _SocketClient_instances, onFrame_fn).call(this, JSON.parse(String(ev.data)));
    };
    const lose = () => {
      if (__privateGet(this, _ws) !== ws) return;
      __privateSet(this, _ws, null);
      __privateSet(this, _lose, null);
      try {
        ws.close();
      } catch {
      }
      this.online = false;
      for (const [, w] of __privateGet(this, _waiting)) w.reject(new ConnectionLost());
      __privateGet(this, _waiting).clear();
      if (!opened) this.failedOpens += 1;
      __privateMethod(this, _SocketClient_instances, emit_fn).call(this, "close", { everOpened: this.everOpened, failedOpens: this.failedOpens });
      if (__privateGet(this, _stopped)) return;
      __privateSet(this, _retry, setTimeout(() => {
        __privateSet(this, _retry, null);
        if (!__privateGet(this, _stopped)) __privateMethod(this, _SocketClient_instances, connect_fn).call(this);
      }, __privateGet(this, _backoff)));
      __privateSet(this, _backoff, Math.min(Math.max(__privateGet(this, _backoff) * 2, 250), 5e3));
    };
    ws.onclose = lose;
    ws.onerror = lose;
    __privateSet(this, _lose, lose);
  };
  onFrame_fn = function(f) {
    let rid = f.request_id;
    if (f.type === "error" && rid === void 0 && __privateGet(this, _waiting).size) {
      rid = __privateGet(this, _waiting).keys().next().value;
    }
    const waiter = rid !== void 0 ? __privateGet(this, _waiting).get(rid) : void 0;
    if (waiter) {
      __privateGet(this, _waiting).delete(rid);
      if (f.type === "error") waiter.reject(new ApiError(0, f.data.code, f.data.message));
      else waiter.resolve(f.data);
      return;
    }
    if (f.type === "msg_update") __privateMethod(this, _SocketClient_instances, update_fn).call(this, f.data);
    else if (f.type === "session_created" || f.type === "session_updated" || f.type === "session_deleted") {
      __privateMethod(this, _SocketClient_instances, applyChange_fn).call(this, f);
      __privateMethod(this, _SocketClient_instances, emit_fn).call(this, "sessions");
    } else if (f.type === "error") __privateMethod(this, _SocketClient_instances, emit_fn).call(this, "error", new ApiError(0, f.data.code, f.data.message));
    __privateMethod(this, _SocketClient_instances, emit_fn).call(this, "push", f);
  };
  // -- the session list ---------------------------------------------------------
  applyChange_fn = function(ch) {
    const d = ch.data;
    if (typeof d.rev === "string") this.rev = d.rev;
    if (ch.type === "session_created") this.sessions.set(d.session.id, d.session);
    else if (ch.type === "session_deleted") this.sessions.delete(d.session_id);
    else {
      const row = this.sessions.get(d.id);
      const { rev: _rev, ...fields } = d;
      if (row) Object.assign(row, fields);
    }
  };
  handle_fn = function(key, s) {
    const client2 = this;
    return {
      sessionId: s.sessionId,
      msgId: s.msgId,
      get offset() {
        return s.offset;
      },
      get status() {
        return s.status;
      },
      close() {
        if (s.closed) return;
        s.closed = true;
        if (__privateGet(client2, _subs).get(key) === s) __privateGet(client2, _subs).delete(key);
        if (client2.online) client2.request("unsubscribe_msg", { session_id: s.sessionId, msg_id: s.msgId }).catch(() => {
        });
      }
    };
  };
  subscribe_fn = function(s) {
    this.request("subscribe_msg", { session_id: s.sessionId, msg_id: s.msgId, offset: s.offset }).catch((e) => {
      if (__privateGet(this, _subs).get(`${s.sessionId}/${s.msgId}`) !== s) return;
      if (e instanceof ApiError && e.code === "bad_offset" && s.offset > 0) {
        s.offset = 0;
        __privateMethod(this, _SocketClient_instances, subscribe_fn).call(this, s);
        return;
      }
      if (e instanceof ApiError) {
        __privateGet(this, _subs).delete(`${s.sessionId}/${s.msgId}`);
        s.closed = true;
        __privateMethod(this, _SocketClient_instances, emit_fn).call(this, "error", e);
      }
    });
  };
  update_fn = function(u) {
    const key = `${u.session_id}/${u.msg_id}`;
    const s = __privateGet(this, _subs).get(key);
    if (!s || s.closed) return;
    const end = u.offset + u.content_delta.length;
    if (u.offset > s.offset) {
      __privateMethod(this, _SocketClient_instances, subscribe_fn).call(this, s);
      return;
    }
    const delta = u.content_delta.slice(s.offset - u.offset);
    if (end < s.offset) {
      if (!TERMINAL.has(u.status)) return;
    }
    const fresh = { ...u, offset: s.offset, content_delta: end < s.offset ? "" : delta };
    s.offset = Math.max(s.offset, end);
    s.status = u.status;
    if (TERMINAL.has(u.status)) {
      s.closed = true;
      __privateGet(this, _subs).delete(key);
    }
    s.onUpdate(fresh);
  };

  // clients/page/app.js
  var TOKEN_KEY = "sessionlog-token";
  var TOKEN = (() => {
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
  var BRANDS = { wechat: "WeChat", discord: "Discord", slack: "Slack", telegram: "Telegram", whatsapp: "WhatsApp" };
  var $ = (id) => document.getElementById(id);
  var KIND_WORDS = {
    llm_reply: "writing a reply",
    tool_call: "using a tool",
    agentic_fn: "working through steps",
    task_spawn: "starting a task",
    merge: "merging"
  };
  var REASON_WORDS = {
    "stopped by user": "Stopped.",
    "worker restart": "Interrupted: the server restarted while writing this reply. Retry to write it again.",
    "server shutdown": "Interrupted: the server was shut down while writing this reply. Retry to write it again.",
    "producer lost": "Interrupted: the app writing this reply went quiet. Retry to write it again.",
    "stalled": "Interrupted: the reply stopped arriving. Retry to write it again."
  };
  function stoppedByUser(m) {
    return m.status === "aborted" && (m.metadata?.aborted_reason || m.error) === "stopped by user";
  }
  var EMPTY_CHAT = "Start a conversation. Replies stream in; reload or lose the network at any moment, nothing is lost.";
  function socketUrl() {
    const url = new URL("ws", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    url.search = "";
    url.hash = "";
    return url.href;
  }
  var client = new SocketClient({ url: socketUrl(), token: TOKEN, followSessions: false });
  var request = (action, fields = {}) => client.request(action, fields);
  var state = {
    client,
    get online() {
      return client.online;
    },
    get everOpened() {
      return client.everOpened;
    },
    get sessions() {
      return client.sessions;
    },
    // id -> row, kept live by the client
    follows: /* @__PURE__ */ new Map(),
    // msg_id -> the client's subscription (messages of the current session)
    projects: [],
    view: "active",
    search: "",
    current: null,
    // session id, or null for a draft (a draft has no id until its first message)
    messages: /* @__PURE__ */ new Map(),
    // msg_id -> message (current session)
    order: [],
    // msg ids of the current branch, in order
    nodes: /* @__PURE__ */ new Map(),
    // msg_id -> its element
    dirty: /* @__PURE__ */ new Set(),
    // msg ids whose node is behind their message (drawn on the next frame)
    running: [],
    // list_running, across sessions
    draftProject: "default",
    renameFor: null,
    // the session a rename field is open for
    renameFrom: null,
    // what had the focus when the rename opened (it gets it back)
    rowFocus: null,
    // the chat row last focused (the list's one Tab stop)
    refocus: null,
    // a branch switch under way: {msgId, key} of the control to focus when drawn
    parsed: 0
    // characters of Markdown parsed so far
  };
  window.sessionlog = state;
  var md = window.markdownit({
    html: false,
    linkify: true,
    breaks: false,
    highlight: (code, lang) => {
      if (lang && window.hljs?.getLanguage(lang)) {
        try {
          return window.hljs.highlight(code, { language: lang, ignoreIllegals: true }).value;
        } catch {
        }
      }
      return "";
    }
  });
  for (const rule of ["th_open", "td_open"]) {
    md.renderer.rules[rule] = (tokens, i, opts, env, self) => {
      const t = tokens[i], align = /text-align:\s*(left|right|center)/.exec(t.attrGet("style") || "");
      t.attrs = (t.attrs || []).filter(([k]) => k !== "style");
      if (align) t.attrJoin("class", `align-${align[1]}`);
      return self.renderToken(tokens, i, opts);
    };
  }
  md.block.ruler.before("fence", "math_block", (st, start, end, silent) => {
    const first = st.src.slice(st.bMarks[start] + st.tShift[start], st.eMarks[start]).trim();
    const open = first.startsWith("$$") ? "$$" : first.startsWith("\\[") ? "\\[" : null;
    if (!open) return false;
    const close = open === "$$" ? "$$" : "\\]";
    let body = first.slice(2), line = start, found = false;
    if (body.trimEnd().endsWith(close) && body.trim().length > 2) {
      body = body.trimEnd().slice(0, -2);
      found = true;
    }
    while (!found && ++line < end) {
      const text = st.src.slice(st.bMarks[line] + st.tShift[line], st.eMarks[line]);
      if (text.trimEnd().endsWith(close)) {
        body += "\n" + text.trimEnd().slice(0, -2);
        found = true;
      } else body += "\n" + text;
    }
    if (!found) return false;
    if (silent) return true;
    const t = st.push("math_block", "div", 0);
    t.content = body.trim();
    t.map = [start, line + 1];
    t.block = true;
    st.line = line + 1;
    return true;
  }, { alt: ["paragraph"] });
  md.inline.ruler.after("escape", "math_inline", (st, silent) => {
    const src = st.src, at = st.pos;
    let open, close;
    if (src.startsWith("\\(", at)) {
      open = "\\(";
      close = "\\)";
    } else if (src[at] === "$" && src[at + 1] !== "$" && src[at + 1] && !/\s/.test(src[at + 1])) {
      open = "$";
      close = "$";
    } else return false;
    let end = src.indexOf(close, at + open.length);
    while (close === "$" && end > 0 && (/\s/.test(src[end - 1]) || /\d/.test(src[end + 1] || ""))) end = src.indexOf("$", end + 1);
    if (end < 0) return false;
    if (!silent) {
      const t = st.push("math_inline", "span", 0);
      t.content = src.slice(at + open.length, end);
    }
    st.pos = end + close.length;
    return true;
  });
  md.renderer.rules.math_inline = (tokens, i) => `<span class="math" data-tex="${md.utils.escapeHtml(tokens[i].content)}">${md.utils.escapeHtml(tokens[i].content)}</span>`;
  md.renderer.rules.math_block = (tokens, i) => `<div class="math display" data-tex="${md.utils.escapeHtml(tokens[i].content)}">${md.utils.escapeHtml(tokens[i].content)}</div>
`;
  var katexLoading = null;
  function typeset(box) {
    const todo = [...box.querySelectorAll(".math:not(.typeset)")];
    if (!todo.length) return;
    if (!window.katex) {
      katexLoading ?? (katexLoading = new Promise((ok, fail) => {
        document.head.append(el("link", { rel: "stylesheet", href: "static/vendor/katex/katex.min.css" }));
        const sc = el("script", { src: "static/vendor/katex/katex.min.js" });
        sc.onload = ok;
        sc.onerror = fail;
        document.head.append(sc);
      }));
      katexLoading.then(() => typeset(box), () => {
        katexLoading = null;
      });
      return;
    }
    for (const n of todo) {
      try {
        window.katex.render(n.dataset.tex, n, { displayMode: n.classList.contains("display"), throwOnError: false, trust: false });
      } catch {
      }
      n.classList.add("typeset");
    }
  }
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
  var PURIFY = { RETURN_DOM_FRAGMENT: true, FORBID_TAGS: ["style", "svg", "math", "form", "input"], FORBID_ATTR: ["style"] };
  function plainText(text) {
    const frag = DOMPurify.sanitize(md.render(text), PURIFY);
    for (const b of frag.querySelectorAll("p, li, h1, h2, h3, h4, h5, h6, pre, tr, blockquote")) b.append(" ");
    return frag.textContent.replace(/\s+/g, " ").trim();
  }
  state.plainText = plainText;
  function markdownBlocks(text, env = {}) {
    if (!text) return [];
    state.parsed += text.length;
    const frag = DOMPurify.sanitize(md.render(text, env), PURIFY);
    for (const li of frag.querySelectorAll("li")) {
      const first = li.firstChild?.nodeName === "P" ? li.firstChild.firstChild : li.firstChild;
      const m = first?.nodeType === 3 && /^\[( |x|X)\]\s/.exec(first.textContent);
      if (!m) continue;
      first.textContent = first.textContent.slice(m[0].length);
      first.before(el("input", { type: "checkbox", disabled: true, checked: m[1] !== " ", "aria-label": m[1] !== " " ? "done" : "to do" }));
      li.classList.add("task");
    }
    for (const t of frag.querySelectorAll("table, pre")) t.tabIndex = 0;
    for (const img of frag.querySelectorAll("img")) {
      let host = "";
      try {
        host = new URL(img.getAttribute("src") || "", location.href).host;
      } catch {
      }
      const what = img.getAttribute("alt") || "an image";
      const link = img.getAttribute("src") && /^https?:/.test(img.getAttribute("src")) ? el("a", { href: img.getAttribute("src"), target: "_blank", rel: "noopener noreferrer" }, "open it") : null;
      img.replaceWith(el("span", { class: "img-blocked" }, `Image not shown: ${what}${host ? ` (from ${host})` : ""}`, link ? " · " : "", link));
    }
    return [...frag.childNodes].filter((n) => n.nodeType === 1 || n.textContent.trim());
  }
  function renderMarkdownInto(box, text, refs = null) {
    let done = box._md;
    if (!done || !text.startsWith(done.src) || box.childNodes.length < done.count || refs) {
      done = { src: "", count: 0, refs: refs || {} };
    }
    const cut = safeCut(text, done.src.length);
    const env = { references: { ...done.refs } };
    const finished = markdownBlocks(text.slice(done.src.length, cut), env);
    const known = { ...env.references };
    const tail = markdownBlocks(text.slice(cut), env);
    if (!refs && Object.keys(env.references).some((k) => !(k in done.refs)) && (done.count || finished.length)) {
      const later = Object.keys(env.references).some((k) => !(k in known));
      const unknownBefore = Object.keys(known).some((k) => !(k in done.refs));
      if (later || unknownBefore && done.count) return renderMarkdownInto(box, text, env.references);
    }
    const fresh = [...finished, ...tail];
    const old = [...box.childNodes].slice(done.count);
    const sel = window.getSelection();
    const held = (n) => sel && sel.rangeCount > 0 && !sel.isCollapsed && sel.containsNode(n, true);
    box._pending = null;
    fresh.forEach((n, i) => {
      const html = n.outerHTML ?? n.textContent;
      if (i < old.length && old[i]._html === html) return;
      if (i < old.length && held(old[i])) {
        box._pending = text;
        heldBoxes.add(box);
        return;
      }
      if (n.tagName === "PRE") n = codeBlock(n);
      n._html = html;
      if (i < old.length) old[i].replaceWith(n);
      else box.append(n);
    });
    for (const n of old.slice(fresh.length)) {
      if (held(n)) {
        box._pending = text;
        heldBoxes.add(box);
      } else n.remove();
    }
    box._md = box._pending === null ? { src: text.slice(0, cut), count: done.count + finished.length, refs: known } : done;
  }
  var FENCE = /^( {0,3})(`{3,}|~{3,})/;
  var JOINS = /^(\s|[-+*]\s|\d{1,9}[.)]\s|[-+*]$|\d{1,9}[.)]$)/;
  var BLANK = /^[ \t]*$/;
  function safeCut(text, from) {
    let cut = from, fence = null, blank = false, at = from;
    for (; ; ) {
      const nl = text.indexOf("\n", at);
      if (nl < 0) return cut;
      const line = text.slice(at, nl);
      let f = FENCE.exec(line);
      if (f && f[2][0] === "`" && line.slice(f[0].length).includes("`")) f = null;
      if (f && f[1]) return cut;
      if (fence === "$$" || fence === "\\[") {
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
  state.markdownBlocks = markdownBlocks;
  var heldBoxes = /* @__PURE__ */ new Set();
  document.addEventListener("selectionchange", () => {
    for (const box of [...heldBoxes]) {
      heldBoxes.delete(box);
      if (box._pending != null && box.isConnected) keepBottom(() => {
        renderMarkdownInto(box, box._pending);
        typeset(box);
      });
    }
  });
  function codeBlock(pre) {
    const lang = /language-([\w+#.-]+)/.exec(pre.querySelector("code")?.className || "")?.[1] || "code";
    return el(
      "div",
      { class: "code" },
      el(
        "div",
        { class: "code-head" },
        el("span", { class: "code-lang" }, lang),
        copyButton(() => pre.querySelector("code")?.textContent ?? pre.textContent, lang === "code" ? " code" : ` ${lang} code`)
      ),
      pre
    );
  }
  function copyButton(text, more) {
    const shown = el("span", {}, "Copy");
    const b = el("button", { class: "copy", type: "button" }, shown, el("span", { class: "visually-hidden" }, more));
    b.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(text());
        shown.textContent = "Copied";
      } catch {
        shown.textContent = "Select and copy";
      }
      setTimeout(() => {
        shown.textContent = "Copy";
      }, 1500);
    });
    return b;
  }
  client.on("open", async () => {
    $("token-box").hidden = true;
    showConn();
    await rejoinAll();
    if (state.queued && state.online) sendQueued();
  });
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
      if (state.current === q.sid) {
        $("input").value = $("input").value ? `${q.text}
${$("input").value}` : q.text;
        growInput();
      } else stashDraft(q.sid, q.text);
    }
  }
  var QUEUED_KEY = "sessionlog-queued";
  function setQueued(q) {
    state.queued = q;
    try {
      if (q) sessionStorage.setItem(QUEUED_KEY, JSON.stringify(q));
      else sessionStorage.removeItem(QUEUED_KEY);
    } catch {
    }
  }
  try {
    state.queued = JSON.parse(sessionStorage.getItem(QUEUED_KEY) || "null");
  } catch {
    state.queued = null;
  }
  function stashDraft(sid, text) {
    const key = DRAFT_KEY + (sid ?? "new"), had = sessionStorage.getItem(key);
    try {
      sessionStorage.setItem(key, had ? `${text}
${had}` : text);
    } catch {
    }
  }
  client.on("close", ({ failedOpens }) => {
    showConn();
    if (failedOpens >= 3) checkRefused();
  });
  client.on("push", onFrame);
  client.on("sessions", () => renderSidebar());
  client.on("error", (e) => {
    if (e.code !== "unknown_message") showError(e.message);
  });
  window.addEventListener("offline", () => client.drop());
  async function checkRefused() {
    try {
      const r = await fetch(new URL("static/app.js", location.href), { method: "HEAD", cache: "no-store" });
      if (r.ok && !state.online && $("token-box").hidden) {
        $("token-box").hidden = false;
        $("token-input").focus();
      }
    } catch {
    }
  }
  function onFrame(f) {
    switch (f.type) {
      case "message_created":
        return addMessage(f.data.session_id, f.data.message);
      case "session_updated":
        if (f.data.id === state.current) {
          renderHeader();
          seen();
        }
        if ("status" in f.data) refreshRunning();
        return;
      case "session_deleted":
        if (f.data.session_id === state.current) {
          showError("That chat no longer exists.");
          openDraft();
        }
        refreshRunning();
        return;
      case "head_moved":
        if (f.data.session_id === state.current) openSession(state.current, { keep: true });
        return;
      case "projects_list":
        state.projects = f.data.projects;
        return renderProject();
    }
  }
  async function rejoinAll() {
    try {
      await client.refreshSessions();
      state.projects = (await request("list_projects")).projects;
      renderProject();
      refreshRunning();
      const sid = state.wanted || state.current || new URLSearchParams(location.hash.slice(1)).get("s");
      if (sid && state.sessions.has(sid)) await openSession(sid, { keep: sid === state.current, push: false });
      else if (sid) {
        showError("That chat no longer exists.");
        openDraft();
      } else if (!state.current) openDraft();
    } catch (e) {
      showError(e.message);
    }
  }
  async function refreshRunning(tries = 10) {
    try {
      state.running = (await request("list_running")).running || [];
    } catch {
      return;
    }
    renderRunning();
    const listed = new Set(state.running.map((r) => r.session_id));
    const rows = [...state.sessions.values()].filter((r) => r.status === "running" && !r.damaged);
    if (tries > 0 && rows.some((r) => !listed.has(r.id))) setTimeout(() => refreshRunning(tries - 1), 300);
  }
  async function openSession(sid, { keep = false, push = !keep } = {}) {
    const had = keep && sid === state.current ? state.messages : /* @__PURE__ */ new Map();
    const before = state.current;
    if (!state.online && sid !== before) {
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
      if (!state.online) {
        state.wanted = sid;
        showError(e.message);
        return;
      }
      showError(e.code === "unknown_session" ? "That chat no longer exists." : e.message);
      openDraft();
      return;
    }
    if (state.current !== sid) return;
    state.sessions.set(sid, loaded.session);
    if (!keep) state.nodes = /* @__PURE__ */ new Map();
    state.messages = /* @__PURE__ */ new Map();
    state.order = [];
    for (const m of loaded.messages) {
      const mine = had.get(m.msg_id);
      if (mine && m.status === "running" && mine.content.length > m.content.length && mine.content.startsWith(m.content)) {
        m.content = mine.content;
      }
      m._said = mine?._said ?? m.content.length;
      state.messages.set(m.msg_id, m);
      state.dirty.add(m.msg_id);
      state.order.push(m.msg_id);
    }
    for (const m of loaded.messages) if (isOpen(m)) subscribe(m);
    if (!keep) state.stick = true;
    renderAll();
    seen();
  }
  function subscribe(m) {
    state.follows.set(m.msg_id, client.subscribeMessage(
      state.current,
      m.msg_id,
      { offset: m.content.length, onUpdate: patch }
    ));
  }
  function isOpen(m) {
    return m.status === "running" || m.status === "pending";
  }
  function addMessage(sid, m) {
    if (sid !== state.current || state.messages.has(m.msg_id)) return;
    state.messages.set(m.msg_id, m);
    if (!m.caller && m.parent_id !== void 0) {
      const i = state.order.indexOf(m.parent_id);
      if (m.parent_id && i >= 0) {
        const keep = new Set(state.order.slice(0, i + 1));
        state.order = state.order.filter((id) => keep.has(id) || state.messages.get(id)?.caller);
      }
      for (const sib of m.siblings || []) {
        const s = state.messages.get(sib);
        if (s) {
          s.siblings = m.siblings;
          state.dirty.add(sib);
        }
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
    if (u.offset > m.content.length) {
      openSession(state.current, { keep: true });
      return;
    }
    const wasOpen = isOpen(m);
    m.content = m.content.slice(0, u.offset) + u.content_delta;
    m.status = u.status;
    if (u.tree !== null && u.tree !== void 0) m.metadata = { ...m.metadata, context_tree: u.tree };
    if (u.aborted_reason) m.metadata = { ...m.metadata, aborted_reason: u.aborted_reason };
    if (u.error) m.error = u.error;
    if (!isOpen(m)) state.follows.delete(m.msg_id);
    announce(m);
    if (wasOpen && !isOpen(m)) {
      keepBottom(() => drawNode(m));
      renderComposer();
      return;
    }
    state.dirty.add(m.msg_id);
    scheduleDraw();
  }
  var drawScheduled = false;
  function scheduleDraw() {
    if (drawScheduled) return;
    drawScheduled = true;
    requestAnimationFrame(() => {
      drawScheduled = false;
      const dirty = [...state.dirty];
      state.dirty.clear();
      keepBottom(() => {
        for (const id of dirty) {
          const m = state.messages.get(id);
          if (m) drawNode(m);
        }
      });
    });
  }
  function announce(m) {
    if (m.role !== "assistant" || m.caller) return;
    const said = m._said ?? 0;
    const upto = isOpen(m) ? m.content.lastIndexOf("\n\n") : m.content.length;
    if (upto <= said) return;
    const text = plainText(m.content.slice(said, upto));
    m._said = upto;
    if (text) $("announce").textContent = text;
    if (!isOpen(m)) {
      const end = m.status === "done" ? "Reply finished." : stoppedByUser(m) ? "Reply stopped." : m.status === "error" ? "Reply failed." : "Reply interrupted.";
      setTimeout(() => {
        $("announce").textContent = end;
      }, 50);
    }
  }
  function openDraft({ push = false } = {}) {
    closeRename();
    if (state.current !== null) {
      saveDraft();
      state.current = null;
      restoreDraft();
    }
    state.wanted = null;
    state.messages = /* @__PURE__ */ new Map();
    state.order = [];
    state.nodes = /* @__PURE__ */ new Map();
    state.stick = true;
    go("", push);
    renderAll();
  }
  function el(tag, attrs = {}, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === void 0 || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k !== null && k !== void 0) e.append(k);
    return e;
  }
  function rowName(row) {
    return row.title || row.preview || "New chat";
  }
  function displayTitle(row) {
    const brand = BRANDS[row.source];
    return brand ? [el("span", { class: "brand-prefix" }, `[${brand}] `), rowName(row)] : [rowName(row)];
  }
  function ago(seconds) {
    if (!seconds) return "";
    const d = Date.now() / 1e3 - seconds;
    if (d < 45) return "just now";
    if (d < 3600) return `${Math.round(d / 60)} min ago`;
    if (d < 86400) return `${Math.round(d / 3600)} h ago`;
    if (d < 86400 * 7) return `${Math.round(d / 86400)} d ago`;
    return new Date(seconds * 1e3).toLocaleDateString();
  }
  function timeEl(seconds) {
    if (!seconds) return null;
    const at = new Date(seconds * 1e3);
    return el("time", { datetime: at.toISOString(), title: at.toLocaleString() }, ago(seconds));
  }
  var rowNodes = /* @__PURE__ */ new Map();
  var noneNode = null;
  function visibleRows() {
    const q = state.search.trim().toLowerCase();
    const rows = [...state.sessions.values()].filter((r) => !state.deleting.has(r.id) && (state.view === "all" || (state.view === "archived" ? r.archived : !r.archived)) && (!q || rowName(r).toLowerCase().includes(q) || (r.preview || "").toLowerCase().includes(q)));
    rows.sort((a, b) => b.pinned - a.pinned || b.updated_at - a.updated_at || (a.id < b.id ? -1 : 1));
    return rows;
  }
  function rowNode(r) {
    let li = rowNodes.get(r.id);
    if (!li) {
      li = el(
        "li",
        { "data-id": r.id },
        el("button", { class: "row", type: "button", tabindex: "-1", onclick: () => openSession(r.id) }),
        el("button", {
          class: "row-more",
          type: "button",
          tabindex: "-1",
          "aria-haspopup": "menu",
          "aria-expanded": "false",
          "aria-controls": "menu",
          onclick: (ev) => openMenu(r.id, ev.currentTarget)
        }, "⋯")
      );
      rowNodes.set(r.id, li);
    }
    const current = r.id === state.current;
    const when = ago(r.updated_at);
    const sig = JSON.stringify([
      rowName(r),
      r.source,
      r.preview,
      r.pinned,
      r.status,
      r.archived,
      r.damaged,
      r.unread,
      current,
      when,
      r.title
    ]);
    if (li._sig === sig) return li;
    li._sig = sig;
    li.className = `${current ? "current" : ""}${r.unread ? " unread" : ""}`;
    const b = li.firstChild;
    if (current) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
    li.lastChild.setAttribute("aria-label", `Actions for ${rowName(r)}`);
    b.title = r.title && r.preview ? r.preview : "";
    b.replaceChildren(
      el(
        "span",
        { class: "row-title" },
        r.unread ? el("span", { class: "dot", "aria-hidden": "true" }) : null,
        r.unread ? el("span", { class: "visually-hidden" }, "New reply: ") : null,
        r.pinned ? el("span", { class: "pin", "aria-label": "pinned" }, "★ ") : null,
        ...displayTitle(r),
        r.status === "running" ? el("span", { class: "badge running" }, "running") : null,
        r.archived ? el("span", { class: "badge archived" }, "archived") : null,
        r.damaged ? el("span", { class: "badge error" }, "damaged") : null
      ),
      el("span", { class: "row-time" }, when)
    );
    return li;
  }
  function groupOf(r, now = Date.now()) {
    if (r.pinned) return "Pinned";
    const day = new Date(now);
    day.setHours(0, 0, 0, 0);
    const t = r.updated_at * 1e3, start = day.getTime(), DAY = 864e5;
    return t >= start ? "Today" : t >= start - DAY ? "Yesterday" : t >= start - 7 * DAY ? "Previous 7 days" : t >= start - 30 * DAY ? "Previous 30 days" : "Older";
  }
  state.groupOf = groupOf;
  var groupNodes = /* @__PURE__ */ new Map();
  function groupNode(label) {
    let li = groupNodes.get(label);
    if (!li) {
      li = el("li", { class: "group" }, el("h2", {}, label));
      groupNodes.set(label, li);
    }
    return li;
  }
  var PAGE = 100;
  state.drawn = PAGE;
  var moreNode = null;
  function moreRows() {
    if (!moreNode) {
      moreNode = el("li", { class: "more-rows" }, el("button", {
        type: "button",
        class: "link",
        tabindex: "-1",
        onclick: () => {
          state.drawn += PAGE;
          renderSidebar();
        }
      }, "Show more chats"));
      new IntersectionObserver((seen2) => {
        if (seen2.some((e) => e.isIntersecting)) {
          state.drawn += PAGE;
          renderSidebar();
        }
      }, { root: $("session-panel"), rootMargin: "200px" }).observe(moreNode);
    }
    return moreNode;
  }
  function renderSidebar() {
    const ul = $("sessions");
    const focused = document.activeElement;
    for (const [id, li] of rowNodes) if (!state.sessions.has(id)) {
      rowNodes.delete(id);
      li.remove();
    }
    const rows = visibleRows();
    const want = [];
    let group = null;
    const now = Date.now();
    for (const r of rows.slice(0, state.drawn)) {
      const g = groupOf(r, now);
      if (g !== group) {
        want.push(groupNode(g));
        group = g;
      }
      want.push(rowNode(r));
    }
    if (rows.length > state.drawn) want.push(moreRows());
    if (!want.length) {
      const q = state.search.trim();
      const why = !state.everOpened ? "Not connected yet: your chats show here once the page reaches the server." : q ? `No chats match “${q}”.` : state.view === "archived" ? "No archived chats." : state.view === "all" ? "No chats yet." : "No chats yet: write a message to start one.";
      noneNode ?? (noneNode = el("li", { class: "none" }));
      if (noneNode.textContent !== why) noneNode.textContent = why;
      want.push(noneNode);
    }
    const at = focused && ul.contains(focused) ? [...ul.querySelectorAll("button.row")].indexOf(focused.closest("li")?.firstChild) : -1;
    want.forEach((n, i) => {
      if (ul.children[i] !== n) ul.insertBefore(n, ul.children[i] || null);
    });
    while (ul.children.length > want.length) ul.lastChild.remove();
    if (focused && focused !== document.activeElement && focused.isConnected) focused.focus({ preventScroll: true });
    else if (at >= 0 && !focused.isConnected) {
      const rows2 = ul.querySelectorAll("button.row");
      (rows2[Math.min(at, rows2.length - 1)] || $("search")).focus({ preventScroll: true });
    }
    rovingStop();
    for (const b of $("views").children) {
      const on = b.dataset.view === state.view;
      b.setAttribute("aria-selected", String(on));
      b.tabIndex = on ? 0 : -1;
      if (on) $("session-panel").setAttribute("aria-labelledby", b.id);
    }
  }
  function rovingStop() {
    const rows = [...$("sessions").querySelectorAll("button.row")];
    const pick = rows.find((b) => b === document.activeElement) || rows.find((b) => b.parentNode.dataset.id === state.rowFocus) || rows.find((b) => b.parentNode.dataset.id === state.current) || rows[0];
    for (const b of rows) {
      const t = b === pick ? 0 : -1;
      if (b.tabIndex !== t) b.tabIndex = t;
    }
    return pick;
  }
  $("sessions").addEventListener("focusin", (ev) => {
    const li = ev.target.closest("li[data-id]");
    if (li) {
      state.rowFocus = li.dataset.id;
      rovingStop();
    }
  });
  $("sessions").addEventListener("keydown", (ev) => {
    const more = ev.target.closest("li")?.querySelector(".row-more");
    if (ev.key === "ArrowRight" && ev.target.matches("button.row") && more?.offsetParent) {
      ev.preventDefault();
      more.focus();
      return;
    }
    if (ev.key === "ArrowLeft" && ev.target === more) {
      ev.preventDefault();
      ev.target.previousSibling.focus();
      return;
    }
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
    if (!n) {
      list.hidden = true;
      btn.setAttribute("aria-expanded", "false");
    }
    list.replaceChildren(...state.running.map((r) => {
      const row = state.sessions.get(r.session_id);
      return el("li", {}, el(
        "button",
        { type: "button", class: "row", onclick: () => {
          list.hidden = true;
          btn.setAttribute("aria-expanded", "false");
          openSession(r.session_id);
        } },
        `${row ? rowName(row) : r.session_id} · ${KIND_WORDS[r.kind] || r.kind.replaceAll("_", " ")}`
      ));
    }));
  }
  function renderHeader() {
    const row = state.current ? state.sessions.get(state.current) : null;
    $("title").replaceChildren(...row ? displayTitle(row) : ["New chat"]);
    document.title = row ? `${rowName(row)} — sessionlog` : "New chat — sessionlog";
    $("more").hidden = !row;
    if (!row && state.menuFor === null) closeMenu();
    renderProject();
  }
  state.stick = true;
  var lastTop = 0;
  function fromBottom() {
    const b = $("messages");
    return b.scrollHeight - b.scrollTop - b.clientHeight;
  }
  function keepBottom(fn) {
    fn();
    if (state.stick) {
      const box = $("messages");
      box.scrollTop = box.scrollHeight;
      lastTop = box.scrollTop;
    }
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
    else if (box.scrollTop < lastTop - 1) state.stick = false;
    lastTop = box.scrollTop;
    renderJump();
  }, { passive: true });
  $("messages").addEventListener("wheel", (ev) => {
    if (ev.deltaY < 0) state.stick = false;
  }, { passive: true });
  $("jump").addEventListener("click", () => {
    toBottom(true);
    $("input").focus({ preventScroll: true });
  });
  function seen() {
    const row = state.current && state.sessions.get(state.current);
    if (row?.unread && document.visibilityState === "visible" && state.online) {
      row.unread = false;
      request("set_unread", { session_id: row.id, unread: false }).catch(() => {
        row.unread = true;
      });
      renderSidebar();
    }
  }
  document.addEventListener("visibilitychange", seen);
  function renderMessages() {
    const box = $("messages");
    const inside = /* @__PURE__ */ new Map();
    const want = [];
    for (const m of state.order.map((id) => state.messages.get(id)).filter(Boolean)) {
      let node = state.nodes.get(m.msg_id);
      if (!node) {
        node = buildNode(m);
        state.nodes.set(m.msg_id, node);
      } else if (state.dirty.has(m.msg_id)) drawNode(m);
      const host = m.caller && m.kind !== "relocate" ? state.nodes.get(m.caller) : null;
      if (host?.querySelector(":scope > .tools")) {
        if (!inside.has(host)) inside.set(host, []);
        inside.get(host).push(node);
      } else want.push(node);
    }
    for (const [host, blocks] of inside) {
      const tools = host.querySelector(":scope > .tools");
      blocks.forEach((n, i) => {
        if (tools.children[i] !== n) tools.insertBefore(n, tools.children[i] || null);
      });
    }
    if (!want.length) want.push(el("div", { id: "empty", class: "empty" }, EMPTY_CHAT));
    keepBottom(() => {
      const have = [...box.children];
      if (have.length === want.length && have.every((n, i) => n === want[i])) return;
      for (const n of have) if (!want.includes(n)) n.remove();
      want.forEach((n, i) => {
        if (box.children[i] !== n) box.insertBefore(n, box.children[i] || null);
      });
    });
    if (state.refocus && focusLost()) focusControl(state.refocus.msgId, state.refocus.key);
  }
  function blockLabel(m) {
    const open = isOpen(m);
    if (m.kind === "tool_call") {
      const tool = m.metadata?.tool;
      if (tool === "search") return open ? "Searching…" : "Searched";
      return tool ? open ? `Using ${tool}…` : `Used ${tool}` : open ? "Using a tool…" : "Used a tool";
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
    return el("ul", { class: "tree" }, el(
      "li",
      { class: t.status || "" },
      String(t.name ?? "function"),
      kids.length ? el("ul", { class: "tree" }, ...kids.map((k) => el("li", { class: k.status || "" }, String(k.name ?? "")))) : null
    ));
  }
  function buildNode(m) {
    const node = m.caller ? el(
      "details",
      { class: "block", "data-msg": m.msg_id },
      el("summary", { class: "head" }),
      el("div", { class: "tree-box" }),
      el("pre", { class: "text" }),
      el("div", { class: "meta" })
    ) : el(
      "article",
      { class: "msg", "data-msg": m.msg_id },
      el("div", { class: "who" }),
      el("div", { class: "bubble" }),
      el("div", { class: "tools" }),
      el("div", { class: "meta" })
    );
    node._content = null;
    drawNode(m, node);
    return node;
  }
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
      node.querySelector(".tree-box").replaceChildren(...tree ? [tree] : []);
      const pre = node.querySelector(".text");
      pre.hidden = !!tree;
      if (pre.textContent !== m.content) {
        if (m.content.startsWith(pre.textContent)) pre.append(m.content.slice(pre.textContent.length));
        else pre.textContent = m.content;
      }
      node.querySelector(":scope > .meta").replaceChildren(...reason && m.status !== "done" ? [el("div", { class: stopped ? "why stopped" : "why" }, REASON_WORDS[reason] || reason)] : []);
      return;
    }
    const who = m.role === "user" ? "You" : m.role === "assistant" ? "Assistant" : m.role;
    node.querySelector(":scope > .who").replaceChildren(who, " ", timeEl(m.started_at) || "", badge || "");
    const bubble = node.querySelector(":scope > .bubble");
    if (node._content !== m.content) {
      if (m.role === "assistant") {
        renderMarkdownInto(bubble, m.content);
        typeset(bubble);
      } else bubble.textContent = m.content;
      node._content = m.content;
    }
    const meta = node.querySelector(":scope > .meta");
    const key = meta.contains(document.activeElement) && document.activeElement.dataset.key;
    meta.replaceChildren(...metaParts(m, reason));
    if (key) focusControl(m.msg_id, key);
  }
  function focusControl(msgId, key) {
    const node = state.nodes.get(msgId);
    const order = { prev: ["prev", "next"], next: ["next", "prev"], stop: ["stop", "retry"], retry: ["retry", "stop"] }[key] || [key];
    for (const k of order) {
      const b = node?.querySelector(`:scope > .meta [data-key="${k}"]`);
      if (b && !b.disabled) {
        b.focus({ preventScroll: true });
        return true;
      }
    }
    return false;
  }
  function metaParts(m, reason) {
    const out = [];
    if (m.status === "aborted" || m.status === "error") {
      const words = m.status === "error" ? `Failed: ${reason || "the reply could not be written"}` : REASON_WORDS[reason] || `Interrupted: ${reason || "it ended early"}`;
      out.push(el("div", { class: stoppedByUser(m) ? "why stopped" : "why" }, words));
    }
    const controls = [];
    const sibs = m.siblings || [];
    if (sibs.length > 1) {
      const i = sibs.indexOf(m.msg_id);
      controls.push(el(
        "span",
        { class: "branches", role: "group", "aria-label": "versions of this reply" },
        el("button", {
          type: "button",
          "aria-label": "previous version",
          disabled: i <= 0,
          "data-key": "prev",
          onclick: () => switchBranch(sibs[i - 1], "prev")
        }, "‹"),
        el("span", { class: "branch-pos" }, `${i + 1}/${sibs.length}`),
        el("button", {
          type: "button",
          "aria-label": "next version",
          disabled: i >= sibs.length - 1,
          "data-key": "next",
          onclick: () => switchBranch(sibs[i + 1], "next")
        }, "›")
      ));
    }
    if (m.role === "assistant" && !isOpen(m) && m.content) {
      const copy = copyButton(() => m.content, " the whole reply (Markdown)");
      copy.dataset.key = "copy";
      controls.push(copy);
    }
    if (m.role === "assistant" && isOpen(m)) {
      controls.push(el("button", {
        class: "stop",
        type: "button",
        "data-key": "stop",
        onclick: () => act("stop", { msg_id: m.msg_id })
      }, "Stop"));
    } else if (m.role === "assistant") {
      controls.push(el(
        "button",
        { class: "retry", type: "button", "data-key": "retry", onclick: () => retry(m.msg_id) },
        m.status === "done" ? "Regenerate" : "Retry"
      ));
    }
    if (controls.length) out.push(el("div", { class: "controls" }, ...controls));
    return out;
  }
  function currentProject() {
    const row = state.current ? state.sessions.get(state.current) : null;
    const pid = row ? row.project_id || "default" : state.draftProject;
    return state.projects.find((p) => p.id === pid) || { id: pid, name: pid, path: "", path_missing: false };
  }
  function renderProject() {
    const row = state.current ? state.sessions.get(state.current) : null;
    const frozen = row && row.message_count > 0;
    const p = currentProject();
    const chip = $("project-chip"), picker = $("project-picker");
    chip.hidden = !frozen;
    picker.hidden = !!frozen;
    chip.replaceChildren(
      `Project: ${p.name}`,
      ...p.path ? [el("span", { class: "chip-path" }, ` · ${p.path}`)] : [],
      ...p.path_missing ? [" (folder not found)"] : []
    );
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
  function renderComposer() {
    const running = state.online && runningReply();
    const send2 = $("send");
    send2.textContent = running ? "Stop" : state.queued ? "Unqueue" : "Send";
    send2.classList.toggle("danger", !!running);
    send2.classList.toggle("queued", !!state.queued);
    send2.disabled = state.sending || !state.online && !!runningReply();
    send2.title = state.queued ? "Take the queued message back into the box" : "";
    $("queued-note").hidden = !state.queued;
    if (state.queued) $("queued-note").textContent = `Offline: “${state.queued.text.trim().slice(0, 80)}” is queued and goes when the connection is back.`;
    if (state.online && $("input").dataset.refocus) {
      delete $("input").dataset.refocus;
      if (document.activeElement === document.body) $("input").focus();
    }
  }
  function renderAll() {
    renderSidebar();
    renderHeader();
    renderMessages();
    renderComposer();
  }
  function showConn() {
    const c = $("conn");
    c.textContent = state.online ? "live" : "reconnecting…";
    c.className = `conn ${state.online ? "online" : "offline"}`;
    document.body.classList.toggle("offline", !state.online);
    const banner = $("offline-banner");
    banner.hidden = state.online || !state.everOpened;
    banner.textContent = "Connection lost: reconnecting… You can keep typing: a message you send now goes when the connection is back, and what the server wrote meanwhile shows then.";
    renderSidebar();
    renderComposer();
  }
  function showError(msg) {
    $("error").textContent = msg || "";
    if (msg) setTimeout(() => {
      if ($("error").textContent === msg) $("error").textContent = "";
    }, 6e3);
  }
  async function act(action, fields = {}) {
    try {
      return await request(action, { session_id: state.current, ...fields });
    } catch (e) {
      showError(e.message);
      return null;
    }
  }
  async function retry(msgId) {
    const r = await act("retry", { msg_id: msgId });
    if (r) await openSession(state.current, { keep: true });
  }
  async function switchBranch(msgId, key) {
    const mine = state.refocus = key ? { msgId, key } : null;
    try {
      const r = await act("switch_branch", { msg_id: msgId });
      if (r) await openSession(state.current, { keep: true });
    } finally {
      if (state.refocus === mine) state.refocus = null;
    }
    if (key && focusLost() && !focusControl(msgId, key)) $("input").focus();
  }
  function focusLost() {
    return !document.activeElement || document.activeElement === document.body;
  }
  async function send(text) {
    if (!state.online) {
      if (state.queued) {
        const q = state.queued, typed = $("input").value;
        setQueued(null);
        if (q.sid !== state.current) stashDraft(q.sid, q.text);
        else $("input").value = typed ? `${q.text}
${typed}` : q.text;
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
      if (state.sendClicks < 2) act("stop", { msg_id: runningReply().msg_id });
      return;
    }
    if (!text.trim() || state.sending) return;
    state.sending = true;
    renderComposer();
    try {
      const fields = { content: text };
      if (state.current) fields.session_id = state.current;
      else fields.project_id = state.draftProject;
      const ack = await request("chat", fields);
      $("input").value = "";
      growInput();
      saveDraft();
      await openSession(ack.session_id, { keep: ack.session_id === state.current });
      refreshRunning();
    } catch (e) {
      showError(e.message);
    } finally {
      state.sending = false;
      renderComposer();
    }
  }
  function growInput() {
    const t = $("input");
    t.style.height = "auto";
    t.style.height = `${Math.min(t.scrollHeight + 2, 200)}px`;
  }
  function newChat() {
    openDraft({ push: true });
    closeDrawer();
    $("input").focus();
  }
  function go(hash, push) {
    const url = `${location.pathname}${location.search}${hash}`;
    if (url === location.pathname + location.search + location.hash) return;
    if (push) history.pushState(null, "", url);
    else history.replaceState(null, "", url);
  }
  addEventListener("popstate", () => {
    const sid = new URLSearchParams(location.hash.slice(1)).get("s");
    if (sid && sid !== state.current) openSession(sid, { push: false });
    else if (!sid && state.current !== null) openDraft();
  });
  var DRAFT_KEY = "sessionlog-draft:";
  function saveDraft() {
    const key = DRAFT_KEY + (state.current ?? "new"), text = $("input").value;
    try {
      if (text) sessionStorage.setItem(key, text);
      else sessionStorage.removeItem(key);
    } catch {
    }
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
    $("title-input").hidden = true;
    $("title").hidden = false;
    state.renameFor = null;
    state.renameFrom = null;
  }
  function arm(b, label) {
    b.classList.add("confirm");
    b.dataset.label = b.textContent;
    b.textContent = label;
    b._disarm = setTimeout(() => disarm(b), 4e3);
  }
  function disarm(b) {
    if (!b.classList.contains("confirm")) return;
    clearTimeout(b._disarm);
    b.classList.remove("confirm");
    b.textContent = b.dataset.label;
  }
  $("send-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    send($("input").value);
    state.sendClicks = 0;
  });
  $("send").addEventListener("click", (ev) => {
    state.sendClicks = ev.detail;
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.isComposing || ev.keyCode === 229) return;
    if (ev.key === "Enter" && !ev.shiftKey && !TOUCH.matches) {
      ev.preventDefault();
      if (!runningReply() && !state.sending) send($("input").value);
    }
  });
  var TOUCH = matchMedia("(pointer: coarse)");
  function placeholder() {
    $("input").placeholder = TOUCH.matches ? "Message…" : "Message… (Enter to send, Shift+Enter for a new line)";
  }
  TOUCH.addEventListener("change", placeholder);
  placeholder();
  $("input").addEventListener("input", growInput);
  document.querySelector(".skip-link").addEventListener("click", (ev) => {
    ev.preventDefault();
    closeDrawer();
    $("input").focus();
  });
  $("new-chat").addEventListener("click", newChat);
  $("search").addEventListener("input", (ev) => {
    state.search = ev.target.value;
    state.drawn = PAGE;
    renderSidebar();
    searchMessages();
  });
  var searchTimer = null;
  var searchSeq = 0;
  function searchMessages() {
    clearTimeout(searchTimer);
    const q = state.search.trim();
    if (q.length < 2) {
      searchSeq++;
      renderHits(null);
      return;
    }
    searchTimer = setTimeout(async () => {
      const mine = ++searchSeq;
      try {
        const found = await request("search", { query: state.search, limit: 20 });
        if (mine === searchSeq) renderHits(found);
      } catch (e) {
        if (mine === searchSeq) renderHits({ hits: [], failed: e.message });
      }
    }, 150);
  }
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
    if (!found) {
      ul.replaceChildren();
      return;
    }
    const who = { user: "You", assistant: "Reply", tool: "Tool" };
    const items = found.hits.map((h) => el(
      "li",
      {},
      el(
        "button",
        { class: "hit", type: "button", onclick: () => openHit(h) },
        el("span", { class: "hit-title" }, h.title || "Untitled chat", h.archived ? el("span", { class: "badge archived" }, "archived") : null),
        el("span", { class: "hit-snippet" }, el("span", { class: "hit-who" }, `${who[h.role] || h.role}: `), ...marked(h.snippet, h.marks))
      )
    ));
    if (!items.length) {
      items.push(el("li", { class: "none" }, found.failed ? `Search failed: ${found.failed}` : found.indexing ? "Nothing yet: the search index is still being built." : "No message says that."));
    }
    ul.replaceChildren(...items);
  }
  async function openHit(h) {
    await openSession(h.session_id);
    const node = state.nodes.get(h.msg_id);
    if (!node) {
      showError("That message is on another version of the chat (‹ › under a reply).");
      return;
    }
    state.stick = false;
    node.scrollIntoView({ block: "center" });
    node.classList.add("found");
    setTimeout(() => node.classList.remove("found"), 2e3);
  }
  for (const b of $("views").children) b.addEventListener("click", () => {
    state.view = b.dataset.view;
    state.drawn = PAGE;
    renderSidebar();
  });
  $("views").addEventListener("keydown", (ev) => {
    if (ev.key !== "ArrowRight" && ev.key !== "ArrowLeft") return;
    const tabs = [...$("views").children];
    const i = tabs.findIndex((t) => t.dataset.view === state.view);
    const next = tabs[(i + (ev.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
    state.view = next.dataset.view;
    state.drawn = PAGE;
    renderSidebar();
    next.focus();
  });
  $("running-btn").addEventListener("click", () => {
    const list = $("running-list");
    list.hidden = !list.hidden;
    $("running-btn").setAttribute("aria-expanded", String(!list.hidden));
  });
  $("menu-btn").addEventListener("click", () => document.body.classList.contains("drawer-open") ? closeDrawer() : openDrawer());
  $("scrim").addEventListener("click", closeDrawer);
  matchMedia("(max-width: 720px)").addEventListener("change", (e) => {
    if (!e.matches) closeDrawer();
  });
  $("help-btn").addEventListener("click", () => $("help").showModal());
  $("act-rename").addEventListener("click", async () => {
    const sid = state.menuFor;
    closeMenu();
    if (sid !== state.current) await openSession(sid);
    const input = $("title-input");
    state.renameFor = state.current;
    state.renameFrom = $("more");
    input.value = state.sessions.get(state.current)?.title || "";
    input.hidden = false;
    $("title").hidden = true;
    input.focus();
    input.select();
  });
  $("title-input").addEventListener("blur", closeRename);
  $("title-input").addEventListener("keydown", async (ev) => {
    if (ev.key !== "Enter" && ev.key !== "Escape") return;
    ev.stopPropagation();
    ev.preventDefault();
    const input = $("title-input");
    const sid = state.renameFor;
    const title = input.value.trim();
    const back = state.renameFrom;
    closeRename();
    if (back?.isConnected && back.offsetParent !== null) back.focus();
    else $("input").focus();
    if (ev.key === "Enter" && title && sid) {
      try {
        await request("rename_session", { session_id: sid, title });
      } catch (e) {
        showError(e.message);
      }
    }
  });
  $("act-regenerate").addEventListener("click", (ev) => {
    const sid = state.menuFor;
    const b = ev.currentTarget;
    if (state.sessions.get(sid)?._user_titled && !b.classList.contains("confirm")) {
      arm(b, "Replace your title?");
      return;
    }
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
      toast(
        archived ? "Chat archived." : "Chat restored from the archive.",
        { undo: () => act("set_archived", { session_id: sid, archived: !archived }) }
      );
    }
  });
  $("act-delete").addEventListener("click", () => {
    const sid = state.menuFor;
    const wasOpen = sid === state.current;
    closeMenu(!wasOpen);
    state.deleting.add(sid);
    if (wasOpen) {
      openDraft({ push: true });
      $("input").focus();
    }
    renderSidebar();
    toast("Chat deleted.", { undo: () => {
      keepChat(sid);
      if (wasOpen) openSession(sid);
    }, end: () => reallyDelete(sid) });
  });
  state.deleting = /* @__PURE__ */ new Set();
  var UNDO_MS = 6e3;
  function keepChat(sid) {
    state.deleting.delete(sid);
    renderSidebar();
  }
  async function reallyDelete(sid) {
    if (!state.deleting.has(sid)) return;
    state.deleting.delete(sid);
    if (!await act("delete_session", { session_id: sid }) && state.sessions.has(sid)) renderSidebar();
  }
  addEventListener("pagehide", () => {
    for (const sid of state.deleting) {
      fetch(
        new URL(`v1/sessions/${encodeURIComponent(sid)}`, location.href),
        { method: "DELETE", keepalive: true, headers: { Authorization: `Bearer ${TOKEN}` } }
      );
    }
    state.deleting.clear();
  });
  var toastTimer = null;
  var toastEnd = null;
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
      if (undone) undo();
      else e?.();
    };
    box.replaceChildren(el("span", {}, text), el("button", { type: "button", class: "undo", onclick: () => finish(true) }, "Undo"));
    box.hidden = false;
    const wait = () => {
      toastTimer = setTimeout(() => box.matches(":hover, :focus-within") ? wait() : finish(false), UNDO_MS);
    };
    wait();
  }
  function keepIfDeleting(sid) {
    if (!state.deleting.has(sid)) return;
    keepChat(sid);
    if (toastEnd) {
      clearTimeout(toastTimer);
      toastEnd = null;
      $("toast").hidden = true;
    }
  }
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
  function closeMenu(back = false) {
    const menu = $("menu");
    if (menu.hidden) return;
    for (const b of menu.querySelectorAll("button.confirm")) disarm(b);
    menu.hidden = true;
    const from = state.menuFrom;
    from?.setAttribute("aria-expanded", "false");
    state.menuFor = null;
    state.menuFrom = null;
    if (back && from?.isConnected) from.focus();
  }
  state.menuFor = null;
  $("more").addEventListener("click", (ev) => {
    if (!$("menu").hidden && state.menuFrom === ev.currentTarget) closeMenu(true);
    else openMenu(state.current, ev.currentTarget);
  });
  $("menu").addEventListener("keydown", (ev) => {
    const items = [...$("menu").querySelectorAll("[role=menuitem]")];
    const i = items.indexOf(document.activeElement);
    const to = { ArrowDown: i + 1, ArrowUp: i - 1, Home: 0, End: items.length - 1 }[ev.key];
    if (to !== void 0) {
      ev.preventDefault();
      items[(to + items.length) % items.length].focus();
    } else if (ev.key === "Tab") {
      ev.preventDefault();
      closeMenu(true);
    }
  });
  document.addEventListener("pointerdown", (ev) => {
    if (!$("menu").hidden && !$("menu").contains(ev.target) && ev.target !== state.menuFrom) closeMenu();
  });
  addEventListener("resize", () => closeMenu());
  $("project-picker").addEventListener("change", async (ev) => {
    const pid = ev.target.value;
    if (!state.current) {
      state.draftProject = pid;
      renderProject();
      return;
    }
    await act("set_session_project", { project_id: pid });
  });
  $("locate").addEventListener("click", () => {
    const i = $("locate-input");
    i.hidden = false;
    i.focus();
  });
  $("locate-input").addEventListener("keydown", async (ev) => {
    if (ev.key !== "Enter") return;
    const r = await act("relocate_project", { project_id: currentProject().id, path: ev.target.value.trim() });
    if (r) {
      ev.target.hidden = true;
      ev.target.value = "";
      await openSession(state.current, { keep: true });
    }
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
    if (ev.key === "Tab" && document.body.classList.contains("drawer-open")) {
      const items = [$("menu-btn"), ...$("sidebar").querySelectorAll("button, input, select, [tabindex='0']")].filter((n) => !n.disabled && n.offsetParent !== null && n.getAttribute("tabindex") !== "-1");
      const i = items.indexOf(document.activeElement);
      const next = items[(i + (ev.shiftKey ? items.length - 1 : 1) + items.length) % items.length];
      if (next) {
        ev.preventDefault();
        next.focus();
      }
      return;
    }
    const typing = /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement?.tagName || "");
    if (ev.key === "/" && !typing && !ev.ctrlKey && !ev.metaKey && !ev.altKey) {
      ev.preventDefault();
      closeDrawer();
      $("input").focus();
      return;
    }
    if (ev.ctrlKey && ev.shiftKey && (ev.key === "O" || ev.key === "o")) {
      ev.preventDefault();
      newChat();
      return;
    }
    if (ev.ctrlKey && ev.key === "/") {
      ev.preventDefault();
      $("help").showModal();
      return;
    }
    if (ev.key === "Escape" && ev.shiftKey) {
      ev.preventDefault();
      $("input").focus();
      return;
    }
    if (ev.key === "Escape" && !$("help").open) onEscape(ev);
  });
  function onEscape(ev) {
    const at = document.activeElement;
    const armed = document.querySelector("button.confirm");
    if (armed) {
      ev.preventDefault();
      disarm(armed);
      return;
    }
    if (!$("menu").hidden) {
      ev.preventDefault();
      closeMenu(true);
      return;
    }
    if (at === $("search") && (state.search || at.value)) {
      ev.preventDefault();
      at.value = "";
      state.search = "";
      renderSidebar();
      searchMessages();
      return;
    }
    if (document.body.classList.contains("drawer-open")) {
      closeDrawer();
      $("menu-btn").focus();
      return;
    }
    const m = runningReply();
    if (m && at === $("input")) {
      ev.preventDefault();
      act("stop", { msg_id: m.msg_id });
    }
  }
  setInterval(() => {
    for (const t of document.querySelectorAll("#messages time")) {
      t.textContent = ago(Date.parse(t.getAttribute("datetime")) / 1e3);
    }
  }, 3e4);
  $("input").dataset.refocus = "1";
  renderAll();
  showConn();
  client.start();
})();
