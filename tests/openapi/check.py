"""Checks the relay's /openapi.json against a real relay (run by scripts/openapi-check).

Usage: check.py [RELAY_BINARY]   (default target/debug/crosstalk)

Starts the relay twice (no token, then --token s3cret), validates the document as OpenAPI 3.1
and drives every operation in it through a scripted sequence of successes and errors. Every
answer's status must be documented for its operation and its body must be of the documented
media type and schema (JSON Schema 2020-12). A request the relay should accept must be valid
by the document (parameters, headers, body); one wrong by the document's own schemas (missing
field, wrong type) must be refused by it. Every operation must answer 2xx at least once.
Prints one line per request and `openapi: N passed, M failed`; exits 1 on any failure.
"""

import functools
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import jsonschema
import openapi_spec_validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

BUDGET_S = 55
TOKEN = "s3cret"
CH = "oa"
BASE_URI = "urn:crosstalk:openapi"
STREAM = "/api/channels/{channel}/stream"
# The stream's alternatives to Authorization for EventSource, which sends no headers.
STREAM_TOKEN_PARAMS = ("token", "relay_token")
RELAYS = []  # (process, data dir): killed and removed on every exit path
RESULTS = {"passed": 0, "failed": 0}
COVERED = set()  # (METHOD, path template) that answered 2xx


def kill_relays():
    while RELAYS:
        proc, data_dir = RELAYS.pop()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def start_relay(binary, token=None):
    """A fresh relay on a free port; its host:port."""
    data_dir = tempfile.mkdtemp(prefix="crosstalk-openapi-")
    # Requests without a token are sent faster than the failed-authentication limit allows; the
    # limit has its own test (tests/it/security.rs), so here each of them gets its 401.
    args = [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", data_dir,
            "--auth-failure-rate", "0"]
    proc = subprocess.Popen(args + (["--token", token] if token else []), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "RUST_LOG": "warn"})
    RELAYS.append((proc, data_dir))
    log = []
    for line in proc.stdout:
        log.append(line)
        if line.startswith("crosstalk listening on "):
            # Keep draining the pipe so the relay never blocks on a full one.
            threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()
            return urllib.parse.urlsplit(line.split()[-1]).netloc
    raise RuntimeError("the relay did not say where it listens:\n" + "".join(log))


