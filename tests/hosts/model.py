"""A scripted model on 127.0.0.1, for running real agent hosts (Claude Code, Codex) headless.

It speaks the two wire formats the hosts use, streaming:
  - Anthropic's Messages API, `POST /v1/messages` (Claude Code, through ANTHROPIC_BASE_URL);
  - OpenAI's Responses API, `POST /v1/responses` (Codex, through a `[model_providers]` entry
    with `wire_api = "responses"`).

Instead of thinking it plays a script. A host's prompt names its script with a marker,
`[script:NAME]`; each step of the script is either a tool call (the tool's short name and its
arguments, which may be computed from the tool results the model has been given so far) or the
final text. Which step comes next is read from the conversation the host sends, not counted
by the server: the number of tool results the model was given after the last prompt that names
the script. So a host's retry gets the same answer, and a resumed conversation (its whole
history sent again) picks up where it left off.

What the model is given is recorded per script: each tool result, in the form the host passed
it to the model. A step that cannot be played (a tool that did not succeed, arguments that need
a field no result carried) ends the script with a final text saying so, recorded as the
script's error.

Any request that is not for this server (a proxy's CONNECT, an absolute URL: a host trying to
reach the internet through HTTPS_PROXY) is refused and recorded as an escape attempt.
"""

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MARKER = re.compile(r"\[script:([A-Za-z0-9_.-]+)\]")
# Codex frames a tool's output for the model: "Wall time: 0.01 seconds\nOutput:\n", then it.
CODEX_FRAME = re.compile(r"^Wall time: [^\n]*\nOutput:\n?")
# Claude Code defers MCP tools behind this tool of its own: a model loads a tool through it
# before calling it. Its results are the host's business, not steps of a script.
TOOL_SEARCH = "ToolSearch"


class ScriptError(Exception):
    """A step's arguments could not be computed from what the model was given."""


@dataclass
class Call:
    """One step: call `tool` (the relay's short name; the host's prefix is found in the tools
    the host offers) with `args`, a dict or a function of every tool result so far."""

    tool: str
    args: object = field(default_factory=dict)
    # The call is meant to fail (the relay is down): its error is given to the model, and the
    # script goes on.
    refused: bool = False


@dataclass
class Say:
    """The final step: answer with this text and stop."""

    text: str


@dataclass
class Seen:
    """A tool result as the host gave it to the model."""

    tool: str
    text: str
    # The host marked it as an error (a refusal, a bad argument).
    error: bool = False

    def json(self):
        """The result as JSON, if the host passed it as JSON (the structured result); else None."""
        try:
            return json.loads(self.text)
        except ValueError:
            return None


