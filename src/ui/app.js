// crosstalk console: a client of the relay's REST API and SSE streams, like any other.
// Message bodies and names are only ever set as text (textContent), never as HTML.
"use strict";

const MAX_DOM = 400; // messages kept in the page at once: a window, not the whole channel
const PAGE = 100;
const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;

const state = {
  token: sessionStorage.getItem("crosstalk-token") || "",
  me: localStorage.getItem("crosstalk-me") || "human",
  channels: [],
  channel: null,
  lastId: 0, // newest message id shown or skipped (the stream resumes after it)
  firstId: 0, // oldest message id in the page
  following: true, // the page holds the newest messages and appends live ones
  stream: null,
  retry: 500,
  replyTo: null,
  questions: new Map(), // id -> message, open questions of this channel
  usedBy: { asked: "", who: new Set() }, // who is on the channel, by the relay, and for what
  seen: JSON.parse(localStorage.getItem("crosstalk-seen") || "{}"), // channel -> count read
  titleAlert: false,
  // The page's own session requests run one at a time (`sessionQueue`), and `sessionGen` moves
  // as each starts and ends, so a channel list read before or during one is not trusted after it.
  sessionQueue: Promise.resolve(),
  sessionGen: 0,
};

// ---- the API

class Refused extends Error {}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(options.json);
  }
  const r = await fetch(path, { ...options, headers });
  if (r.status === 401) {
    showLogin(state.token ? "The relay refused that token." : "");
    throw new Refused("unauthorized");
  }
  const body = await r.json().catch(() => null);
  if (!r.ok && !(r.status === 404 && body && body.status === "no_active_session")) {
    throw new Error((body && body.error) || `${r.status} ${r.statusText}`);
  }
  return body;
}

function report(e) {
  if (e instanceof Refused) return;
  $("error").textContent = e.message || String(e);
  setTimeout(() => ($("error").textContent = ""), 6000);
}

// ---- login

function showLogin(message) {
  closeStream();
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("token").focus();
}

$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  state.token = $("token").value.trim();
  sessionStorage.setItem("crosstalk-token", state.token);
  await start();
});

$("logout").addEventListener("click", () => {
  sessionStorage.removeItem("crosstalk-token");
  state.token = "";
  showLogin("");
});

async function start() {
  // Who the token makes this page, first: a participant's token says who this is (the page
  // posts as that identity, not as a name typed in, and counts that identity's unread), and
  // what else it may manage (the panels it shows, so it asks for nothing the relay refuses).
  let me;
  try {
    me = await api("/api/whoami");
    if (me.identity) state.me = me.identity;
    await refreshChannels();
  } catch (e) {
    if (!(e instanceof Refused)) {
      $("login").hidden = false;
      $("login-error").textContent = `Cannot reach the relay: ${e.message}`;
    }
    return;
  }
  state.human = me.human;
  $("me").readOnly = Boolean(me.identity);
  $("me").title = me.identity ? "the identity of your token" : "";
  $("me").value = state.me;
  const manages = new Set(me.manages || []);
  $("webhooks").hidden = !manages.has("webhooks");
  $("oauth").hidden = !manages.has("connections");
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = !state.token;
  if (manages.has("connections")) refreshOAuth().catch(report);
  if (manages.has("webhooks")) refreshWebhooks().catch(report);
  refreshReservations().catch(report);
  const wanted = decodeURIComponent(location.hash.slice(1));
  if (wanted) openChannel(wanted);
  else if (state.channels.length) openChannel(state.channels[0].channel);
  else refreshData().catch(report);
}

// ---- channels

function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(iso).toLocaleDateString();
}

async function refreshChannels() {
  const gen = state.sessionGen;
  state.channels = await api("/api/channels");
  // Unread for the identity the page posts as, from its read positions on the relay (they
  // move as the page streams a channel as that participant); the browser's own count for
  // channels it has never read. An identity that is another session's gets only the latter.
  const relayUnread = state.me
    ? await api(`/api/unread?instance_id=${enc(state.me)}`).then((r) => r.unread).catch(() => ({}))
    : {};
  const list = $("channel-list");
  list.replaceChildren();
  if (!state.channels.length) {
    list.append(el("li", "empty", "No channels yet. Agents make one by posting to it; or name one below."));
  }
  for (const c of state.channels) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.channel = c.channel;
    if (c.channel === state.channel) {
      b.setAttribute("aria-current", "true");
      state.seen[c.channel] = c.count;
    }
    // A question or permission prompt waiting for an answer, in amber: what a person looks
    // for first; then what is unread.
    const open = c.open_questions || 0;
    const unread =
      c.channel === state.channel ? 0 : relayUnread[c.channel] ?? (c.count || 0) - (state.seen[c.channel] ?? 0);
    const asking = open > 0 ? `${open} open question${open === 1 ? "" : "s"}` : "";
    const unseen = unread > 0 ? `${unread} unread` : "";
    const marks = el("span", "marks");
    if (asking) marks.append(mark("asks", `? ${open}`, asking));
    if (unseen) marks.append(mark("badge", unread > 999 ? "999+" : String(unread), unseen));
    const meta = el("span", "meta", [ago(c.last_at), c.description].filter(Boolean).join(" · "));
    b.append(el("span", "name", `# ${c.channel}`), marks, meta);
    b.setAttribute("aria-label", [c.channel, asking, unseen, meta.textContent].filter(Boolean).join(", "));
    b.addEventListener("click", () => openChannel(c.channel));
    li.append(b);
    list.append(li);
  }
  localStorage.setItem("crosstalk-seen", JSON.stringify(state.seen));
  if (state.channel) await refreshSession(gen);
}