def ptr(*parts):
    """A JSON pointer to parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class Doc:
    """The document, and a validator for any schema in it by JSON pointer."""

    def __init__(self, doc):
        self.doc = doc
        dialect = doc.get("jsonSchemaDialect")
        if dialect != "https://json-schema.org/draft/2020-12/schema":
            raise AssertionError(f"jsonSchemaDialect is {dialect!r}, not JSON Schema 2020-12")
        self.cls = jsonschema.validators.validator_for({"$schema": dialect})
        resource = Resource.from_contents(doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource(BASE_URI, resource)
        self.validators = {}

    def op(self, method, template):
        return self.doc["paths"].get(template, {}).get(method.lower())

    def error(self, pointer, instance):
        """Why instance does not validate against the schema at pointer, or None."""
        if pointer not in self.validators:
            self.validators[pointer] = self.cls({"$ref": f"{BASE_URI}#{pointer}"}, registry=self.registry)
        err = jsonschema.exceptions.best_match(self.validators[pointer].iter_errors(instance))
        return None if err is None else f"{err.json_path}: {err.message}"


def report(what, status, problems, text=""):
    RESULTS["failed" if problems else "passed"] += 1
    if problems:
        print(f"FAIL {what} -> {status}: {' | '.join(problems)}" + (f"\n       body: {text[:400]}" if text else ""),
              flush=True)
    else:
        print(f"ok   {what} -> {status}", flush=True)


class Client:
    def __init__(self, doc, netloc, token=None, label=""):
        self.doc, self.netloc, self.token, self.label = doc, netloc, token, label
        self.streams = []  # SSE connections kept open

    def get_json(self, url):
        """A GET outside the checks (polling)."""
        conn = http.client.HTTPConnection(self.netloc, timeout=10)
        conn.request("GET", url, headers={"Authorization": f"Bearer {self.token}"} if self.token else {})
        try:
            return json.loads(conn.getresponse().read() or b"null")
        finally:
            conn.close()

    def call(self, method, template, body=None, path=None, query=None, raw=None, session=None,
             headers=None, auth=True, expect=200, doc_valid=None, keep=False):
        """One request, checked against the document; (status, JSON body or None).
        body: sent as JSON; raw: sent as it is. auth: True (the client's token), False (none) or
        a token. doc_valid: whether the document must accept the request (default: when a 2xx
        is expected). keep: an SSE stream stays open (closed by close_streams)."""
        path = {"channel": CH, **(path or {})}
        url = template.format(**{k: urllib.parse.quote(str(v), safe="") for k, v in path.items()})
        query = query or {}
        if query:
            url += "?" + urllib.parse.urlencode({k: json.dumps(v) if isinstance(v, bool) else v
                                                 for k, v in query.items()})
        hdrs = dict(headers or {})
        token = self.token if auth is True else auth
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        if session:
            hdrs["X-Crosstalk-Session"] = session
        data = raw if raw is not None else None if body is None else json.dumps(body)
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(self.netloc, timeout=10)
        conn.request(method, url, body=data, headers=hdrs)
        resp = conn.getresponse()
        if doc_valid is None and expect and 200 <= expect < 300:
            doc_valid = True
        if template == STREAM:
            query = {k: v for k, v in query.items() if k not in STREAM_TOKEN_PARAMS}
        problems = self.check_request(method, template, path, query, body, hdrs, doc_valid)
        text, value = "", None
        if template == STREAM and resp.status == 200:
            problems += self.check_stream(resp)
        else:
            text = resp.read().decode("utf-8", "replace")
            try:
                value = json.loads(text)
            except ValueError:
                pass
        problems += self.check_answer(method, template, resp, text, value, expect)
        if keep and not problems:
            self.streams.append(conn)
        else:
            conn.close()
        report(f"{self.label}{method} {url}", resp.status, problems, text)
        return resp.status, value

    def close_streams(self):
        while self.streams:
            self.streams.pop().close()

    def check_request(self, method, template, path, query, body, hdrs, doc_valid):
        """Whether the document accepts the request as it should (doc_valid) or not."""
        op = self.doc.op(method, template)
        if op is None or doc_valid is None:
            return []
        base = ptr("paths", template, method.lower())
        params = {(p["in"], p["name"].lower()): i for i, p in enumerate(op.get("parameters", []))}
        given = [("path", k, v) for k, v in path.items() if "{" + k + "}" in template]
        given += [("query", k, v) for k, v in query.items()]
        given += [("header", k, v) for k, v in hdrs.items() if k not in ("Authorization", "Content-Type")]
        errs = []
        for where, name, value in given:
            i = params.get((where, name.lower()))
            if i is None:
                errs.append(f"{where} parameter {name} is not documented")
            elif e := self.doc.error(base + ptr("parameters", i, "schema"), value):
                errs.append(f"{where} parameter {name}={value!r}: {e}")
        for p in op.get("parameters", []):
            if p.get("required") and p["in"] == "query" and p["name"] not in query:
                errs.append(f"required query parameter {p['name']} is missing")
        rb = op.get("requestBody")
        if rb and body is not None:
            if e := self.doc.error(base + ptr("requestBody", "content", "application/json", "schema"), body):
                errs.append(f"body: {e}")
        elif rb and rb.get("required") and body is None:
            errs.append("the required request body is missing")
        elif not rb and body is not None:
            errs.append("a request body is not documented")
        if doc_valid and errs:
            return ["the document refuses this request, which the relay must accept: " + "; ".join(errs)]
        if doc_valid is False and not errs:
            return ["the document accepts this request, which the relay must refuse"]
        return []

    def check_answer(self, method, template, resp, text, value, expect):
        """The status is documented; the body is of the documented type and schema."""
        op = self.doc.op(method, template)
        if op is None:
            return [f"{method} {template} is not in the document"]
        status = str(resp.status)
        problems = [f"expected status {expect}"] if expect and resp.status != expect else []
        if status not in op["responses"]:
            return problems + [f"status {status} is not documented (documented: {', '.join(op['responses'])})"]
        if 200 <= resp.status < 300:
            COVERED.add((method, template))
        content = op["responses"][status].get("content", {})
        if not content and not text:
            return problems
        ctype = resp.getheader("Content-Type", "").split(";")[0].strip()
        if ctype not in content:
            return problems + [f"Content-Type {ctype!r} is not documented ({', '.join(content) or 'no body'})"]
        if ctype != "application/json":
            return problems
        if value is None and text.strip() != "null":
            return problems + ["the body is not JSON"]
        pointer = ptr("paths", template, method.lower(), "responses", status, "content", ctype, "schema")
        if e := self.doc.error(pointer, value):
            problems.append(f"the body does not match the documented schema: {e}")
        return problems

    @staticmethod
    def check_stream(resp):
        """An SSE answer: its first event is `ready`."""
        event = None
        while event is None:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"event:"):
                event = line[6:].decode().strip()
        return [] if event == "ready" else [f"the first event is {event!r}, not ready"]


def scenario(c):
    """Every operation, meaningfully: successes in an order that gives each something to act
    on, and the errors each can answer."""
    get, post, delete = (functools.partial(c.call, method) for method in ("GET", "POST", "DELETE"))
    BAD = {"expect": 400, "doc_valid": False}  # wrong by the document's own schemas
    REG, CHANS, MSGS = "/api/register", "/api/channels", "/api/channels/{channel}/messages"
    MSG, WAIT = MSGS + "/{message_id}", "/api/channels/{channel}/wait"
    get("/healthz", auth=False)

    # identities: a session per identity, sent as X-Crosstalk-Session to act as it
    _, a = post(REG, {"instance_id": "alice", "description": "asks"}, expect=201)
    _, b = post(REG, {"instance_id": "bob", "kind": "human"}, expect=201)
    sa, sb = (a or {}).get("session"), (b or {}).get("session")
    post(REG, {"instance_id": "alice"}, expect=409)  # live in another session
    for bad in ({}, {"instance_id": 5}, {"instance_id": "carol", "kind": "robot"}):
        post(REG, bad, **BAD)
    post(REG, raw="{not json", expect=400)
    get("/api/instances")
    get("/api/whoami")
    get("/api/unread", query={"instance_id": "bob"}, session=sb)

    # channels
    post(CHANS, {"name": CH, "description": "openapi check"}, expect=201)
    post(CHANS, {"name": "bad!"}, expect=400)
    post(CHANS, {"description": "no name"}, **BAD)
    post(CHANS, raw="[1,", expect=400)
    get(CHANS + "/search", query={"query": "openapi"})
    get(CHANS + "/search", **BAD)

    # messages
    _, m = post(MSGS, {"sender": "alice", "body": "hello openapi"}, session=sa)
    m1 = (m or {}).get("id", 1)
    reply = {"sender": "bob", "body": "re", "reply_to": m1, "type": "response", "recipient": "alice",
             "status": "ok", "side": "left", "session_id": "s-1", "idempotency_key": "k1"}
    post(MSGS, reply, session=sb)
    post(MSGS, reply, session=sb)  # a retry: answers the original
    post(MSGS, {"sender": "alice", "body": "not mine"}, expect=403)  # without alice's session
    for bad in ({"sender": "alice"}, {"sender": "alice", "body": "x", "reply_to": "one"}):
        post(MSGS, bad, session=sa, **BAD)
    post(MSGS, raw='{"sender": "alice", "body": ', session=sa, expect=400)
    post(MSGS, {"sender": "alice", "body": "x"}, path={"channel": "bad!"}, session=sa, expect=400)
    post(MSGS, {"sender": "alice", "body": "x" * (2 << 20)}, session=sa, expect=413)
    get(CHANS)
    get(MSGS, query={"since_id": 0, "limit": 10})
    get(MSGS, query={"since_id": m1, "instance_id": "alice"}, session=sa)
    get(MSGS, path={"channel": "nowhere"})  # an unknown channel reads as empty
    get(MSGS, query={"since_id": "abc"}, **BAD)
    get(MSGS, query={"limit": 0}, expect=400)
    get(MSGS, path={"channel": "bad!"}, expect=400)
    get(MSG, path={"message_id": m1})
    get(MSG, path={"message_id": 999999}, expect=404)
    get(MSG, path={"message_id": "abc"}, **BAD)
    get(MSG, path={"channel": "nowhere", "message_id": m1}, expect=404)
    get(MSG + "/replies", path={"message_id": m1}, query={"limit": 5})
    get(MSG + "/replies", path={"message_id": m1}, query={"limit": "x"}, **BAD)
    get(MSG + "/readers", path={"message_id": m1})
    get(MSG + "/readers", path={"message_id": 999999}, expect=404)
    get(MSG + "/readers", path={"message_id": "abc"}, **BAD)
    get(MSGS, query={"before_id": m1 + 1, "limit": 1})
    get(MSGS, query={"before_id": "abc"}, **BAD)
    get(WAIT, query={"since_id": 0, "timeout_s": 0.2})  # anonymous: a bare list
    get(WAIT, query={"since_id": m1 + 100, "timeout_s": 0.2})
    get(WAIT, query={"since_id": 0, "timeout_s": 0.2, "instance_id": "alice", "role": "parked",
                     "exclude_self": False, "limit": 1}, session=sa)
    get(WAIT, query={"since_id": m1 + 100, "timeout_s": 0.2, "instance_id": "alice"}, session=sa)
    for bad in ({"timeout_s": "soon"}, {"timeout_s": 0.2, "role": "boss"}):
        get(WAIT, query=bad, **BAD)
    get(WAIT, path={"channel": "bad!"}, query={"timeout_s": 0.2}, expect=400)
    get("/api/channels/{channel}/presence", path={"channel": "bad!"}, expect=400)

    # sessions
    S = "/api/channels/{channel}/session"
    get(S, expect=404)  # no_active_session
    for bad in ({"max_turns": 0}, {"max_turns": "ten"}):
        post(S, bad, **BAD)
    post(S)
    post(S, {"max_turns": 10})
    get(S)
    delete(S)
    delete(S)  # nothing to end: status no_active_session
    delete(S, path={"channel": "bad!"}, expect=400)

    # asking a human, answering, directives
    ASK, DIR = "/api/channels/{channel}/ask", "/api/channels/{channel}/directives"
    _, asked = post(ASK, {"question": "ready?", "sender": "alice", "timeout_s": 0.2}, session=sa)
    for bad in ({"sender": "alice", "timeout_s": 0.2}, {"question": "x", "sender": "alice", "timeout_s": "soon"}):
        post(ASK, bad, session=sa, **BAD)
    get(DIR, query={"recipient": "any-human", "since_id": 0})
    get(DIR, query={"since_id": "abc"}, **BAD)
    q = ((asked or {}).get("question") or {}).get("id", m1)
    post(MSGS, {"sender": "bob", "type": "ANSWER", "body": "yes", "reply_to": q}, session=sb)
    get(MSG, path={"message_id": q})
    # An ask that is answered while it blocks.
    body = {"question": "ship it?", "sender": "alice", "recipient": "bob", "timeout_s": 5}
    asking = threading.Thread(target=post, args=(ASK, body), kwargs={"session": sa}, daemon=True)
    asking.start()
    question = None
    for _ in range(50):
        time.sleep(0.1)
        found = c.get_json(f"/api/channels/{CH}/messages?since_id={q}") or []
        question = next((m for m in found if isinstance(m, dict) and m.get("body") == "ship it?"), None)
        if question:
            break
    post(MSGS, {"sender": "bob", "type": "ANSWER", "body": "ship", "reply_to": (question or {}).get("id", q)},
         session=sb)
    asking.join()

    # inbox and search
    get("/api/inbox", query={"instance_id": "bob", "limit": 10}, session=sb)
    get("/api/inbox", expect=400)  # nobody named
    get("/api/inbox", query={"instance_id": "alice"}, expect=403)
    get("/api/inbox", query={"instance_id": "bob", "limit": "x"}, session=sb, **BAD)
    get("/api/search", query={"query": "hello", "channel": CH, "sender": "alice", "type": "message", "limit": 5})
    get("/api/search", **BAD)
    get("/api/search", query={"query": "x", "channel": "bad!"}, expect=400)
    get("/api/search", query={"query": "x", "limit": "many"}, **BAD)
    get("/api/search/hits", query={"query": "hel", "since": "2020-01-01T00:00:00Z", "until": "2999-01-01T00:00:00Z"})
    get("/api/search/hits", query={"query": "hello", "since": "yesterday"}, expect=400)
    get("/api/search/hits", query={"query": "-hello"}, expect=400)

    # shared data
    DATA, KEY = "/api/data", "/api/data/{key}"
    post(DATA, {"key": "spec", "content": "v1", "description": "draft", "owner": "alice"}, session=sa, expect=201)
    post(DATA, {"key": "spec", "content": "v2", "owner": "alice"}, session=sa, expect=201)
    post(DATA, {"key": "spec", "owner": "alice"}, session=sa, **BAD)
    post(DATA, {"key": "spec", "content": "v3"}, expect=400)  # nobody named
    post(DATA, {"key": "spec", "content": "v3", "owner": "alice"}, expect=403)
    post(DATA, {"key": "spec", "content": "v3", "owner": "bob"}, session=sb, expect=403)  # alice's key
    get(DATA)
    get(KEY, path={"key": "spec"})
    get(KEY, path={"key": "spec"}, query={"version": 1})
    get(KEY, path={"key": "spec"}, query={"version": "x"}, **BAD)
    get(KEY, path={"key": "nothing"}, expect=404)
    delete(KEY, path={"key": "spec"}, query={"owner": "alice"}, expect=403)
    delete(KEY, path={"key": "spec"}, expect=400)
    delete(KEY, path={"key": "spec"}, query={"owner": "alice"}, session=sa)
    delete(KEY, path={"key": "nothing"}, query={"owner": "alice"}, session=sa, expect=404)

    # path reservations
    RES, RENEW, ONE = "/api/reservations", "/api/reservations/{id}/renew", "/api/reservations/{id}"
    _, held = post(RES, {"holder": "alice", "paths": ["src/**"], "reason": "refactor", "project": "demo"}, session=sa)
    rid = held["id"]
    post(RES, {"holder": "bob", "paths": ["src/main.rs"], "project": "demo"}, session=sb)  # refused: granted false
    post(RES, {"holder": "alice", "paths": []}, session=sa, expect=400)
    post(RES, {"holder": "alice", "paths": ["../x"]}, session=sa, expect=400)
    post(RES, {"holder": "alice", "paths": "src/**"}, session=sa, **BAD)
    post(RES, {"holder": "alice", "paths": ["x"]}, expect=403)  # alice is bound to another session
    get(RES)
    get(RES, query={"project": "demo", "holder": "alice"})
    post(RENEW, {"holder": "alice", "ttl_s": 600}, path={"id": rid}, session=sa)
    post(RENEW, {"holder": "bob"}, path={"id": rid}, session=sb, expect=403)
    post(RENEW, {"holder": "alice", "ttl_s": 0}, path={"id": rid}, session=sa, expect=400)
    post(RENEW, {"holder": "alice"}, path={"id": "none.nothing"}, session=sa, expect=404)
    delete(ONE, path={"id": rid}, query={"holder": "bob"}, session=sb, expect=403)
    delete(ONE, path={"id": rid}, query={"holder": "alice"}, session=sa)
    delete(ONE, path={"id": rid}, query={"holder": "alice"}, session=sa, expect=404)

    # crosstalk wake's side: a lease, what wakes the identity, a turn's end, the list
    LEASE, PENDING, TURN = "/api/wake/{identity}/lease", "/api/wake/{identity}/pending", "/api/wake/{identity}/turn"
    who, never = {"identity": "woken-1"}, {"identity": "never-woken"}
    lease = {"holder": "h-1", "host": "here", "pid": 1, "ttl_s": 60}
    post(LEASE, lease, path=who)
    post(LEASE, {**lease, "holder": "h-2"}, path=who, expect=409)
    post(LEASE, {**lease, "ttl_s": 0}, path=who, expect=400)
    post(LEASE, {**lease, "pid": "one"}, path=who, **BAD)
    get(PENDING, path=who, query={"holder": "h-1", "timeout_s": 0})
    get(PENDING, path=who, query={"holder": "h-2", "timeout_s": 0}, expect=409)
    get(PENDING, path=never, query={"holder": "h", "timeout_s": 0}, expect=404)
    get(PENDING, path=who, query={"holder": "h-1", "listen": "bad!", "timeout_s": 0}, expect=400)
    post(TURN, {"holder": "h-1", "activity": "listening", "handled": {"general": 1}}, path=who)
    post(TURN, {"holder": "h-1", "activity": "dancing"}, path=who, expect=400)
    get("/api/wake")
    delete(LEASE, path=who, query={"holder": "h-1"})
    delete(LEASE, path=never, query={"holder": "h"}, expect=404)

    # the SSE stream, and presence while carol streams
    get(STREAM)
    get(STREAM, query={"since_id": 0, "participant_id": "carol", "display_name": "Carol", "kind": "human",
                       "side": "left"}, headers={"Last-Event-ID": str(m1)}, keep=True)
    get("/api/channels/{channel}/presence")
    c.close_streams()
    get(STREAM, path={"channel": "bad!"}, expect=400)
    get(STREAM, query={"since_id": "abc"}, **BAD)


def auth_checks(c):
    """With a token, everything but /healthz is 401 without it, the document included."""
    c.call("GET", "/healthz", auth=False)
    c.call("GET", "/openapi.json", auth=False, expect=401)
    c.call("GET", "/openapi.json", auth="wrong", expect=401)
    c.call("GET", "/openapi.json")
    c.call("GET", "/metrics", auth=False, expect=401)
    c.call("GET", "/metrics")
    c.call("GET", "/api/channels", auth=False, expect=401)
    c.call("POST", "/api/channels/{channel}/messages", {"sender": "x", "body": "x"}, auth="wrong", expect=401)
    c.call("GET", "/api/data/{key}", path={"key": "k"}, auth=False, expect=401)
    c.call("GET", STREAM, auth=False, expect=401)
    c.call("GET", STREAM, auth=False, query={"token": TOKEN})


def cc_scenario(c, doc):
    """A ChatGPT-style client of the cross-claude face that knows only /cc/openapi.json: it
    finds each action by its operationId, as a Custom GPT does, and calls it."""
    ops = {op["operationId"]: (m.upper(), p) for p, item in doc.doc["paths"].items() for m, op in item.items()}

    def act(op_id, body=None, **kw):
        method, template = ops[op_id]
        return c.call(method, template, body, **kw)

    BAD = {"expect": 400, "doc_valid": False}
    c.call("GET", "/cc/health", auth=False)
    act("register", {"instance_id": "gpt-1", "description": "a custom GPT"})
    act("register", {}, **BAD)
    act("listInstances")
    act("createChannel", {"name": "cc-oa", "description": "cross-claude check"})
    act("listChannels")
    act("findChannel", query={"q": "cross-claude"})
    act("findChannel", **BAD)
    _, sent = act("sendMessage", {"channel": "cc-oa", "sender": "gpt-1", "content": "hello", "message_type": "request"})
    first = (sent or {}).get("id", 1)
    act("sendMessage", {"channel": "cc-oa", "sender": "gpt-1", "content": "re", "message_type": "response",
                        "in_reply_to": first})
    act("sendMessage", {"sender": "gpt-1"}, **BAD)
    act("sendMessage", {"sender": "gpt-1", "content": "x", "in_reply_to": "one"}, **BAD)
    act("getMessages", path={"channel": "cc-oa"}, query={"limit": 1})
    act("getMessages", path={"channel": "cc-oa"}, query={"after_id": 0, "instance_id": "gpt-1"})
    act("getMessages", path={"channel": "cc-oa"}, query={"after_id": "x"}, **BAD)
    act("getReplies", path={"channel": "cc-oa", "message_id": first})
    act("getReplies", path={"channel": "cc-oa", "message_id": 999999}, expect=404)
    act("searchMessages", query={"q": "hello", "limit": 5})
    act("shareData", {"key": "plan", "content": "the plan", "owner": "gpt-1"})
    act("listSharedData")
    act("getSharedData", path={"key": "plan"})
    act("getSharedData", path={"key": "nothing"}, expect=404)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/debug/crosstalk"

    def on_alarm(*_):
        raise TimeoutError(f"the check took longer than {BUDGET_S} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    signal.alarm(BUDGET_S)
    # The last resort, should the alarm never get through.
    hard = threading.Timer(BUDGET_S + 4, lambda: (kill_relays(), os._exit(3)))
    hard.daemon = True
    hard.start()
    try:
        netloc = start_relay(binary)
        raw = Client(None, netloc).get_json("/openapi.json")
        try:
            openapi_spec_validator.validate(raw, cls=openapi_spec_validator.OpenAPIV31SpecValidator)
            report("the document is valid OpenAPI 3.1", "-", [])
        except Exception as e:  # noqa: BLE001 - whatever the validator raises is the finding
            report("the document is valid OpenAPI 3.1", "-", [str(e).splitlines()[0]])
        doc = Doc(raw)
        plain = Client(doc, netloc, label="[no token] ")
        plain.call("GET", "/openapi.json")
        scenario(plain)
        kill_relays()

        netloc = start_relay(binary, TOKEN)
        guarded = Client(doc, netloc, token=TOKEN, label="[token] ")
        same = guarded.get_json("/openapi.json") == raw
        report("[token] the document is the same", "-", [] if same else ["it differs"])
        auth_checks(guarded)
        scenario(guarded)

        cc_raw = guarded.get_json("/cc/openapi.json")
        try:
            openapi_spec_validator.validate(cc_raw, cls=openapi_spec_validator.OpenAPIV31SpecValidator)
            report("/cc/openapi.json is valid OpenAPI 3.1", "-", [])
        except Exception as e:  # noqa: BLE001 - whatever the validator raises is the finding
            report("/cc/openapi.json is valid OpenAPI 3.1", "-", [str(e).splitlines()[0]])
        cc_scenario(Client(Doc(cc_raw), netloc, token=TOKEN, label="[cc] "), Doc(cc_raw))

        for name, document in (("/openapi.json", raw), ("/cc/openapi.json", cc_raw)):
            missing = [f"{m.upper()} {p}" for p, item in document["paths"].items() for m in item
                       if (m.upper(), p) not in COVERED]
            report(f"{name}: every operation answered 2xx at least once", "-",
                   [f"not covered: {', '.join(missing)}"] if missing else [])
    except Exception as e:  # noqa: BLE001 - the watchdog, a dead relay, ...: a failure, reported
        report("the check stopped", "-", [f"{type(e).__name__}: {e}"])
    finally:
        signal.alarm(0)
        kill_relays()
    print(f"openapi: {RESULTS['passed']} passed, {RESULTS['failed']} failed")
    sys.exit(1 if RESULTS["failed"] else 0)


if __name__ == "__main__":
    main()