class Model:
    """The scripts, and what the hosts sent."""

    def __init__(self):
        self.lock = threading.Lock()
        self.scripts = {}
        # Per script: the tool results the model was given since the script's prompt, in order.
        self.seen = {}
        # Per script: every tool result in the conversation, a resumed one's history included.
        self.history = {}
        # Per script: why it could not be played to its end.
        self.errors = {}
        # Every request: (path, what the model answered), for a failure's report.
        self.requests = []
        # The newest request body on each path, for a failure's report.
        self.last_body = {}
        # Requests meant for somewhere else (a proxy request, an absolute URL).
        self.escapes = []
        # Numbers the Responses API's items.
        self.turns = 0

    def script(self, name, steps):
        with self.lock:
            self.scripts[name] = steps
            self.seen.pop(name, None)
            self.history.pop(name, None)
            self.errors.pop(name, None)

    def next_step(self, name, seen, history, offered, listed):
        """The step to play after `seen` (the tool results since the script's prompt); `history`
        is every tool result in the conversation, `offered` the names of the tools the host
        sent, `listed` the text in which a host lists the tools it has not loaded yet.
        Returns (the tool's name as the host offers it, arguments), or the final text."""
        with self.lock:
            steps = self.scripts.get(name)
            self.seen[name] = list(seen)
            self.history[name] = list(history)
        try:
            if steps is None:
                raise ScriptError(f"no script named {name}")
            # Every tool of the relay answers a structured result (JSON) when it succeeds; an
            # error flagged by the host, or a text in its place (Codex flags none), ends it.
            expected_refusal = seen and isinstance(steps[len(seen) - 1], Call) and steps[len(seen) - 1].refused
            if seen and not expected_refusal and (seen[-1].error or seen[-1].json() is None):
                raise ScriptError(f"{seen[-1].tool} did not succeed; the model was given: {seen[-1].text[:500]}")
            if len(seen) >= len(steps):
                raise ScriptError(f"script {name} has no step {len(seen) + 1}")
            step = steps[len(seen)]
            if isinstance(step, Say):
                return step.text
            full = [t for t in offered if t == step.tool or t.endswith(("__" + step.tool, "." + step.tool))]
            if not full and TOOL_SEARCH in offered:
                pattern = r"\bmcp__[A-Za-z0-9_-]+__" + re.escape(step.tool) + r"\b"
                named = sorted(set(re.findall(pattern, listed)))
                if len(named) == 1:
                    return TOOL_SEARCH, {"query": f"select:{named[0]}", "max_results": 1}
            if len(full) != 1:
                raise ScriptError(f"the host offers {len(full)} tools named {step.tool}: {sorted(offered)}")
            return full[0], step.args(history) if callable(step.args) else step.args
        except ScriptError as e:
            with self.lock:
                self.errors[name] = str(e)
            return f"SCRIPT ERROR: {e}"