// A small mark on a channel's row, with what it means in words on hover.
function mark(cls, text, title) {
  const m = el("span", cls, text);
  m.title = title;
  return m;
}

$("new-channel").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const name = $("new-channel-name").value.trim();
  if (!name) return;
  try {
    await api("/api/channels", { method: "POST", json: { name } });
    $("new-channel-name").value = "";
    await refreshChannels();
    openChannel(name);
  } catch (e) {
    report(e);
  }
});

// ---- one channel: history by cursor, live over SSE

async function openChannel(name) {
  closeStream();
  state.channel = name;
  state.lastId = 0;
  state.firstId = 0;
  state.following = true;
  state.replyTo = null;
  state.questions.clear();
  renderReplying();
  $("app").classList.remove("show-nav");
  location.hash = enc(name);
  $("channel-name").textContent = `# ${name}`;
  const summary = state.channels.find((c) => c.channel === name);
  $("channel-desc").textContent = (summary && summary.description) || "";
  $("message-list").replaceChildren();
  $("detail").hidden = true;
  try {
    await loadNewest();
    openStream();
    refreshChannels().catch(report);
    refreshPresence().catch(report);
    refreshData().catch(report);
  } catch (e) {
    report(e);
  }
}

async function loadNewest() {
  const page = await api(`/api/channels/${enc(state.channel)}/messages?before_id=${Number.MAX_SAFE_INTEGER}&limit=${PAGE}`);
  $("message-list").replaceChildren();
  for (const m of page) append(m);
  state.firstId = page.length ? page[0].id : 0;
  state.lastId = Math.max(state.lastId, page.length ? page[page.length - 1].id : 0);
  $("older").hidden = page.length < PAGE;
  state.following = true;
  $("jump").hidden = true;
  scrollToEnd();
}

$("older").addEventListener("click", async () => {
  if (!state.firstId) return;
  const box = $("messages");
  const before = box.scrollHeight - box.scrollTop;
  try {
    const page = await api(`/api/channels/${enc(state.channel)}/messages?before_id=${state.firstId}&limit=${PAGE}`);
    const list = $("message-list");
    for (const m of page.slice().reverse()) list.prepend(render(m));
    if (page.length) state.firstId = page[0].id;
    $("older").hidden = page.length < PAGE;
    // Keep the window: drop the newest from the page, and stop following live.
    while (list.children.length > MAX_DOM) {
      list.lastElementChild.remove();
      state.following = false;
    }
    $("jump").hidden = state.following;
    box.scrollTop = box.scrollHeight - before;
  } catch (e) {
    report(e);
  }
});

$("jump").addEventListener("click", () => loadNewest().catch(report));

function closeStream() {
  if (state.stream) state.stream.close();
  state.stream = null;
  setConn(false);
}

function setConn(live) {
  $("conn").textContent = live ? "live" : "reconnecting…";
  $("conn").classList.toggle("live", live);
}

function openStream() {
  const name = state.channel;
  let url = `/api/channels/${enc(name)}/stream?since_id=${state.lastId}&participant_id=${enc(state.me)}&kind=human`;
  if (state.token) url += `&token=${enc(state.token)}`;
  const es = new EventSource(url);
  state.stream = es;
  es.addEventListener("ready", () => {
    state.retry = 500;
    setConn(true);
  });
  es.addEventListener("message", (ev) => {
    if (state.channel !== name) return;
    const m = JSON.parse(ev.data);
    if (m.id <= state.lastId) return; // never twice
    state.lastId = m.id;
    arrived(m);
  });
  es.addEventListener("presence", () => refreshPresence().catch(report));
  es.onerror = () => {
    setConn(false);
    // EventSource retries by itself, with Last-Event-ID; when it gives up (an error answer,
    // a relay that is down), reopen after the last id we have.
    if (es.readyState === EventSource.CLOSED && state.stream === es) {
      state.stream = null;
      const wait = state.retry;
      state.retry = Math.min(state.retry * 2, 5000);
      setTimeout(() => {
        if (state.channel === name && !state.stream) {
          api("/api/channels").then(() => openStream(), () => openStreamLater(name));
        }
      }, wait);
    }
  };
}

