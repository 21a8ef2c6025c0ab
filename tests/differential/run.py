#!/usr/bin/env python3
"""Differential test: the same scripted REST and MCP calls against crosstalk-mcp 2.0.0 (the
Python relay crosstalk replaces) and against crosstalk, compared call by call.

Usage: run.py --peer PATH/crosstalk-mcp --crosstalk target/debug/crosstalk [--dump] [--budget S]
(scripts/differential installs the peer and runs this.)

Rule per step: same HTTP status, and every key the peer returns is present in crosstalk's
answer with the same JSON type (recursively; lists must have the same length and are compared
element by element), with the same value unless the value is volatile (timestamps, session
ids). Ids are compared through a map built from the posts both servers answered in the same
step. Extra keys in crosstalk's answer are fine. A step that differs is "allowed" only if
tests/differential/allowed.json names it, with the reason (genuine peer bugs only).

Only the Python standard library is used.
"""

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOCOL_VERSION = "2025-11-25"  # the newest version both crosstalk-mcp (mcp 1.30) and crosstalk speak
# Tools whose peer implementation returns a Python list: FastMCP turns each element into its
# own text content item (an empty list into no content at all), so that is what its clients parse.
LIST_TOOLS = {"get_messages", "wait_for_message", "list_channels", "get_directives"}
VOLATILE = {"created_at", "last_at", "last_seen", "session_id", "started_at", "ended_at"}
ID_KEYS = {"id", "reply_to", "last_id", "since_id"}


class NonJSON(str):
    """A body that is not JSON (the peer's plain-text 500s, a tool's prose): nothing to parse."""


# ---------------------------------------------------------------- servers

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    # Neither server may pick up a token or config from the caller's environment.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CROSSTALK_") and k not in ("RELAY_TOKEN", "RELAY_PARTICIPANTS",
                                                           "RELAY_DB", "HOST", "PORT")}
    env["RUST_LOG"] = "warn"
    return env