def _text(content):
    """The text of a message's or a tool result's content, whichever shape the host used."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(c) for c in content)
    if isinstance(content, dict):
        for key in ("text", "content", "output"):
            if key in content:
                return _text(content[key])
    return ""


def _short(name):
    """A tool's own name, without the host's prefix (`mcp__crosstalk__`, `mcp__crosstalk.`)."""
    return re.split(r"__|\.", name)[-1]


# ---- Anthropic Messages API
def anthropic_turn(model, body):
    """(script name, step) for a Messages request, or None for a request whose prompt names no
    script (a host's side request, such as a title)."""
    messages = body.get("messages", [])
    start = name = None
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            found = MARKER.search(_text(m.get("content")))
            if found:
                start, name = i, found.group(1)
    if start is None:
        return None
    names, history, seen = {}, [], []
    for i, m in enumerate(messages):
        content = m.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                names[block.get("id")] = block.get("name", "")
            elif block.get("type") == "tool_result":
                tool = names.get(block.get("tool_use_id"), "?")
                if tool == TOOL_SEARCH:
                    continue
                result = Seen(_short(tool), _text(block.get("content")), bool(block.get("is_error")))
                history.append(result)
                if i > start:
                    seen.append(result)
    offered = [t.get("name", "") for t in body.get("tools", [])]
    return name, model.next_step(name, seen, history, offered, _text(messages))


def anthropic_events(step, model_name):
    """The SSE events of one assistant message playing `step`."""
    message = {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": model_name,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    yield "message_start", {"type": "message_start", "message": message}
    if isinstance(step, str):
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": step}
        stop = "end_turn"
    else:
        tool, args = step
        block = {"type": "tool_use", "id": f"toolu_{abs(hash((tool, json.dumps(args)))):x}", "name": tool, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(args)}
        stop = "tool_use"
    yield "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
    yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    delta = {"stop_reason": stop, "stop_sequence": None}
    yield "message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 5}}
    yield "message_stop", {"type": "message_stop"}


# ---- OpenAI Responses API
def responses_turn(model, body):
    """(script name, step) for a Responses request, or None as above."""
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    start = name = None
    for i, item in enumerate(items):
        if item.get("type", "message") == "message" and item.get("role") == "user":
            found = MARKER.search(_text(item.get("content")))
            if found:
                start, name = i, found.group(1)
    if start is None:
        return None
    names, history, seen = {}, [], []
    for i, item in enumerate(items):
        if item.get("type") == "function_call":
            names[item.get("call_id")] = item.get("name", "")
        elif item.get("type") == "function_call_output":
            text = CODEX_FRAME.sub("", _text(item.get("output")), count=1)
            result = Seen(_short(names.get(item.get("call_id"), "?")), text)
            history.append(result)
            if i > start:
                seen.append(result)
    offered = []
    for t in body.get("tools", []):
        if t.get("type") == "function":
            offered.append(t.get("name", ""))
        elif t.get("type") == "namespace":
            # Tools grouped by server (Codex: `mcp__crosstalk`), called by namespace and name.
            offered += [f"{t.get('name')}.{f.get('name')}" for f in t.get("tools", [])]
    return name, model.next_step(name, seen, history, offered, "")


def responses_events(step, model_name, turn):
    """The SSE events of one response playing `step`."""
    response = {"id": f"resp_{turn}", "object": "response", "model": model_name, "status": "in_progress", "output": []}
    yield "response.created", {"type": "response.created", "response": response}
    if isinstance(step, str):
        text = {"type": "output_text", "text": step, "annotations": []}
        item = {"type": "message", "id": f"msg_{turn}", "role": "assistant", "status": "completed", "content": [text]}
        added = {**item, "content": []}
        yield "response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": added}
        delta = {"item_id": item["id"], "output_index": 0, "content_index": 0, "delta": step}
        yield "response.output_text.delta", {"type": "response.output_text.delta", **delta}
    else:
        tool, args = step
        namespace, _, tool = tool.rpartition(".")
        item = {
            "type": "function_call",
            "id": f"fc_{turn}",
            "call_id": f"call_{turn}",
            "name": tool,
            "arguments": json.dumps(args),
            "status": "completed",
        }
        if namespace:
            item["namespace"] = namespace
        yield "response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}
    yield "response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    done = {**response, "status": "completed", "output": [item], "usage": usage}
    yield "response.completed", {"type": "response.completed", "response": done}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _refuse_escape(self):
        self.server.model.escapes.append(f"{self.command} {self.path}")
        self.send_response(403)
        self.send_header("content-length", "0")
        self.send_header("connection", "close")
        self.end_headers()

    def do_CONNECT(self):
        self._refuse_escape()

    def do_GET(self):
        if not self.path.startswith("/"):
            return self._refuse_escape()
        self._error(404, f"no route GET {self.path}")

    def _error(self, status, message):
        self.server.model.requests.append((self.path, f"{status}: {message}"))
        data = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": message}}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        if not self.path.startswith("/"):
            return self._refuse_escape()
        model = self.server.model
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self._error(400, "the body is not JSON")
        path = self.path.split("?")[0]
        if not body.get("stream"):
            return self._error(400, "this model answers streamed requests only")
        with model.lock:
            model.last_body[path] = body
            model.turns += 1
            turn = model.turns
        if path.endswith("/v1/messages"):
            played = anthropic_turn(model, body)
            step = played[1] if played else "ok"
            events = anthropic_events(step, body.get("model", "scripted"))
        elif path.endswith("/v1/responses"):
            played = responses_turn(model, body)
            step = played[1] if played else "ok"
            events = responses_events(step, body.get("model", "scripted"), turn)
        else:
            return self._error(404, f"no route POST {self.path}")
        summary = f"says {step[:100]!r}" if isinstance(step, str) else f"calls {step[0]}({json.dumps(step[1])[:200]})"
        model.requests.append((path, f"{played[0] if played else 'no script'}: {summary}"))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        for event, data in events:
            self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        self.close_connection = True


def serve(model):
    """The model on a free loopback port, served by a thread; returns the server (its
    `server_address`, and `shutdown()`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.model = model
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