function openStreamLater(name) {
  setTimeout(() => {
    if (state.channel === name && !state.stream) openStream();
  }, state.retry);
}

function arrived(m) {
  const atEnd = nearEnd();
  if (state.following) {
    append(m);
    const list = $("message-list");
    while (list.children.length > MAX_DOM) {
      list.firstElementChild.remove();
      state.firstId = Number(list.firstElementChild.dataset.id);
      $("older").hidden = false;
    }
    if (atEnd) scrollToEnd();
  } else {
    $("jump").hidden = false;
    track(m);
  }
  if (asks(m.type) && m.sender !== state.me) alertQuestion(m);
  if (m.reply_to) bumpReplies(m.reply_to);
  // Any message may change the channel's row: its unread count, its open questions (an
  // ANSWER from this page too), its session's turns.
  soon(refreshChannels);
}

// At most one refresh a second per kind, however fast messages arrive.
const pending = new Set();
function soon(refresh) {
  if (pending.has(refresh)) return;
  pending.add(refresh);
  setTimeout(() => {
    pending.delete(refresh);
    refresh().catch(report);
  }, 1000);
}

function nearEnd() {
  const box = $("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function scrollToEnd() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function append(m) {
  // A reply to a message on the page folds under it: the parent's count says how many, and
  // clicking it shows them there.
  const parent = m.reply_to && document.querySelector(`#message-list > li[data-id="${m.reply_to}"]`);
  if (parent) {
    let folded = parent.querySelector(":scope > ol.folded");
    if (!folded) {
      folded = el("ol", "folded");
      folded.hidden = true;
      parent.append(folded);
    }
    folded.append(render(m));
  } else {
    $("message-list").append(render(m));
  }
  track(m);
}

// Whether a message's type is one of the relay's meaningful words: ASCII letters in any case,
// as the relay reads it (a type is kept as its poster wrote it: `answer` is an ANSWER).
function is(type, word) {
  return typeof type === "string" && /^[A-Za-z]+$/.test(type) && type.toUpperCase() === word;
}

// A QUESTION, or a PERMISSION (an agent host asking whether its agent may use a tool).
function asks(type) {
  return is(type, "QUESTION") || is(type, "PERMISSION");
}

// Open questions and permission prompts, from what this page has seen.
function track(m) {
  if (asks(m.type) && m.status !== "answered") state.questions.set(m.id, m);
  if (is(m.type, "ANSWER") && m.reply_to && state.questions.has(m.reply_to)) {
    const q = state.questions.get(m.reply_to);
    state.questions.delete(m.reply_to);
    const verdict = m.body.trim().toLowerCase();
    markAnswered(m.reply_to, is(q.type, "PERMISSION") ? `${verdict === "allow" ? "allowed" : "denied"} by ${m.sender}` : "answered");
  }
  renderQuestions();
  if (asks(m.type) || is(m.type, "ANSWER")) soon(refreshPresence);
}

function kindClass(t) {
  if (asks(t)) return "question";
  if (is(t, "DIRECTIVE") || is(t, "INTERRUPT")) return "directive";
  return "";
}

// ---- message bodies: a small Markdown, built as DOM nodes (no HTML is ever parsed, so a body
// can make no element but these: paragraphs, line breaks, lists, code, strong, em, links)

const SAFE_LINK = /^(https?:\/\/|mailto:)/i;
const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\n]+\*)|(\[[^\]\n]+\]\([^)\s]+\))|(https?:\/\/[^\s<>()]+)/g;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
const FENCE = /^\s*```/;

function link(label, href) {
  if (!SAFE_LINK.test(href)) return document.createTextNode(label);
  const a = el("a", "", label);
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  return a;
}

function inline(text, parent) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    const t = m[0];
    if (m[1]) parent.append(el("code", "", t.slice(1, -1)));
    else if (m[2]) parent.append(el("strong", "", t.slice(2, -2)));
    else if (m[3]) parent.append(el("em", "", t.slice(1, -1)));
    else if (m[4]) {
      const [, label, href] = t.match(/^\[([^\]]+)\]\(([^)]+)\)$/);
      parent.append(link(label, href));
    } else parent.append(link(t, t));
    last = m.index + t.length;
  }
  if (last < text.length) parent.append(text.slice(last));
}

function markdown(body) {
  const root = el("div", "body md");
  const lines = body.split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (FENCE.test(line)) {
      const code = [];
      i++;
      while (i < lines.length && !FENCE.test(lines[i])) code.push(lines[i++]);
      i++;
      const pre = el("pre");
      pre.append(el("code", "", code.join("\n")));
      root.append(pre);
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const pattern = BULLET.test(line) ? BULLET : NUMBERED;
      const list = el(pattern === BULLET ? "ul" : "ol", "md-list");
      while (i < lines.length && pattern.test(lines[i])) {
        const item = el("li");
        inline(lines[i].match(pattern)[1], item);
        list.append(item);
        i++;
      }
      root.append(list);
    } else if (line.trim() === "") {
      i++;
    } else {
      const p = el("p");
      let first = true;
      while (i < lines.length && lines[i].trim() !== "" && !FENCE.test(lines[i]) && !BULLET.test(lines[i]) && !NUMBERED.test(lines[i])) {
        if (!first) p.append(el("br"));
        inline(lines[i++], p);
        first = false;
      }
      root.append(p);
    }
  }
  return root;
}

// One colour per sender, the same on every page: a hue from the name.
function senderColour(name) {
  let h = 0;
  for (const ch of name) h = (h * 31 + ch.codePointAt(0)) % 360;
  const dark = matchMedia("(prefers-color-scheme: dark)").matches;
  return `hsl(${h}, 60%, ${dark ? 70 : 36}%)`;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function render(m) {
  const li = el("li", `msg ${kindClass(m.type)} ${m.sender === state.me ? "mine" : ""}`);
  li.dataset.id = m.id;
  const head = el("div", "head");
  const who = el("span", "sender", m.sender);
  who.style.color = senderColour(m.sender);
  head.append(who);
  if (m.type && m.type !== "message") head.append(el("span", "kind", m.type));
  if (m.recipient) head.append(el("span", "to", `→ ${m.recipient}`));
  // Hours and minutes, as a chat shows them (the ids give the order); the rest on hover.
  const at = new Date(m.created_at);
  const t = el("time", "", at.toLocaleTimeString([], { hour: "numeric", minute: "2-digit" }));
  t.dateTime = m.created_at;
  t.title = at.toLocaleString();
  head.append(t, el("span", "id", `#${m.id}`));
  if (m.reply_to) head.append(el("span", "re", `↳ #${m.reply_to}`));
  const status = el("span", m.status === "answered" ? "answered status" : "status", m.status === "answered" ? "answered" : "");
  head.append(status);
  const actions = el("span", "actions");
  const reply = el("button", "link", "reply");
  reply.type = "button";
  reply.addEventListener("click", () => setReply(m));
  const thread = el("button", "link replies", m.reply_count ? `${m.reply_count} repl${m.reply_count === 1 ? "y" : "ies"}` : "thread");
  thread.type = "button";
  thread.addEventListener("click", () => {
    // Folded replies open in place; a thread whose replies are not on the page, in the panel.
    const folded = document.querySelector(`#message-list li[data-id="${m.id}"] > ol.folded`);
    if (folded) folded.hidden = !folded.hidden;
    else showThread(m);
  });
  const readers = el("button", "link", "read by…");
  readers.type = "button";
  readers.addEventListener("click", () => showReaders(m));
  actions.append(reply, thread, readers);
  head.append(actions);
  li.append(head, markdown(m.body));
  // A directive for one participant says whether it has been read: "not yet" in amber.
  if (m.recipient && kindClass(m.type) === "directive") {
    const badge = el("span", "delivery");
    head.insertBefore(badge, actions);
    pendingDeliveries.set(m.id, { m, badge });
    deliveryBadge(m, badge);
  }
  return li;
}