class Server:
    """A server process, its output in a log file; ready once it answers GET /api/channels."""

    def __init__(self, name, argv, env, cwd, port=None):
        self.name, self.host, self.port, self.log = name, "127.0.0.1", port, os.path.join(cwd, "log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.alive():
            for line in self.tail().splitlines():  # crosstalk says where it listens (--port 0)
                if line.startswith("crosstalk listening on http://"):
                    self.port = int(line.rsplit(":", 1)[1].strip().rstrip("/"))
            try:
                if self.port and http_call(self, "GET", "/api/channels", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{name} did not start:\n" + self.tail())

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(3)

    def tail(self):
        with open(self.log, "rb") as f:
            return f.read()[-2000:].decode(errors="replace")


def start_peer(peer_bin, tmp):
    port = free_port()
    env = dict(clean_env(), HOST="127.0.0.1", PORT=str(port), RELAY_DB=os.path.join(tmp, "relay.db"))
    return Server("crosstalk-mcp", [peer_bin], env, tmp, port)


def start_crosstalk(binary, tmp):
    argv = [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", os.path.join(tmp, "data")]
    return Server("crosstalk", argv, clean_env(), tmp)


# ---------------------------------------------------------------- HTTP, SSE, MCP

def http_call(server, method, path, body=None, raw=None, timeout=15):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def parse_json(data):
    try:
        return json.loads(data)
    except (ValueError, TypeError):
        text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        return NonJSON(text[:200])


def read_events(resp, done, deadline):
    """Reads SSE events ({event, data, id}) until done(events) or the deadline; comments are skipped."""
    events, ev = [], {}
    while time.monotonic() < deadline:
        try:
            line = resp.readline()
        except OSError:  # includes the socket's time-out
            break
        if not line:
            break
        line = line.decode(errors="replace").rstrip("\r\n")
        if line == "":
            if "data" in ev or "event" in ev:
                events.append(ev)
                if done(events):
                    break
            ev = {}
        elif not line.startswith(":"):
            field, _, val = line.partition(":")
            val = val[1:] if val.startswith(" ") else val
            if field == "data":
                ev["data"] = ev["data"] + "\n" + val if "data" in ev else val
            elif field in ("event", "id"):
                ev[field] = val
    return events


class Stream:
    """An open SSE stream of a channel."""

    def __init__(self, server, path):
        self.conn = http.client.HTTPConnection(server.host, server.port, timeout=6)
        self.conn.request("GET", path, headers={"Accept": "text/event-stream"})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status

    def next_named(self, name, timeout=6):
        """The next event called `name` (an unnamed event is a "message"), or None."""
        evs = read_events(self.resp, lambda e: e[-1].get("event", "message") == name,
                          time.monotonic() + timeout)
        ev = evs[-1] if evs and evs[-1].get("event", "message") == name else None
        return None if ev is None else {"event": name, "data": parse_json(ev.get("data", ""))}

    def close(self):
        try:
            self.conn.sock and self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


class Mcp:
    """Raw JSON-RPC over streamable HTTP: one session, answers as JSON or as an SSE stream."""

    def __init__(self, server):
        self.server, self.session, self.version, self.next_id = server, None, None, 1

    def send(self, method, params=None, notify=False):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if not notify:
            msg["id"] = self.next_id
            self.next_id += 1
        hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            hdrs["Mcp-Session-Id"] = self.session
        if self.version:
            hdrs["MCP-Protocol-Version"] = self.version
        conn = http.client.HTTPConnection(self.server.host, self.server.port, timeout=15)
        try:
            conn.request("POST", "/mcp", body=json.dumps(msg).encode(), headers=hdrs)
            resp = conn.getresponse()
            self.session = resp.getheader("Mcp-Session-Id") or self.session
            if notify:
                resp.read()
                return None
            if (resp.getheader("Content-Type") or "").startswith("text/event-stream"):
                def answered(evs):
                    d = parse_json(evs[-1].get("data", ""))
                    return isinstance(d, dict) and d.get("id") == msg["id"]
                evs = read_events(resp, answered, time.monotonic() + 15)
                return parse_json(evs[-1]["data"]) if evs and answered(evs) else {"error": {"code": "no answer"}}
            return parse_json(resp.read())
        finally:
            conn.close()

    def initialize(self):
        r = self.send("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                     "clientInfo": {"name": "differential", "version": "1"}})
        self.version = (r.get("result") or {}).get("protocolVersion") if isinstance(r, dict) else None
        self.send("notifications/initialized", notify=True)
        return r


def structured_as_peer(tool, sc):
    """crosstalk's contract for a client of crosstalk-mcp's tools: the peer's JSON is our
    structuredContent. MCP requires structuredContent to be an object, so where the peer answers
    a list (one text item per element) our object carries that list under a key (and, for
    get_directives, in two keys: directives and open questions, which the peer merges by id)."""
    if tool in ("get_messages", "wait_for_message"):
        return sc.get("messages")
    if tool == "list_channels":
        return sc.get("channels")
    if tool == "get_directives":
        merged = {m["id"]: m for m in sc.get("directives", []) + sc.get("open_questions", [])}
        return [merged[k] for k in sorted(merged)]
    return sc


def tool_value(tool, answer, ours=False):
    """What a client of crosstalk-mcp parses from a tools/call answer."""
    if not isinstance(answer, dict) or "result" not in answer:
        return {"jsonrpc_error": (answer.get("error") or {}).get("code") if isinstance(answer, dict) else None}
    res = answer["result"]
    value = {"isError": bool(res.get("isError", False))}
    if "structuredContent" in res:
        value["structuredContent"] = res["structuredContent"]
    if not value["isError"]:  # an error's text is prose on both sides; isError is the contract
        if ours and isinstance(res.get("structuredContent"), dict):
            value["text"] = structured_as_peer(tool, res["structuredContent"])
        else:
            texts = [parse_json(c.get("text", "")) for c in res.get("content", []) if c.get("type") == "text"]
            value["text"] = texts if tool in LIST_TOOLS else (texts[0] if texts else None)
    return value


# ---------------------------------------------------------------- the scripted sequence

class Run:
    """One server's pass through the script: results by step name, ids by step name."""

    def __init__(self, server):
        self.server, self.results, self.ids, self.mcp = server, {}, {}, Mcp(server)

    def record(self, step, what, status, value):
        assert step not in self.results, step
        self.results[step] = {"what": what, "status": status, "value": value}
        return value

    def rest(self, step, method, path, body=None, raw=None, fix=lambda v: v):
        try:
            status, _, data = http_call(self.server, method, path, body, raw)
            value = fix(parse_json(data)) if data else None
        except OSError as e:
            status, value = "ERR", NonJSON(repr(e))
        value = self.record(step, f"{method} {path}", status, value)
        if method == "POST" and path.endswith("/messages") and isinstance(value, dict):
            self.ids[step] = value.get("id")
        return value

    def tool(self, step, name, **args):
        try:
            answer = self.mcp.send("tools/call", {"name": name, "arguments": args})
            value = tool_value(name, answer, ours=self.server.name == "crosstalk")
        except OSError as e:
            value = {"jsonrpc_error": repr(e)}
        self.record(step, f"mcp {name}", None, value)
        # The object this tool returned, read from its JSON text or else from structuredContent.
        obj = value.get("text")
        obj = obj if isinstance(obj, dict) else value.get("structuredContent")
        if name == "post_message" and isinstance(obj, dict):
            self.ids[step] = obj.get("id")
        return obj if isinstance(obj, dict) else {}

    def derive(self, step, what, value):
        """A fact computed from earlier answers (e.g. a message joined the session just started)."""
        return self.record(step, what, None, value)

    obj = staticmethod(lambda value: value if isinstance(value, dict) else {})

    def id(self, step):
        return self.ids.get(step) or 0


def post(t, step, channel, **msg):
    return t.rest(step, "POST", f"/api/channels/{channel}/messages", msg)


def messages_and_channels(t):
    t.rest("channels.empty", "GET", "/api/channels")
    t.rest("messages.unknown_channel", "GET", "/api/channels/nobody/messages")
    post(t, "post.minimal", "dev", sender="agent-a", type="NOTE", body="hello")
    post(t, "post.full", "dev", sender="agent-b", type="request", body="line1\nline2 ✓",
         recipient="agent-a", side="Y", status="pending")
    post(t, "post.reply_to", "dev", sender="agent-a", type="response", body="ok",
         reply_to=t.id("post.minimal"))
    # What the peer's own web UI (ui.html) sends: explicit nulls for the optional fields.
    post(t, "post.explicit_nulls", "dev", sender="humanx", type="NOTE", body="from the UI",
         side=None, recipient=None, reply_to=None)
    # Fields the peer does not know are ignored by it.
    post(t, "post.unknown_field", "dev", sender="agent-b", type="NOTE", body="extra", priority="high")
    # Error paths. The peer answers 500 (a KeyError / JSONDecodeError) to all of these.
    post(t, "post.missing_body", "dev", sender="agent-a", type="NOTE")
    post(t, "post.missing_sender", "dev", type="NOTE", body="anonymous")
    t.rest("post.malformed_json", "POST", "/api/channels/dev/messages", raw=b'{"sender": ')
    t.rest("messages.all", "GET", "/api/channels/dev/messages")
    t.rest("messages.since_first", "GET", f"/api/channels/dev/messages?since_id={t.id('post.minimal')}")
    t.rest("messages.since_last", "GET", f"/api/channels/dev/messages?since_id={t.id('post.unknown_field')}")
    t.rest("messages.since_abc", "GET", "/api/channels/dev/messages?since_id=abc")
    t.rest("messages.since_negative", "GET", "/api/channels/dev/messages?since_id=-1")
    # Channel names: the peer takes any string as is; "DEV" is another channel than "dev".
    t.rest("messages.uppercase_channel", "GET", "/api/channels/DEV/messages")
    t.rest("messages.channel_with_space", "GET", "/api/channels/my%20channel/messages")


def waits(t):
    last = t.id("post.unknown_field")
    t.rest("wait.immediate", "GET", f"/api/channels/dev/wait?since_id={t.id('post.minimal')}&timeout_s=1")
    t.rest("wait.timeout", "GET", f"/api/channels/dev/wait?since_id={last}&timeout_s=1")
    t.rest("wait.unknown_channel", "GET", "/api/channels/nobody/wait?timeout_s=1")
    t.rest("wait.since_abc", "GET", "/api/channels/dev/wait?since_id=abc&timeout_s=1")
    t.rest("wait.timeout_abc", "GET", f"/api/channels/dev/wait?since_id={last}&timeout_s=abc")
    # A wait that is pending when the post lands wakes with it. If the post wins the race the
    # wait returns at once anyway (since_id is a cursor), so the outcome is timing-independent.
    box = {}
    waiter = threading.Thread(target=lambda: box.update(r=http_call(
        t.server, "GET", f"/api/channels/dev/wait?since_id={last}&timeout_s=10")))
    waiter.start()
    time.sleep(0.3)
    post(t, "wait.wake_post", "dev", sender="agent-b", type="NOTE", body="wake up")
    waiter.join(12)
    status, _, data = box.get("r", ("ERR", {}, b"no answer"))
    t.record("wait.woken", "GET wait pending during a post", status, parse_json(data))
    t.rest("channels.after_posts", "GET", "/api/channels")


def questions(t):
    post(t, "qa.question_to_human", "qa", sender="agent-a", type="QUESTION", body="deploy?", recipient="humanx")
    post(t, "qa.question_broadcast", "qa", sender="agent-b", type="QUESTION", body="anyone?")
    post(t, "qa.directive", "qa", sender="humanx", type="DIRECTIVE", body="stop", recipient="agent-a")
    post(t, "qa.interrupt_other", "qa", sender="humanx", type="INTERRUPT", body="pause", recipient="agent-b")
    post(t, "qa.note", "qa", sender="agent-a", type="NOTE", body="fyi")
    t.rest("qa.directives_humanx", "GET", "/api/channels/qa/directives?recipient=humanx")
    t.rest("qa.directives_agent_a", "GET", "/api/channels/qa/directives?recipient=agent-a")
    t.rest("qa.directives_no_recipient", "GET", "/api/channels/qa/directives")
    post(t, "qa.answer", "qa", sender="humanx", type="ANSWER", body="yes", recipient="agent-a",
         reply_to=t.id("qa.question_to_human"))
    t.rest("qa.messages_after_answer", "GET", "/api/channels/qa/messages")
    t.rest("qa.directives_after_answer", "GET", "/api/channels/qa/directives?recipient=humanx")
    t.rest("qa.directives_since", "GET",
           f"/api/channels/qa/directives?recipient=agent-a&since_id={t.id('qa.question_broadcast')}")
    t.rest("qa.directives_since_abc", "GET", "/api/channels/qa/directives?recipient=agent-a&since_id=abc")
    t.rest("qa.directives_unknown_channel", "GET", "/api/channels/nobody/directives?recipient=humanx")


def sessions(t):
    path = "/api/channels/sess/session"
    t.rest("session.get_none", "GET", path)
    t.rest("session.delete_none", "DELETE", path)
    s = t.obj(t.rest("session.start_max2", "POST", path, {"max_turns": 2}))
    t.rest("session.get_active", "GET", path)
    m = t.obj(post(t, "session.turn1", "sess", sender="agent-a", type="NOTE", body="t1"))
    t.derive("session.turn1_joined", "turn 1 carries the session id",
             {"same_session": bool(s.get("session_id")) and m.get("session_id") == s.get("session_id")})
    t.rest("session.get_after_turn1", "GET", path)
    post(t, "session.turn2_reaches_max", "sess", sender="agent-b", type="NOTE", body="t2")
    t.rest("session.get_after_max_turns", "GET", path)
    post(t, "session.post_without_session", "sess", sender="agent-a", type="NOTE", body="t3")
    t.rest("session.start_no_body", "POST", path)
    post(t, "session.done_a", "sess", sender="agent-a", type="DONE", body="finished")
    t.rest("session.get_after_one_done", "GET", path)
    post(t, "session.done_b_lowercase", "sess", sender="agent-b", type="done", body="me too")
    t.rest("session.get_after_two_dones", "GET", path)
    # The peer's UI starts a session with {"max_turns": null} for "unlimited".
    s = t.obj(t.rest("session.start_null_max_turns", "POST", path, {"max_turns": None}))
    e = t.obj(t.rest("session.delete_active", "DELETE", path))
    t.derive("session.delete_names_it", "DELETE answers the started session's id",
             {"same_session": bool(s.get("session_id")) and e.get("session_id") == s.get("session_id")})
    t.rest("session.delete_again", "DELETE", path)
    t.rest("session.start_malformed_json", "POST", path, raw=b"{bad")
    t.rest("session.start_max_turns_x", "POST", path, {"max_turns": "x"})
    a = t.obj(t.rest("session.start_max_turns_string", "POST", path, {"max_turns": "3"}))
    b = t.obj(t.rest("session.start_replaces_active", "POST", path, {"max_turns": 5}))
    t.derive("session.restart_new_id", "starting again makes a new session",
             {"new_session": bool(b.get("session_id")) and a.get("session_id") != b.get("session_id")})
    t.rest("session.get_replaced", "GET", path)
    t.rest("session.delete_replaced", "DELETE", path)


def stream_and_presence(t):
    post(t, "live.post_before", "live", sender="agent-a", type="NOTE", body="backlog")
    # Backlog: `ready`, then the stored message.
    st = Stream(t.server, "/api/channels/live/stream?since_id=0")
    t.record("live.stream_backlog", "SSE ready + backlog message", st.status,
             {"ready": st.next_named("ready"), "message": st.next_named("message")})
    st.close()
    # Live, announcing presence: ready, presence while open, a message posted meanwhile.
    q = urllib.parse.urlencode({"since_id": t.id("live.post_before"), "participant_id": "humanx",
                                "display_name": "Human X", "kind": "human", "side": "X"})
    st = Stream(t.server, f"/api/channels/live/stream?{q}")
    ready = st.next_named("ready")
    presence(t, "live.presence_while_streaming")
    post(t, "live.post_during_stream", "live", sender="agent-b", type="NOTE", body="live")
    t.record("live.stream_live", "SSE with participant_id: ready + live message", st.status,
             {"ready": ready, "message": st.next_named("message")})
    st.close()
    # Closing the stream takes the participant away (the peer notices within ~1-2 s): poll.
    deadline = time.monotonic() + 5
    while "humanx" in json.dumps(http_call(t.server, "GET", "/api/channels/live/presence")[2].decode()) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    presence(t, "live.presence_after_close")
    presence(t, "presence.unknown_channel", "nobody")
    # A bad cursor must fail before streaming starts (read as a stream so a 200 cannot hang us).
    st = Stream(t.server, "/api/channels/live/stream?since_id=abc")
    value = st.next_named("ready", timeout=2) if st.status == 200 else parse_json(st.resp.read())
    st.close()
    t.record("stream.since_abc", "GET /api/channels/live/stream?since_id=abc", st.status, value)


def sort_presence(v):
    # The order of participants is not part of the contract.
    def key(p):
        return str(p.get("id", p.get("participant_id"))) if isinstance(p, dict) else ""
    if isinstance(v, list):
        return sorted(v, key=key)
    if isinstance(v, dict) and isinstance(v.get("participants"), list):
        return dict(v, participants=sorted(v["participants"], key=key))
    return v


def presence(t, step, channel="live"):
    t.rest(step, "GET", f"/api/channels/{channel}/presence", fix=sort_presence)


def misc(t):
    status, headers, _ = http_call(t.server, "GET", "/")
    t.record("misc.root", "GET /", status, {"location": headers.get("location")})
    t.rest("misc.unknown_route", "GET", "/api/nope")
    t.rest("misc.wrong_method", "PUT", "/api/channels/dev/messages")
    # Every channel once more, now that sessions came and went: count and last_id per channel.
    t.rest("channels.all", "GET", "/api/channels")


def mcp_tools(t):
    init = t.mcp.initialize()
    res = init.get("result", {}) if isinstance(init, dict) else {}
    t.record("mcp.initialize", "initialize", None,
             {"protocolVersion": res.get("protocolVersion"), "has_tools": "tools" in res.get("capabilities", {}),
              "serverInfo.name": res.get("serverInfo", {}).get("name")})
    listed = t.mcp.send("tools/list", {})
    tools = {tl["name"]: {"props": sorted(tl.get("inputSchema", {}).get("properties", {})),
                          "required": sorted(tl.get("inputSchema", {}).get("required", []))}
             for tl in (listed.get("result", {}) if isinstance(listed, dict) else {}).get("tools", [])}
    t.record("mcp.tools_list", "tools/list: names and arguments", None, tools)
    t.tool("mcp.list_channels", "list_channels")
    t.tool("mcp.post_message", "post_message", channel="mcp", sender="agent-a", type="NOTE", body="via mcp")
    t.tool("mcp.post_message_full", "post_message", channel="mcp", sender="agent-b", type="response",
           body="re", recipient="agent-a", reply_to=t.id("mcp.post_message"), status="done", side="Y")
    t.tool("mcp.post_message_missing_args", "post_message", channel="mcp")
    t.tool("mcp.get_messages", "get_messages", channel="mcp")
    t.tool("mcp.get_messages_since", "get_messages", channel="mcp", since_id=t.id("mcp.post_message"))
    t.tool("mcp.get_messages_since_as_string", "get_messages", channel="mcp", since_id=str(t.id("mcp.post_message")))
    t.tool("mcp.get_messages_unknown_channel", "get_messages", channel="nobody")
    t.tool("mcp.get_messages_since_abc", "get_messages", channel="mcp", since_id="abc")
    t.tool("mcp.wait_immediate", "wait_for_message", channel="mcp", since_id=t.id("mcp.post_message"), timeout_s=1)
    t.tool("mcp.wait_timeout", "wait_for_message", channel="mcp", since_id=t.id("mcp.post_message_full"), timeout_s=1)
    t.tool("mcp.get_session_none", "get_session", channel="mcp-sess")
    t.tool("mcp.end_session_none", "end_session", channel="mcp-sess")
    s = t.tool("mcp.start_session", "start_session", channel="mcp-sess", max_turns=3)
    t.tool("mcp.get_session_active", "get_session", channel="mcp-sess")
    m = t.tool("mcp.session_post", "post_message", channel="mcp-sess", sender="agent-a", type="NOTE", body="in")
    t.derive("mcp.session_post_joined", "the post carries the session id",
             {"same_session": bool(s.get("session_id")) and m.get("session_id") == s.get("session_id")})
    t.tool("mcp.get_session_after_post", "get_session", channel="mcp-sess")
    e = t.tool("mcp.end_session", "end_session", channel="mcp-sess")
    t.derive("mcp.end_session_names_it", "end_session answers the started session's id",
             {"same_session": bool(s.get("session_id")) and e.get("session_id") == s.get("session_id")})
    t.tool("mcp.start_session_no_max", "start_session", channel="mcp-sess")
    t.tool("mcp.end_session_again", "end_session", channel="mcp-sess")
    t.tool("mcp.question", "post_message", channel="mcp-qa", sender="agent-a", type="QUESTION",
           body="ok?", recipient="humanx")
    t.tool("mcp.directive", "post_message", channel="mcp-qa", sender="humanx", type="DIRECTIVE",
           body="go", recipient="agent-a")
    t.tool("mcp.get_directives_humanx", "get_directives", channel="mcp-qa", recipient="humanx")
    t.tool("mcp.get_directives_agent_a", "get_directives", channel="mcp-qa", recipient="agent-a")
    t.tool("mcp.answer", "post_message", channel="mcp-qa", sender="humanx", type="ANSWER", body="yes",
           reply_to=t.id("mcp.question"))
    t.tool("mcp.get_directives_after_answer", "get_directives", channel="mcp-qa", recipient="humanx")
    t.tool("mcp.get_directives_since", "get_directives", channel="mcp-qa", recipient="agent-a",
           since_id=t.id("mcp.directive"))
    t.tool("mcp.list_channels_after", "list_channels")
    answer = t.mcp.send("tools/call", {"name": "no_such_tool", "arguments": {}})
    t.record("mcp.unknown_tool", "tools/call of an unknown tool", None, tool_value("no_such_tool", answer))


def diverging(t):
    """Steps one server accepts and the other refuses: they change what is stored on one side
    only, so they run last, where they cannot skew the comparisons of other steps."""
    post(t, "post.missing_type", "dev", sender="agent-a", body="no type")
    # The peer stores any reply_to, even one naming no message.
    post(t, "qa.answer_dangling_reply_to", "qa", sender="humanx", type="ANSWER", body="?", reply_to=999999)


GROUPS = [messages_and_channels, waits, questions, sessions, stream_and_presence, misc, mcp_tools,
          diverging]


# ---------------------------------------------------------------- comparison

def jtype(v):
    if isinstance(v, (NonJSON, bool)):
        return "text" if isinstance(v, NonJSON) else "bool"
    return "number" if isinstance(v, (int, float)) else {type(None): "null"}.get(type(v), type(v).__name__)


def short(v, n=70):
    s = v.replace("\n", "⏎") if isinstance(v, NonJSON) else json.dumps(v, ensure_ascii=False)
    return s if len(s) <= n else s[:n - 1] + "…"


def compare(peer, ours, path, key, idmap, problems):
    if isinstance(peer, NonJSON):
        return  # the peer's body is not JSON (a plain-text 500 or prose): nothing a client parses
    if jtype(peer) != jtype(ours):
        problems.append(f"{path or '.'}: peer {jtype(peer)} {short(peer)} / ours {jtype(ours)} {short(ours)}")
    elif isinstance(peer, dict):
        missing = [k for k in peer if k not in ours]
        if missing:
            problems.append(f"{path or '.'}: missing in ours: "
                            + ", ".join(f"{k} (peer {short(peer[k], 40)})" for k in missing))
        for k in peer:
            if k in ours:
                compare(peer[k], ours[k], f"{path}.{k}", k, idmap, problems)
    elif isinstance(peer, list):
        if len(peer) != len(ours):
            problems.append(f"{path or '.'}: peer {len(peer)} items / ours {len(ours)}")
        for i, (p, o) in enumerate(zip(peer, ours)):
            compare(p, o, f"{path}[{i}]", key, idmap, problems)
    elif key in VOLATILE:
        pass
    elif key in ID_KEYS and jtype(peer) == "number" and peer != 0:
        if peer in idmap and idmap[peer] != ours:
            problems.append(f"{path}: peer id {peer} (= our {idmap[peer]}) / ours {ours}")
    elif peer != ours:
        problems.append(f"{path}: peer {short(peer, 40)} / ours {short(ours, 40)}")


def compare_tools(peer, ours, problems):
    """Every peer tool exists in ours, takes the peer's arguments, and requires no more."""
    for name, spec in peer.items():
        if name not in ours:
            problems.append(f"tool {name}: missing in ours")
            continue
        missing = [a for a in spec["props"] if a not in ours[name]["props"]]
        extra = [a for a in ours[name]["required"] if a not in spec["required"]]
        problems += [f"tool {name}: ours lacks arguments {missing}"] * bool(missing)
        problems += [f"tool {name}: ours requires {extra}, the peer does not"] * bool(extra)


def summary(r):
    v = r["value"]
    def shape(x):
        if isinstance(x, dict):
            return "{" + ",".join(list(x)[:4]) + (",…" if len(x) > 4 else "") + "}"
        if isinstance(x, list):
            return f"[{len(x)}×{shape(x[0])}]" if x else "[]"
        return short(x, 16)
    status = "" if r["status"] is None else f"{r['status']} "
    if isinstance(v, dict) and "isError" in v:  # a tool result: what its text parses to
        return status + ("isError" if v["isError"] else shape(v.get("text")))
    return status + shape(v)


def run_all(args):
    """Each server in turn: start it, run every group against it, stop it. Bounded in time."""
    servers, runs, tmp = [], {}, tempfile.mkdtemp(prefix="differential-")

    def abort():  # the whole run is bounded: kill the servers and fail
        print(f"FAILED: the differential run took more than {args.budget:.0f} s", flush=True)
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        os._exit(2)
    watchdog = threading.Timer(args.budget, abort)
    watchdog.daemon = True
    watchdog.start()
    try:
        for name, start, binary in (("peer", start_peer, args.peer), ("ours", start_crosstalk, args.crosstalk)):
            os.makedirs(os.path.join(tmp, name))
            server = start(binary, os.path.join(tmp, name))
            servers.append(server)
            t0, run = time.monotonic(), Run(server)
            for group in GROUPS:
                try:
                    group(run)
                except Exception as e:  # the group's later steps show up as "step not run"
                    print(f"WARNING: {server.name}: {group.__name__} stopped: {e!r}")
            print(f"== {server.name}: {len(run.results)} steps in {time.monotonic() - t0:.1f} s", flush=True)
            if not server.alive():
                print(f"WARNING: {server.name} died during the run:\n{server.tail()}")
            server.stop()
            runs[name] = run
    finally:
        for s in servers:
            s.stop()
        watchdog.cancel()
        shutil.rmtree(tmp, ignore_errors=True)
    return runs["peer"], runs["ours"]


def report(peer, ours, allowed, dump):
    idmap = {peer.ids[s]: ours.ids[s] for s in peer.ids if peer.ids.get(s) and ours.ids.get(s)}
    counts = {"same": 0, "allowed": 0, "DIFF": 0}
    rows, details = [], []
    for step, p in peer.results.items():
        o = ours.results.get(step, {"what": p["what"], "status": "ERR", "value": NonJSON("step not run")})
        problems = [f"status: peer {p['status']} / ours {o['status']}"] if p["status"] != o["status"] else []
        if step == "mcp.tools_list":
            compare_tools(p["value"], o["value"], problems)
        else:
            compare(p["value"], o["value"], "", None, idmap, problems)
        verdict = "same" if not problems else "allowed" if step in allowed else "DIFF"
        counts[verdict] += 1
        rows.append((step, p["what"], summary(p), summary(o), verdict))
        if problems or dump:
            notes = [f"  - {x}" for x in problems]
            if step in allowed and problems:
                notes.append(f"  allowed: {allowed[step]}")
            pv, ov = p["value"], o["value"]
            # Ours' structuredContent against the peer's text, so the fix is visible at a glance.
            if isinstance(pv, dict) and isinstance(ov, dict) and "text" in pv and "structuredContent" in ov:
                sc = []
                compare(pv["text"], ov["structuredContent"], "", None, idmap, sc)
                notes += [f"  (ours structuredContent vs peer text) {x}" for x in sc]
            for who, r in (("peer", p), ("ours", o)):
                notes.append(f"  {who}: {'' if r['status'] is None else r['status']} {short(r['value'], 2000)}")
            details.append(f"{step} [{verdict}]\n" + "\n".join(notes))
    for step in allowed:
        if step not in peer.results:
            print(f"WARNING: allowed.json names unknown step {step}")
    w = [min(max(len(r[i]) for r in rows), m) for i, m in enumerate((38, 44, 30, 30))]
    print()
    for r in [("step", "what", "crosstalk-mcp", "crosstalk", "verdict")] + rows:
        print("  ".join(str(c)[:w[i]].ljust(w[i]) for i, c in enumerate(r[:4])) + "  " + r[4])
    if details:
        print("\n== details\n" + "\n\n".join(details))
    print(f"\ndifferential: {counts['same']} same, {counts['allowed']} allowed, {counts['DIFF']} different")
    return 0 if counts["DIFF"] == 0 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True, help="the crosstalk-mcp console script")
    ap.add_argument("--crosstalk", required=True, help="the crosstalk binary")
    ap.add_argument("--dump", action="store_true", help="print both answers of every step")
    ap.add_argument("--budget", type=float, default=55, help="seconds before the run is aborted")
    args = ap.parse_args()
    args.peer, args.crosstalk = os.path.abspath(args.peer), os.path.abspath(args.crosstalk)
    with open(os.path.join(HERE, "allowed.json")) as f:
        allowed = json.load(f)
    try:
        peer, ours = run_all(args)
    except RuntimeError as e:  # a server did not start
        print(f"FAILED: {e}")
        return 2
    return report(peer, ours, allowed, args.dump)


if __name__ == "__main__":
    sys.exit(main())
