"""Checks the relay's /openapi.json against a real relay.

Usage: check.py [RELAY_BINARY]   (default target/debug/crosstalk; run by scripts/openapi-check)

Starts the relay twice (no token, then --token s3cret), validates the document as OpenAPI 3.1,
then drives every documented operation through a scripted sequence of successes and errors.
Every answer's status must be documented for its operation and its JSON body must validate
against the documented schema; a successful request must itself be valid per the document
(its query, path, header parameters and body), and a request that is wrong by the document's
own schemas (missing field, wrong type) must be refused by it. Every operation must get at
least one 2xx. Prints one line per request and `openapi: N passed, M failed`.
"""

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
RELAYS = []  # the relay processes, killed on every exit path
RESULTS = {"passed": 0, "failed": 0}
COVERED = set()  # (method, path template) answered with a 2xx


class Watchdog(Exception):
    pass


def kill_relays():
    for proc, data_dir in RELAYS:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
    RELAYS.clear()


def start_relay(binary, token=None):
    data_dir = tempfile.mkdtemp(prefix="crosstalk-openapi-")
    args = [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", data_dir]
    if token:
        args += ["--token", token]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RUST_LOG": "warn"})
    RELAYS.append((proc, data_dir))
    log = []
    for line in proc.stdout:
        log.append(line)
        if line.startswith("crosstalk listening on "):
            base = line.split()[-1]
            # Keep draining the pipe so the relay never blocks on a full one.
            threading.Thread(target=lambda: [log.append(x) for x in proc.stdout], daemon=True).start()
            return urllib.parse.urlsplit(base).netloc
    raise RuntimeError("the relay did not say where it listens:\n" + "".join(log))


class Doc:
    """The document, with a validator for any schema in it by JSON pointer."""

    def __init__(self, doc):
        self.doc = doc
        dialect = doc.get("jsonSchemaDialect")
        if dialect != "https://json-schema.org/draft/2020-12/schema":
            raise AssertionError(f"jsonSchemaDialect is {dialect!r}, not JSON Schema 2020-12")
        self.cls = jsonschema.validators.validator_for({"$schema": dialect})
        resource = Resource.from_contents(doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource(BASE_URI, resource)
        self.cache = {}

    def op(self, method, template):
        return self.doc["paths"].get(template, {}).get(method.lower())

    def errors(self, pointer, instance):
        """The first validation error of instance against the schema at pointer, or None."""
        if pointer not in self.cache:
            self.cache[pointer] = self.cls({"$ref": f"{BASE_URI}#{pointer}"}, registry=self.registry)
        err = jsonschema.exceptions.best_match(self.cache[pointer].iter_errors(instance))
        return None if err is None else f"{err.json_path}: {err.message}"


def ptr(*parts):
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def qstr(v):
    return json.dumps(v) if isinstance(v, bool) else str(v)


class Client:
    def __init__(self, doc, netloc, token=None, label=""):
        self.doc, self.netloc, self.token, self.label = doc, netloc, token, label

    def request(self, method, url, body=None, headers=None, timeout=10):
        conn = http.client.HTTPConnection(self.netloc, timeout=timeout)
        conn.request(method, url, body=body, headers=headers or {})
        return conn, conn.getresponse()

    def headers(self, auth, session, extra):
        h = {}
        if auth is True and self.token:
            h["Authorization"] = f"Bearer {self.token}"
        elif isinstance(auth, str):
            h["Authorization"] = f"Bearer {auth}"
        if session:
            h["X-Crosstalk-Session"] = session
        return {**h, **(extra or {})}

    def call(self, method, template, path=None, query=None, body=None, raw=None, session=None,
             headers=None, auth=True, expect=200, doc_valid=None):
        """One request, checked against the document. `body` is JSON; `raw` is sent as is.
        doc_valid: whether the document's own schemas accept the request (default: exactly
        when a 2xx is expected; None: not checked)."""
        path = {"channel": CH, **(path or {})}
        url = template.format(**{k: urllib.parse.quote(str(v), safe="") for k, v in path.items()})
        if query:
            url += "?" + urllib.parse.urlencode({k: qstr(v) for k, v in query.items()})
        hdrs = self.headers(auth, session, headers)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        conn, resp = self.request(method, url, data, hdrs)
        text = resp.read().decode("utf-8", "replace")
        conn.close()
        value = None
        try:
            value = json.loads(text)
        except ValueError:
            pass
        if doc_valid is None and expect is not None and 200 <= expect < 300:
            doc_valid = True
        problems = self.check_request(method, template, path, query, body, hdrs, doc_valid)
        problems += self.check_answer(method, template, resp, text, value, expect)
        report(f"{self.label}{method} {url}", resp.status, problems, text)
        return resp.status, value

    def check_request(self, method, template, path, query, body, hdrs, doc_valid):
        op = self.doc.op(method, template)
        if op is None or doc_valid is None:
            return []
        base = ptr("paths", template, method.lower())
        params = {(p["in"], p["name"].lower()): i for i, p in enumerate(op.get("parameters", []))}
        errs = []  # (what, whether the document is wrong for a valid request)
        given = [("path", k, v) for k, v in path.items() if "{" + k + "}" in template]
        given += [("query", k, v) for k, v in (query or {}).items()]
        given += [("header", k, v) for k, v in hdrs.items() if k not in ("Authorization", "Content-Type")]
        for where, name, value in given:
            i = params.get((where, name.lower()))
            if i is None:
                errs.append(f"{where} parameter {name} is not documented")
            elif e := self.doc.errors(base + ptr("parameters", i, "schema"), value):
                errs.append(f"{where} parameter {name}={value!r}: {e}")
        for p in op.get("parameters", []):
            if p.get("required") and p["in"] == "query" and p["name"] not in (query or {}):
                errs.append(f"required query parameter {p['name']} is missing")
        rb = op.get("requestBody")
        if rb and body is not None:
            if e := self.doc.errors(base + ptr("requestBody", "content", "application/json", "schema"), body):
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
        op = self.doc.op(method, template)
        status = str(resp.status)
        if op is None:
            return [f"{method} {template} is not in the document"]
        problems = []
        if expect is not None and resp.status != expect:
            problems.append(f"expected status {expect}")
        if status not in op["responses"]:
            problems.append(f"status {status} is not documented (documented: {', '.join(op['responses'])})")
            return problems
        if 200 <= resp.status < 300:
            COVERED.add((method, template))
        content = op["responses"][status].get("content", {})
        if "application/json" not in content:
            return problems + ([f"undocumented body: {text[:100]!r}"] if text else [])
        ctype = resp.getheader("Content-Type", "")
        if not ctype.startswith("application/json"):
            problems.append(f"Content-Type is {ctype!r}, documented application/json")
        if value is None and text.strip() != "null":
            problems.append("the body is not JSON")
        else:
            pointer = ptr("paths", template, method.lower(), "responses", status, "content",
                          "application/json", "schema")
            if e := self.doc.errors(pointer, value):
                problems.append(f"body does not match the documented schema: {e}")
        return problems

    def stream(self, path=None, query=None, headers=None, auth=True, expect=200, keep=False):
        """The SSE route: a 200 is text/event-stream whose first event is `ready`. keep: the
        stream stays open, its connection returned for the caller to close."""
        if expect != 200:
            return self.call("GET", STREAM, path=path, query=query, headers=headers, auth=auth, expect=expect)
        url = STREAM.format(channel=urllib.parse.quote((path or {}).get("channel", CH), safe=""))
        query = dict(query or {})
        if auth is True and self.token and "token" not in query:
            headers = {**(headers or {}), "Authorization": f"Bearer {self.token}"}
        if query:
            url += "?" + urllib.parse.urlencode({k: qstr(v) for k, v in query.items()})
        problems = self.check_request("GET", STREAM, {"channel": CH}, {k: v for k, v in query.items() if k != "token"},
                                      None, headers or {}, True)
        conn, resp = self.request("GET", url, headers=headers, timeout=5)
        ok = False
        try:
            ctype = resp.getheader("Content-Type", "")
            if resp.status != 200:
                problems.append(f"expected status 200; body {resp.read(300)!r}")
            elif not ctype.startswith("text/event-stream"):
                problems.append(f"Content-Type is {ctype!r}, documented text/event-stream")
            else:
                COVERED.add(("GET", STREAM))
                event = None
                while event is None:
                    line = resp.readline()
                    if not line:
                        break
                    if line.startswith(b"event:"):
                        event = line[6:].decode().strip()
                if event != "ready":
                    problems.append(f"the first event is {event!r}, not ready")
                ok = not problems
        finally:
            if not (keep and ok):
                conn.close()
        report(f"{self.label}GET {url}", resp.status, problems, "")
        return conn if keep and ok else None


def report(what, status, problems, text):
    if problems:
        RESULTS["failed"] += 1
        print(f"FAIL {what} -> {status}: {' | '.join(problems)}\n       body: {text[:400]}")
    else:
        RESULTS["passed"] += 1
        print(f"ok   {what} -> {status}")
    sys.stdout.flush()


def scenario(c):
    """Every operation, meaningfully: successes in an order that gives each something to do,
    and the errors each can answer."""
    GET, POST, DELETE = "GET", "POST", "DELETE"
    MSGS, MSG = "/api/channels/{channel}/messages", "/api/channels/{channel}/messages/{message_id}"
    c.call(GET, "/healthz", auth=False)

    # identities
    _, a = c.call(POST, "/api/register", body={"instance_id": "alice", "description": "asks"}, expect=201)
    _, b = c.call(POST, "/api/register", body={"instance_id": "bob", "kind": "human"}, expect=201)
    sa, sb = (a or {}).get("session"), (b or {}).get("session")
    c.call(POST, "/api/register", body={"instance_id": "alice"}, expect=409)
    c.call(POST, "/api/register", body={}, expect=400, doc_valid=False)
    c.call(POST, "/api/register", body={"instance_id": 5}, expect=400, doc_valid=False)
    c.call(POST, "/api/register", body={"instance_id": "carol", "kind": "robot"}, expect=400, doc_valid=False)
    c.call(POST, "/api/register", raw="{not json", expect=400)
    c.call(GET, "/api/instances")

    # channels
    c.call(POST, "/api/channels", body={"name": CH, "description": "openapi check"}, expect=201)
    c.call(POST, "/api/channels", body={"name": "bad!"}, expect=400)
    c.call(POST, "/api/channels", body={"description": "no name"}, expect=400, doc_valid=False)
    c.call(POST, "/api/channels", raw="[1,", expect=400)
    c.call(GET, "/api/channels/search", query={"query": "openapi"})
    c.call(GET, "/api/channels/search", expect=400, doc_valid=False)

    # messages
    _, m1 = c.call(POST, MSGS, body={"sender": "alice", "body": "hello openapi"}, session=sa)
    m1 = (m1 or {}).get("id", 1)
    reply = {"sender": "bob", "body": "re", "reply_to": m1, "type": "response", "recipient": "alice",
             "status": "ok", "side": "left", "session_id": "s-1", "idempotency_key": "k1"}
    c.call(POST, MSGS, body=reply, session=sb)
    c.call(POST, MSGS, body=reply, session=sb)  # a retry: the original
    c.call(POST, MSGS, body={"sender": "alice", "body": "not mine"}, expect=403)
    c.call(POST, MSGS, body={"sender": "alice"}, session=sa, expect=400, doc_valid=False)
    c.call(POST, MSGS, body={"sender": "alice", "body": "x", "reply_to": "one"}, session=sa, expect=400,
           doc_valid=False)
    c.call(POST, MSGS, raw='{"sender": "alice", "body": ', session=sa, expect=400)
    c.call(POST, MSGS, path={"channel": "bad!"}, body={"sender": "alice", "body": "x"}, session=sa, expect=400)
    c.call(POST, MSGS, body={"sender": "alice", "body": "x" * (2 << 20)}, session=sa, expect=413)
    c.call(GET, "/api/channels", expect=200)
    c.call(GET, MSGS, query={"since_id": 0, "limit": 10})
    c.call(GET, MSGS, query={"since_id": m1, "instance_id": "alice"}, session=sa)
    c.call(GET, MSGS, path={"channel": "nowhere"})
    c.call(GET, MSGS, query={"since_id": "abc"}, expect=400, doc_valid=False)
    c.call(GET, MSGS, query={"limit": 0}, expect=400)
    c.call(GET, MSGS, path={"channel": "bad!"}, expect=400)
    c.call(GET, MSG, path={"message_id": m1})
    c.call(GET, MSG, path={"message_id": 999999}, expect=404)
    c.call(GET, MSG, path={"message_id": "abc"}, expect=400, doc_valid=False)
    c.call(GET, MSG, path={"channel": "nowhere", "message_id": m1}, expect=404)
    c.call(GET, MSG + "/replies", path={"message_id": m1}, query={"limit": 5})
    c.call(GET, MSG + "/replies", path={"message_id": m1}, query={"limit": "x"}, expect=400, doc_valid=False)
    W = "/api/channels/{channel}/wait"
    c.call(GET, W, query={"since_id": 0, "timeout_s": 0.2})
    c.call(GET, W, query={"since_id": m1 + 100, "timeout_s": 0.2})
    c.call(GET, W, query={"since_id": 0, "timeout_s": 0.2, "instance_id": "alice", "role": "parked",
                          "exclude_self": False, "limit": 1}, session=sa)
    c.call(GET, W, query={"since_id": m1 + 100, "timeout_s": 0.2, "instance_id": "alice"}, session=sa)
    c.call(GET, W, query={"timeout_s": "soon"}, expect=400, doc_valid=False)
    c.call(GET, W, query={"timeout_s": 0.2, "role": "boss"}, expect=400, doc_valid=False)
    c.call(GET, W, path={"channel": "bad!"}, query={"timeout_s": 0.2}, expect=400)
    c.call(GET, "/api/channels/{channel}/presence", path={"channel": "bad!"}, expect=400)

    # sessions
    S = "/api/channels/{channel}/session"
    c.call(GET, S, expect=404)
    c.call(POST, S, body={"max_turns": 0}, expect=400, doc_valid=False)
    c.call(POST, S, body={"max_turns": "ten"}, expect=400, doc_valid=False)
    c.call(POST, S)
    c.call(POST, S, body={"max_turns": 10})
    c.call(GET, S)
    c.call(DELETE, S)
    c.call(DELETE, S)
    c.call(DELETE, S, path={"channel": "bad!"}, expect=400)

    # asking a human, answers and directives
    A, D = "/api/channels/{channel}/ask", "/api/channels/{channel}/directives"
    _, asked = c.call(POST, A, body={"question": "ready?", "sender": "alice", "timeout_s": 0.2}, session=sa)
    c.call(POST, A, body={"sender": "alice", "timeout_s": 0.2}, session=sa, expect=400, doc_valid=False)
    c.call(POST, A, body={"question": "x", "sender": "alice", "timeout_s": "soon"}, session=sa, expect=400,
           doc_valid=False)
    c.call(GET, D, query={"recipient": "any-human", "since_id": 0})
    c.call(GET, D, query={"since_id": "abc"}, expect=400, doc_valid=False)
    q = ((asked or {}).get("question") or {}).get("id", m1)
    c.call(POST, MSGS, body={"sender": "bob", "type": "ANSWER", "body": "yes", "reply_to": q}, session=sb)
    c.call(GET, MSG, path={"message_id": q})
    # An answered ask: answer it while it blocks.
    waiter = threading.Thread(target=c.call, args=(POST, A), kwargs=dict(
        body={"question": "ship it?", "sender": "alice", "recipient": "bob", "timeout_s": 5}, session=sa))
    waiter.start()
    question = None
    for _ in range(50):
        time.sleep(0.1)
        _, found = c.request_json(f"/api/channels/{CH}/messages?since_id={q}")
        question = next((m for m in found or [] if m.get("body") == "ship it?"), None)
        if question:
            break
    c.call(POST, MSGS, body={"sender": "bob", "type": "ANSWER", "body": "ship", "reply_to": (question or {}).get("id", q)},
           session=sb)
    waiter.join()

    # inbox and search
    c.call(GET, "/api/inbox", query={"instance_id": "bob", "limit": 10}, session=sb)
    c.call(GET, "/api/inbox", expect=400)
    c.call(GET, "/api/inbox", query={"instance_id": "alice"}, expect=403)
    c.call(GET, "/api/inbox", query={"instance_id": "bob", "limit": "x"}, session=sb, expect=400, doc_valid=False)
    c.call(GET, "/api/search", query={"query": "hello", "channel": CH, "sender": "alice", "type": "message", "limit": 5})
    c.call(GET, "/api/search", expect=400, doc_valid=False)
    c.call(GET, "/api/search", query={"query": "x", "channel": "bad!"}, expect=400)
    c.call(GET, "/api/search", query={"query": "x", "limit": "many"}, expect=400, doc_valid=False)

    # shared data
    K = "/api/data/{key}"
    c.call(POST, "/api/data", body={"key": "spec", "content": "v1", "description": "draft", "owner": "alice"},
           session=sa, expect=201)
    c.call(POST, "/api/data", body={"key": "spec", "content": "v2", "owner": "alice"}, session=sa, expect=201)
    c.call(POST, "/api/data", body={"key": "spec", "owner": "alice"}, session=sa, expect=400, doc_valid=False)
    c.call(POST, "/api/data", body={"key": "spec", "content": "v3"}, expect=400)
    c.call(POST, "/api/data", body={"key": "spec", "content": "v3", "owner": "alice"}, expect=403)
    c.call(POST, "/api/data", body={"key": "spec", "content": "v3", "owner": "bob"}, session=sb, expect=403)
    c.call(GET, "/api/data")
    c.call(GET, K, path={"key": "spec"})
    c.call(GET, K, path={"key": "spec"}, query={"version": 1})
    c.call(GET, K, path={"key": "spec"}, query={"version": "x"}, expect=400, doc_valid=False)
    c.call(GET, K, path={"key": "nothing"}, expect=404)
    c.call(DELETE, K, path={"key": "spec"}, query={"owner": "alice"}, expect=403)
    c.call(DELETE, K, path={"key": "spec"}, expect=400)
    c.call(DELETE, K, path={"key": "spec"}, query={"owner": "alice"}, session=sa)
    c.call(DELETE, K, path={"key": "nothing"}, query={"owner": "alice"}, session=sa, expect=404)

    # the SSE stream
    c.stream()
    # Presence while carol streams.
    carol = c.stream(query={"since_id": 0, "participant_id": "carol", "display_name": "Carol", "kind": "human",
                            "side": "left"}, headers={"Last-Event-ID": str(m1)}, keep=True)
    c.call(GET, "/api/channels/{channel}/presence")
    if carol:
        carol.close()
    c.stream(path={"channel": "bad!"}, expect=400)
    c.stream(query={"since_id": "abc"}, expect=400, headers=None)


def request_json(self, url):
    h = {"Authorization": f"Bearer {self.token}"} if self.token else {}
    conn, resp = self.request("GET", url, headers=h)
    try:
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


Client.request_json = request_json


def auth_checks(c):
    """With a token: everything but /healthz is 401 without it, the document included."""
    c.call("GET", "/healthz", auth=False)
    c.call("GET", "/openapi.json", auth=False, expect=401)
    c.call("GET", "/openapi.json", auth="wrong", expect=401)
    c.call("GET", "/openapi.json")
    c.call("GET", "/api/channels", auth=False, expect=401)
    c.call("POST", "/api/channels/{channel}/messages", body={"sender": "x", "body": "x"}, auth="wrong", expect=401)
    c.call("GET", "/api/data/{key}", path={"key": "k"}, auth=False, expect=401)
    c.stream(auth=False, expect=401)
    c.stream(auth=False, query={"token": TOKEN})


def fetch_doc(netloc, token=None):
    conn = http.client.HTTPConnection(netloc, timeout=10)
    conn.request("GET", "/openapi.json", headers={"Authorization": f"Bearer {token}"} if token else {})
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    conn.close()
    return doc


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/debug/crosstalk"

    def on_alarm(*_):
        raise Watchdog(f"the check took longer than {BUDGET_S} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    signal.alarm(BUDGET_S)
    # A last resort should the alarm not get through (it cannot interrupt C code forever).
    hard = threading.Timer(BUDGET_S + 4, lambda: (kill_relays(), os._exit(3)))
    hard.daemon = True
    hard.start()
    try:
        netloc = start_relay(binary)
        raw = fetch_doc(netloc)
        try:
            openapi_spec_validator.validate(raw, cls=openapi_spec_validator.OpenAPIV31SpecValidator)
            report("the document is valid OpenAPI 3.1", "-", [], "")
        except Exception as e:  # noqa: BLE001 - any validation failure is the finding
            report("the document is valid OpenAPI 3.1", "-", [str(e).splitlines()[0]], "")
        doc = Doc(raw)
        plain = Client(doc, netloc, label="[no token] ")
        plain.call("GET", "/openapi.json")
        scenario(plain)
        kill_relays()

        netloc = start_relay(binary, TOKEN)
        guarded = Client(doc, netloc, token=TOKEN, label="[token] ")
        same = fetch_doc(netloc, TOKEN) == raw
        report("[token] the document is the same", "-", [] if same else ["it differs"], "")
        auth_checks(guarded)
        scenario(guarded)

        missing = [f"{m.upper()} {p}" for p, item in raw["paths"].items() for m in item
                   if (m.upper(), p) not in COVERED]
        report("every operation answered 2xx at least once", "-",
               [f"not covered: {', '.join(missing)}"] if missing else [], "")
    except Watchdog as e:
        report("watchdog", "-", [str(e)], "")
    finally:
        signal.alarm(0)
        kill_relays()
    print(f"openapi: {RESULTS['passed']} passed, {RESULTS['failed']} failed")
    sys.exit(1 if RESULTS["failed"] else 0)


if __name__ == "__main__":
    main()