// Directives shown whose recipient has not read them yet: looked at again every few seconds.
const pendingDeliveries = new Map();

async function deliveryBadge(m, badge) {
  if (!badge.isConnected && badge.textContent) {
    pendingDeliveries.delete(m.id);
    return;
  }
  try {
    const r = await api(`/api/channels/${enc(m.channel)}/messages/${m.id}/readers`);
    if (r.not_yet.includes(m.recipient)) {
      badge.textContent = `not yet: ${m.recipient}`;
      badge.className = "delivery pending";
    } else {
      badge.textContent = `read by ${m.recipient}`;
      badge.className = "delivery delivered";
      pendingDeliveries.delete(m.id);
    }
  } catch {
    // Shown at the next look.
  }
}

setInterval(() => {
  for (const { m, badge } of pendingDeliveries.values()) deliveryBadge(m, badge);
}, 5000);

function bumpReplies(parent) {
  const li = document.querySelector(`#message-list li[data-id="${parent}"] .replies`);
  if (!li) return;
  const n = (parseInt(li.textContent, 10) || 0) + 1;
  li.textContent = `${n} repl${n === 1 ? "y" : "ies"}`;
}

function markAnswered(q, text = "answered") {
  const s = document.querySelector(`#message-list li[data-id="${q}"] .status`);
  if (s) {
    s.textContent = text;
    s.className = "answered status";
  }
}

// ---- questions

function renderQuestions() {
  const list = $("question-list");
  list.replaceChildren();
  for (const q of state.questions.values()) {
    const li = el("li");
    li.dataset.id = q.id;
    if (is(q.type, "PERMISSION")) {
      // A tool prompt: a human allows or denies it; the first verdict stands.
      li.className = "permission";
      li.append(el("div", "", `${q.sender} asks to use a tool (#${q.id}):`), el("div", "body", q.body));
      const buttons = el("div", "verdicts");
      for (const verdict of ["allow", "deny"]) {
        const b = el("button", verdict, verdict === "allow" ? "Allow" : "Deny");
        b.type = "button";
        b.addEventListener("click", async () => {
          try {
            await post({ type: "ANSWER", body: verdict, reply_to: q.id });
          } catch (e) {
            report(e);
          }
        });
        buttons.append(b);
      }
      li.append(buttons);
      list.append(li);
      continue;
    }
    li.append(el("div", "", `${q.sender} asks (#${q.id}):`), el("div", "body", q.body));
    const form = el("form");
    const input = el("input");
    input.placeholder = "Your answer";
    input.setAttribute("aria-label", `Answer to question ${q.id}`);
    const b = el("button", "", "Answer");
    b.type = "submit";
    form.append(input, b);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      if (!input.value.trim()) return;
      try {
        await post({ type: "ANSWER", body: input.value, reply_to: q.id });
      } catch (e) {
        report(e);
      }
    });
    li.append(form);
    list.append(li);
  }
  $("questions").hidden = state.questions.size === 0;
  if (state.questions.size === 0 && state.titleAlert) {
    state.titleAlert = false;
    document.title = "crosstalk";
  }
}

function alertQuestion(m) {
  state.titleAlert = true;
  document.title = `(?) ${m.sender} asks — crosstalk`;
  if ("Notification" in window && Notification.permission === "granted") {
    new Notification(`${m.sender} asks on #${state.channel}`, { body: m.body.slice(0, 200) });
  }
}

document.addEventListener(
  "click",
  () => {
    if ("Notification" in window && Notification.permission === "default") Notification.requestPermission();
  },
  { once: true },
);

// ---- posting

async function post(fields) {
  return api(`/api/channels/${enc(state.channel)}/messages`, {
    method: "POST",
    json: { sender: state.me, ...fields },
  });
}

function setReply(m) {
  state.replyTo = m;
  if (is(m.type, "QUESTION")) $("kind").value = "ANSWER";
  renderReplying();
  $("body").focus();
}

function renderReplying() {
  const r = $("replying");
  r.replaceChildren();
  r.hidden = !state.replyTo;
  if (!state.replyTo) return;
  r.append(`replying to #${state.replyTo.id} (${state.replyTo.sender}) `);
  const x = el("button", "link", "cancel");
  x.type = "button";
  x.addEventListener("click", () => {
    // An ANSWER was chosen for the reply (setReply): without the reply it answers nothing.
    if ($("kind").value === "ANSWER") $("kind").value = "message";
    state.replyTo = null;
    renderReplying();
  });
  r.append(x);
}

// After a send the composer is ready for the next ordinary message: a DIRECTIVE, its
// recipient and the reply were for the one just sent. Who the page posts as stays.
function resetComposer() {
  $("body").value = "";
  $("kind").value = "message";
  $("to").value = "";
  state.replyTo = null;
  renderReplying();
}

$("composer").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const body = $("body").value;
  if (!body.trim() || !state.channel) return;
  const fields = { type: $("kind").value, body };
  if ($("to").value.trim()) fields.recipient = $("to").value.trim();
  if (state.replyTo) fields.reply_to = state.replyTo.id;
  try {
    await post(fields);
    resetComposer();
  } catch (e) {
    // Refused: everything stays as it was, to be put right and sent again.
    report(e);
  }
});

$("body").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});

$("me").addEventListener("change", () => {
  state.me = $("me").value.trim() || "human";
  localStorage.setItem("crosstalk-me", state.me);
  if (state.channel) openChannel(state.channel);
});

// ---- side panels: presence, thread, readers, shared data, search

async function refreshPresence() {
  const { channel, lastId: newest } = state;
  if (!channel) return;
  const [present, instances, wake] = await Promise.all([
    api(`/api/channels/${enc(channel)}/presence`),
    api("/api/instances").catch(() => []),
    api("/api/wake").catch(() => ({ woken: [] })),
  ]);
  // Identities crosstalk wake runs turns for: what each does now.
  const woken = new Map(wake.woken.map((w) => [w.identity, w]));
  const here = new Set(present.map((p) => p.id));
  // Registered identities that are offline count as on this channel only if they used it: the
  // relay's own list of who is on a channel (a read position there, a post among its newest
  // messages), as "read by…" on its newest message gives it.
  // Asked again only when that could change: a new message, someone else away.
  const away = instances.filter((i) => !here.has(i.instance_id) && i.status !== "online");
  const asked = [channel, newest, ...away.map((i) => i.instance_id)].join("\n");
  if (away.length && newest && state.usedBy.asked !== asked) {
    const r = await api(`/api/channels/${enc(channel)}/messages/${newest}/readers`);
    state.usedBy = { asked, who: new Set([...r.read_by, ...r.not_yet]) };
  }
  const used = state.usedBy.asked === asked ? state.usedBy.who : new Set();
  if (state.channel !== channel) return;
  const list = $("presence");
  list.replaceChildren();
  for (const p of present) {
    const li = el("li");
    li.append(el("span", "dot online"), el("span", "", p.display_name || p.id));
    // An agent blocked on a person: what it asked, in amber.
    const asked = [...state.questions.values()].filter((q) => q.sender === p.id).pop();
    const w = woken.get(p.id);
    if (w) {
      li.append(wakeState(w));
      woken.delete(p.id);
    } else if (asked) {
      li.className = "waiting-on-you";
      li.append(el("span", "activity", `waiting on you: ${asked.body.split("\n")[0].slice(0, 120)}`));
    } else {
      li.append(el("span", "activity", [p.kind, p.activity].filter(Boolean).join(", ")));
    }
    list.append(li);
  }
  // Woken identities that are not present: crosstalk wake listens for them.
  for (const w of woken.values()) {
    const li = el("li");
    li.append(el("span", "dot online"), el("span", "", w.identity), wakeState(w));
    list.append(li);
  }
  for (const i of away) {
    if (!used.has(i.instance_id) || woken.has(i.instance_id)) continue;
    const li = el("li");
    li.append(el("span", "dot"), el("span", "", i.instance_id), el("span", "activity", `${i.kind}, offline`));
    list.append(li);
  }
}

// A woken identity's state (listening, working, paused: waiting on you), its last turns on a
// click.
function wakeState(w) {
  // Paused: what it asked a person, where the relay could find it, else why it paused.
  const asked = w.paused && (w.paused.asked || w.state);
  const span = el("span", "activity wake", w.paused ? `waiting on you: ${asked}` : w.state);
  if (w.paused) span.classList.add("waiting-on-you");
  span.title = "crosstalk wake: click for its last turns";
  span.addEventListener("click", () => {
    const ol = el("ol");
    for (const t of w.turns.slice().reverse()) {
      ol.append(el("li", "", `${t.started_at.slice(11, 19)} · ${t.messages} message(s) on ${t.channels.join(", ")} · ${t.outcome} (attempt ${t.attempt}, ${t.seconds.toFixed(1)} s)`));
    }
    if (!w.turns.length) ol.append(el("li", "", "no turn yet"));
    const said = [el("p", "", w.state)];
    if (w.paused && w.paused.asked) said.push(el("p", "", `Asked${w.paused.channel ? ` on ${w.paused.channel}` : ""}: ${w.paused.asked}`));
    detail(`${w.identity} (crosstalk wake, held by ${w.held_by})`, [...said, ol]);
  });
  return span;
}

// The open channel's session, asked for only while its row in the channel list says one runs
// there (with none, the relay answers crosstalk-mcp's 404, an error in the browser's console).
// `gen` is `sessionGen` when that list was asked for: had the page started or ended a session
// since, the list may be older than that, and asking could meet a session already ended.
function refreshSession(gen) {
  return sessionStep(async () => {
    if (gen !== state.sessionGen) return;
    const row = state.channels.find((c) => c.channel === state.channel);
    showSession(row && row.active_session ? await api(`/api/channels/${enc(state.channel)}/session`) : null);
  });
}

// One of the page's session requests, after those before it.
function sessionStep(f) {
  const step = state.sessionQueue.then(f);
  state.sessionQueue = step.catch(() => {});
  return step;
}

// Starting or ending a session: a list read before it finished is stale.
function sessionChange(f) {
  return sessionStep(async () => {
    state.sessionGen++;
    try {
      return await f();
    } finally {
      state.sessionGen++;
    }
  });
}

function showSession(s) {
  $("session").hidden = false;
  const active = Boolean(s && s.status === "active");
  $("session-state").textContent = active ? `session: ${s.turn_count} turn(s)${s.max_turns ? ` of ${s.max_turns}` : ""}` : "no session";
  $("session-start").hidden = active;
  $("session-end").hidden = !active;
}

$("session-start").addEventListener("click", () =>
  sessionChange(async () => showSession(await api(`/api/channels/${enc(state.channel)}/session`, { method: "POST", json: {} }))).catch(
    report,
  ),
);
$("session-end").addEventListener("click", () =>
  sessionChange(async () => {
    await api(`/api/channels/${enc(state.channel)}/session`, { method: "DELETE" });
    showSession(null);
  }).catch(report),
);

function detail(title, nodes) {
  $("detail-title").textContent = title;
  $("detail-body").replaceChildren(...nodes);
  $("detail").hidden = false;
  // On a phone the side panel is an overlay: open it to show what was asked for.
  if (matchMedia("(max-width: 800px)").matches) $("app").classList.add("show-side");
}

async function showThread(m) {
  try {
    const replies = await api(`/api/channels/${enc(state.channel)}/messages/${m.id}/replies`);
    const ol = el("ol");
    for (const r of replies) ol.append(render(r));
    detail(`Thread of #${m.id}`, [render(m), ol]);
  } catch (e) {
    report(e);
  }
}

async function showReaders(m) {
  try {
    const r = await api(`/api/channels/${enc(state.channel)}/messages/${m.id}/readers`);
    // An identity crosstalk wake runs turns for says what it does now.
    const woken = r.woken || {};
    const name = (who) => (woken[who] ? `${who} (${woken[who]})` : who);
    const read = el("p", "", `Read by: ${r.read_by.length ? r.read_by.map(name).join(", ") : "nobody yet"}`);
    const not = el("p", r.not_yet.length ? "pending" : "", `Not yet: ${r.not_yet.length ? r.not_yet.map(name).join(", ") : "nobody"}`);
    detail(`Delivery of #${m.id}`, [read, not]);
  } catch (e) {
    report(e);
  }
}

// ---- OAuth connections (a relay with --oauth, seen with its own token)

// Shown only where the relay has OAuth and this token is its admin's (`whoami` says so).
async function refreshOAuth() {
  const { clients } = await api("/api/oauth/clients");
  const list = $("grants");
  list.replaceChildren();
  for (const g of clients) {
    const li = el("li", "", `${g.client_name} `);
    li.append(el("span", "meta", `as ${g.as || "anyone"} · via ${g.redirect_host} · ${new Date(g.created_at).toLocaleString()} `));
    const b = el("button", "link", "revoke");
    b.type = "button";
    b.addEventListener("click", async () => {
      try {
        await api(`/api/oauth/clients/${enc(g.grant)}`, { method: "DELETE" });
        await refreshOAuth();
      } catch (e) {
        report(e);
      }
    });
    li.append(b);
    list.append(li);
  }
}

// ---- path reservations: who holds which files (agents reserve them over MCP or REST)

async function refreshReservations() {
  const { reservations } = await api("/api/reservations");
  const list = $("reservation-list");
  list.replaceChildren();
  if (!reservations.length) list.append(el("li", "meta", "nobody holds any paths"));
  for (const r of reservations) {
    const li = el("li", "", "");
    li.append(el("strong", "", r.holder), ` ${r.paths.join(", ")} `);
    const until = (r.expires_at || "").slice(11, 16);
    const where = r.project ? ` in ${r.project}` : "";
    li.append(el("span", "meta", `${r.exclusive ? "exclusive" : "shared"}${where}, until ${until} UTC${r.reason ? ` · ${r.reason}` : ""}`));
    list.append(li);
  }
}
setInterval(() => refreshReservations().catch(() => {}), 5000);

// ---- webhooks (the relay's own token, or a relay without tokens)

async function refreshWebhooks() {
  const { webhooks } = await api("/api/webhooks");
  const list = $("webhook-list");
  list.replaceChildren();
  for (const h of webhooks) {
    const li = el("li", "", `#${h.channel} → ${h.url} `);
    const d = h.delivery;
    const types = h.types.length ? h.types.join(",") : "all types";
    const state_ = d.last_error ? `failing (${d.attempts} attempts): ${d.last_error}` : `${d.delivered} delivered`;
    li.append(el("span", d.last_error ? "meta failing" : "meta", `${types}, ${h.format} · ${state_} `));
    const b = el("button", "link", "remove");
    b.type = "button";
    b.addEventListener("click", async () => {
      try {
        await api(`/api/webhooks/${enc(h.id)}`, { method: "DELETE" });
        await refreshWebhooks();
      } catch (e) {
        report(e);
      }
    });
    li.append(b);
    list.append(li);
  }
}

$("webhook-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  if (!state.channel) return report(new Error("open a channel first: a webhook follows one"));
  const types = $("webhook-types").value.split(",").map((t) => t.trim()).filter(Boolean);
  try {
    const h = await api("/api/webhooks", {
      method: "POST",
      json: { channel: state.channel, url: $("webhook-url").value.trim(), types, format: $("webhook-format").value },
    });
    $("webhook-secret").replaceChildren(el("span", "meta", "signing secret, shown once: "), el("code", "", h.secret));
    $("webhook-url").value = "";
    await refreshWebhooks();
  } catch (e) {
    report(e);
  }
});
setInterval(() => {
  if (!$("webhooks").hidden) refreshWebhooks().catch(() => {});
}, 5000);

$("invite-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const as = $("invite-as").value.trim();
  try {
    const inv = await api("/api/oauth/invites", { method: "POST", json: as ? { as } : {} });
    $("invite-code").replaceChildren(
      el("code", "", inv.code),
      el("span", "meta", ` for ${inv.as || "anyone"}, once, until ${new Date(inv.expires_at).toLocaleString()}`),
    );
    refreshOAuth().catch(report);
  } catch (e) {
    report(e);
  }
});

async function refreshData() {
  const entries = await api("/api/data");
  const list = $("data");
  list.replaceChildren();
  for (const d of entries) {
    const li = el("li");
    const b = el("button", "link", d.key);
    b.type = "button";
    b.addEventListener("click", () => showData(d.key));
    li.append(b, el("span", "meta", ` v${d.version} · ${d.owner}${d.deleted ? " · deleted" : ""}`));
    list.append(li);
  }
}

// One entry, at its newest version or at `version`, with every version one click away.
async function showData(key, version) {
  try {
    const d = await api(`/api/data/${enc(key)}${version ? `?version=${version}` : ""}`);
    const newest = version ? (await api(`/api/data/${enc(key)}`)).version : d.version;
    const meta = el("p", "meta", `${d.owner} · ${new Date(d.updated_at).toLocaleString()}${d.description ? ` · ${d.description}` : ""}`);
    const pre = el("pre", "", d.content);
    const a = el("a", "", "download");
    a.href = URL.createObjectURL(new Blob([d.content], { type: "text/plain" }));
    a.download = version ? `${key}.v${version}` : key;
    const versions = el("p", "versions", "versions: ");
    for (let v = Math.max(1, newest - 19); v <= newest; v++) {
      const b = el("button", "link", `v${v}`);
      b.type = "button";
      if (v === d.version) b.setAttribute("aria-current", "true");
      b.addEventListener("click", () => showData(key, v));
      versions.append(b);
    }
    detail(`${key} (v${d.version} of ${newest})`, [meta, pre, a, versions]);
  } catch (e) {
    report(e);
  }
}

$("search-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const q = $("search").value.trim();
  if (!q) return;
  try {
    // Best matches first, each with its passage and the matched words in bold.
    const { messages: found, hits } = await api(`/api/search/hits?q=${enc(q)}&limit=50`);
    const ol = el("ol");
    found.forEach((m, i) => {
      const li = render(m);
      li.querySelector(".body")?.replaceWith(markdown(hits[i]?.snippet || m.body));
      const open = el("button", "link", `open #${m.channel}`);
      open.type = "button";
      open.addEventListener("click", () => openChannel(m.channel));
      li.querySelector(".actions").replaceChildren(open);
      ol.append(li);
    });
    detail(`Search: ${q} (${found.length})`, [ol]);
  } catch (e) {
    report(e);
  }
});

// ---- keyboard and layout

document.addEventListener("keydown", (ev) => {
  if (ev.altKey && (ev.key === "ArrowDown" || ev.key === "ArrowUp")) {
    const names = state.channels.map((c) => c.channel);
    const i = names.indexOf(state.channel);
    const next = names[(i + (ev.key === "ArrowDown" ? 1 : names.length - 1)) % names.length];
    if (next) openChannel(next);
    ev.preventDefault();
  } else if (ev.key === "/" && document.activeElement.tagName !== "TEXTAREA" && document.activeElement.tagName !== "INPUT") {
    $("search").focus();
    ev.preventDefault();
  }
});

$("menu").addEventListener("click", () => $("app").classList.toggle("show-nav"));
$("nav-close").addEventListener("click", () => $("app").classList.remove("show-nav"));
$("panel").addEventListener("click", () => $("app").classList.toggle("show-side"));
$("side-close").addEventListener("click", () => $("app").classList.remove("show-side"));
window.addEventListener("hashchange", () => {
  const wanted = decodeURIComponent(location.hash.slice(1));
  if (wanted && wanted !== state.channel) openChannel(wanted);
});
setInterval(() => {
  if (!$("app").hidden) {
    refreshChannels().catch(report);
    refreshPresence().catch(report);
  }
}, 5000);

start();
