"""A store written by an earlier release, opened by this one: every face must show what it
showed before, and ids must continue.

  store.py make  --crosstalk OLD_BINARY --out tests/fixtures/upgrade/RELEASE [--commit C] [--nats]
  store.py check --crosstalk NEW_BINARY --fixture tests/fixtures/upgrade/RELEASE

`make` (run once per release whose store is kept) starts OLD_BINARY on a fresh data
directory, gives it every kind of user state over its faces (messages with replies, a
DIRECTIVE, a QUESTION and a person's ANSWER, a channel description, registrations, a
crosstalk-mcp session, shared data in two versions, read cursors, a reservation, a webhook,
an OAuth client with its grant, an MCP task), records what each face answers (`expected.json`)
and keeps the data directory as `store.tar.gz`.

With `--nats` the relay is a node of a nats-server of its own (JetStream, one replica), and the
server's JetStream store is kept beside the node's data directory: the stream and every
bucket. `check` sees which it is.

`check` unpacks the store into a temporary directory, starts NEW_BINARY on it with the same
settings and asks the same questions: every answer must equal the recorded one, but for the
fields that change with time alone (`VOLATILE`); a field the new binary adds is no
difference. Then a post must take the next id, and the
kept OAuth grant and task must still be found. Exits 1 with every difference.

Only loopback is used; the webhook points at a port nothing listens on.
"""

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

ADMIN = "upgrade-admin"
TOKENS = {"coder": "coder-tok", "reviewer": "reviewer-tok", "pat": "pat-tok"}
FLAGS = [
    "--token", ADMIN,
    "--participants", ",".join(f"{k}:{v}" for k, v in TOKENS.items()),
    "--humans", "pat",
    "--oauth",
    "--webhooks-allow-private",
]
REDIRECT = "http://127.0.0.1:9/cb"
# Fields whose value follows the clock, not the store: presence and liveness (who is on a
# channel: a cluster keeps it in a bucket until its TTL, a relay alone in memory), countdowns,
# and a failing webhook's retry state (it keeps retrying while the relay runs).
VOLATILE = {
    "participants", "last_seen", "last_seen_at", "status_since", "online", "activity", "expires_in_s",
    "attempts", "failing_since", "next_attempt_at", "last_error", "presence", "updated_ms",
    "poll_interval", "pollInterval", "lastUpdatedAt", "statusMessage",
}


class Nats:
    """One nats-server with JetStream, its store in `work/js`, on a free loopback port."""

    def __init__(self, work):
        server = os.environ.get("NATS_SERVER") or os.path.join(
            os.path.dirname(__file__), "../../.venv-test/nats/bin/nats-server"
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = os.path.join(work, "nats.conf")
        with open(conf, "w") as f:
            # The same server name on every run: JetStream's store is the server's.
            f.write(
                f"server_name: upgrade\nlisten: 127.0.0.1:{self.port}\n"
                f'jetstream {{\n  store_dir: "{os.path.join(work, "js")}"\n  sync_interval: always\n}}\n'
            )
        self.proc = subprocess.Popen([server, "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit(f"nats-server ({server}) did not start") from None
                time.sleep(0.1)
        self.url = f"nats://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)


class Relay:
    def __init__(self, binary, data, store=None):
        self.log = open(os.path.join(os.path.dirname(data), "relay.log"), "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CROSSTALK_", "RELAY_"))}
        env["RUST_LOG"] = "warn"
        cluster = ["--store", store, "--nats-replicas", "1"] if store else []
        self.proc = subprocess.Popen(
            [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", data, *FLAGS, *cluster],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )
        deadline = time.monotonic() + 30
        self.base = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("crosstalk listening on "):
                self.base = line.split()[-1]
                break
            if not line and self.proc.poll() is not None:
                break
        if not self.base:
            raise SystemExit(f"the relay did not start: {open(self.log.name).read()[-2000:]}")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)
        self.log.close()

    def call(self, method, path, body=None, token=ADMIN, headers=None, form=False):
        data = None
        h = {"Authorization": f"Bearer {token}"} if token else {}
        if token in TOKENS.values():
            # Each identity's REST calls are one session, which its registration is bound to.
            h["X-Crosstalk-Session"] = f"{token}-session"
        if body is not None:
            if form:
                data = urllib.parse.urlencode(body).encode()
                h["Content-Type"] = "application/x-www-form-urlencoded"
            else:
                data = json.dumps(body).encode()
                h["Content-Type"] = "application/json"
        h.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(req, timeout=30) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def json(self, method, path, body=None, token=ADMIN, want=(200, 201)):
        status, _, text = self.call(method, path, body, token)
        if status not in want:
            raise SystemExit(f"{method} {path}: {status} {text[:500]}")
        return json.loads(text) if text else None

    def mcp(self, path, token, calls):
        """A 2025-11-25 session on `path`: each (method, params)'s result, in order."""
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "upgrade", "version": "0"}}}
        accept = {"Accept": "application/json, text/event-stream"}
        status, headers, text = self.call("POST", path, init, token, accept)
        session = {k.lower(): v for k, v in headers.items()}.get("mcp-session-id")
        if status != 200 or not session:
            raise SystemExit(f"initialize on {path}: {status} {text[:300]}")
        h = {**accept, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        self.call("POST", path, {"jsonrpc": "2.0", "method": "notifications/initialized"}, token, h)
        out = []
        for n, (method, params) in enumerate(calls, 1):
            status, _, text = self.call("POST", path, {"jsonrpc": "2.0", "id": n, "method": method, "params": params}, token, h)
            out.append(rpc_result(text, f"{method} on {path}: {status}"))
        self.call("DELETE", path, None, token, h)
        return out


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def rpc_result(text, what):
    for line in text.splitlines():
        if line.startswith("data:"):
            text = line[5:].strip()
    try:
        v = json.loads(text)
    except ValueError:
        raise SystemExit(f"{what}: not JSON-RPC: {text[:300]}") from None
    if "error" in v:
        return {"error": v["error"]}
    return v["result"]


# An identity's liveness, which its silence changes.
LIVENESS = {"online", "offline", "away", "idle"}


def scrub(v):
    if isinstance(v, dict):
        return {
            k: scrub(x) for k, x in v.items() if k not in VOLATILE and not (k == "status" and x in LIVENESS)
        }
    if isinstance(v, list):
        return [scrub(x) for x in v]
    if isinstance(v, str) and v.startswith(("{", "[")):
        # A tool's text answer: JSON inside a string.
        try:
            return {"json": scrub(json.loads(v))}
        except ValueError:
            return v
    return v


def populate(r):
    """Every kind of user state, through the faces a user reaches it by."""
    for who, desc in (("coder", "writes the code"), ("reviewer", "reviews it"), ("pat", "the person")):
        kind = "human" if who == "pat" else "agent"
        r.json("POST", "/api/register", {"instance_id": who, "description": desc, "kind": kind}, TOKENS[who])
    r.json("POST", "/api/channels", {"name": "dev", "description": "the build channel"})
    r.json("POST", "/api/channels", {"name": "ops", "description": "deploys"})
    post = lambda who, body, **kw: r.json("POST", "/api/channels/dev/messages", {"body": body, **kw}, TOKENS[who])
    first = post("coder", "build green", type="status")
    post("reviewer", "looks good", reply_to=first["id"])
    directive = post("coder", "please review src/lib.rs", type="DIRECTIVE", recipient="reviewer")
    question = post("coder", "ship it?", type="QUESTION", recipient="pat")
    post("pat", "yes, ship it", type="ANSWER", reply_to=question["id"])
    post("coder", "an open question for the reviewer", type="QUESTION", recipient="reviewer")
    r.json("POST", "/api/channels/ops/session", {"max_turns": 10}, TOKENS["coder"])
    r.json("POST", "/api/channels/ops/messages", {"body": "deploy 1 started"}, TOKENS["coder"])
    r.json("POST", "/api/channels/ops/messages", {"body": "deploy 1 watched"}, TOKENS["reviewer"])
    for content in ("step 1", "step 1, step 2"):
        r.json("POST", "/api/data", {"key": "plan", "content": content, "description": "the plan"}, TOKENS["coder"])
    # Read cursors: the reviewer reads dev up to the directive.
    r.json("GET", "/api/channels/dev/messages?since_id=0&limit=3&instance_id=reviewer", token=TOKENS["reviewer"])
    r.json("POST", "/api/reservations", {
        "paths": ["src/**"], "exclusive": True, "reason": "refactor", "project": "crosstalk", "ttl_s": 7 * 86400,
    }, TOKENS["coder"])
    r.json("POST", "/api/webhooks", {"channel": "dev", "url": "http://127.0.0.1:9/hook", "types": ["QUESTION"]})
    # An OAuth client, consented with an invite bound to the reviewer.
    client = r.json("POST", "/oauth/register", {"client_name": "Upgrade Host", "redirect_uris": [REDIRECT]}, token=None)
    invite = r.json("POST", "/api/oauth/invites", {"as": "reviewer", "note": "kept across the upgrade"})
    verifier = "v" * 43
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    status, headers, text = r.call("POST", "/oauth/authorize", {
        "response_type": "code", "client_id": client["client_id"], "redirect_uri": REDIRECT,
        "code_challenge": challenge, "code_challenge_method": "S256", "invite_code": invite["code"],
    }, token=None, headers={"Origin": r.base}, form=True)
    location = {k.lower(): v for k, v in headers.items()}.get("location", "")
    code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query)).get("code")
    if status != 303 or not code:
        raise SystemExit(f"consent: {status} {text[:300]}")
    status, _, text = r.call("POST", "/oauth/token", {
        "grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
        "code_verifier": verifier, "client_id": client["client_id"],
    }, token=None, form=True)
    if status != 200:
        raise SystemExit(f"token: {status} {text[:300]}")
    # An MCP task (2025-11-25 tasks): a wait that ends at once, kept for a week.
    task = r.mcp("/mcp", TOKENS["coder"], [("tools/call", {
        "name": "wait_for_message", "arguments": {"channel": "dev", "since_id": 0, "timeout_s": 1},
        "task": {"ttl": 7 * 86400 * 1000},
    })])[0]
    task_id = task["task"]["taskId"]
    # The relay keeps a task at most a day, whatever it was asked.
    task_expires = time.time() + task["task"]["ttl"] / 1000
    time.sleep(1.5)
    return {
        "task_id": task_id,
        "task_expires": task_expires,
        "reservation_expires": time.time() + 7 * 86400 - 60,
        "first": first["id"],
        "directive": directive["id"],
    }


def questions(r, kept):
    """What each face answers about the store: (name, answer)."""
    rest = [
        "/api/channels", "/api/channels/search?q=build", "/api/channels/dev/messages?since_id=0",
        f"/api/channels/dev/messages/{kept['first']}/replies",
        f"/api/channels/dev/messages/{kept['directive']}/readers",
        "/api/channels/dev/directives?recipient=reviewer", "/api/channels/ops/messages?since_id=0",
        "/api/channels/ops/session", "/api/instances",
        "/api/data", "/api/data/plan", "/api/reservations?project=crosstalk", "/api/webhooks",
        "/api/oauth/clients", "/api/search?q=ship",
    ]
    out = [(f"GET {p}", r.json("GET", p)) for p in rest]
    # As the reviewer: what its read cursor says.
    out.append(("GET /api/unread (reviewer)", r.json("GET", "/api/unread?instance_id=reviewer", token=TOKENS["reviewer"])))
    mcp = r.mcp("/mcp", TOKENS["reviewer"], [
        ("tools/call", {"name": "get_messages", "arguments": {"channel": "dev", "since_id": 0}}),
        ("tools/call", {"name": "list_channels", "arguments": {}}),
        ("tools/call", {"name": "get_shared_data", "arguments": {"key": "plan"}}),
        ("tools/call", {"name": "get_session", "arguments": {"channel": "ops"}}),
        ("resources/read", {"uri": "crosstalk://channels/dev"}),
    ])
    names = ("get_messages", "list_channels", "get_shared_data", "get_session", "resource")
    out += [(f"MCP /mcp {n}", a) for n, a in zip(names, mcp)]
    cc = r.mcp("/cc/mcp", TOKENS["reviewer"], [
        ("tools/call", {"name": "get_replies", "arguments": {"channel": "dev", "message_id": kept["first"]}}),
        ("tools/call", {"name": "list_channels", "arguments": {}}),
        ("tools/call", {"name": "search_messages", "arguments": {"query": "ship"}}),
    ])
    cc[1] = without_general(cc[1])
    out += [(f"MCP /cc/mcp {n}", a) for n, a in zip(("get_replies", "list_channels", "search_messages"), cc)]
    task = r.mcp("/mcp", TOKENS["coder"], [("tasks/get", {"taskId": kept["task_id"]})])[0]
    out.append(("MCP tasks/get", task))
    return [(name, scrub(answer)) for name, answer in out]


def shows(want, got):
    """Whether `got` shows everything `want` did: the same values, in lists of the same length
    and order; a field a later release added is no loss."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and shows(v, got[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(got, list) and len(want) == len(got) and all(shows(w, g) for w, g in zip(want, got))
    return want == got


def as_now(name, want):
    """What a recorded answer reads as in a release that words or orders it differently on
    purpose, the same data shown: cross-claude-mcp's own forms (issue #56) list search results
    newest first and write a thread's replies without `(reply to #N)`."""
    if name not in ("MCP /cc/mcp get_replies", "MCP /cc/mcp search_messages") or not isinstance(want, dict):
        return want
    want = json.loads(json.dumps(want))
    text = want["content"][0]["text"]
    if name == "MCP /cc/mcp get_replies":
        want["content"][0]["text"] = re.sub(r" \(reply to #\d+\)", "", text)
    elif name == "MCP /cc/mcp search_messages":
        head, _, body = text.partition(":\n\n")
        want["content"][0]["text"] = head + ":\n\n" + "\n\n---\n\n".join(reversed(body.split("\n\n---\n\n")))
        want["structuredContent"]["messages"].reverse()
    return want


def without_general(answer):
    """cross-claude's `general` channel is listed before anyone posts to it, made when listed."""
    if isinstance(answer, dict):
        for c in answer.get("structuredContent", {}).get("channels", []):
            if c.get("name") == "general" and not c.get("message_count"):
                c.pop("created_at", None)
    return answer


def make(args):
    work = tempfile.mkdtemp(prefix="crosstalk-upgrade-")
    nats = Nats(work) if args.nats else None
    r = Relay(args.crosstalk, os.path.join(work, "data"), nats and nats.url)
    try:
        kept = populate(r)
    finally:
        r.stop()
        if nats:
            nats.stop()
    os.makedirs(args.out, exist_ok=True)
    store = os.path.join(args.out, "store.tar.gz")
    with tarfile.open(store, "w:gz") as t:
        for part in ("data", "js") if nats else ("data",):
            t.add(os.path.join(work, part), arcname=part)
    # The answers are those of the same binary on a copy of what was kept, as `check` asks
    # them of the new one (asking moves read cursors).
    answers = ask(args.crosstalk, store, kept)
    version = subprocess.run([args.crosstalk, "--version"], capture_output=True, text=True).stdout.strip()
    if args.commit:
        version += f" at {args.commit}"
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump({"written_by": version, "kept": kept, "answers": answers}, f, indent=1, sort_keys=True)
        f.write("\n")
    shutil.rmtree(work)
    print(f"upgrade store: {len(answers)} answers recorded in {args.out}")


def ask(binary, store, kept, after=None):
    """The answers of `binary` on a fresh copy of `store` (a relay's data directory, and a
    JetStream store if it was a node); `after(relay)` runs before it stops."""
    work = tempfile.mkdtemp(prefix="crosstalk-upgrade-")
    with tarfile.open(store) as t:
        t.extractall(work, filter="data")
    nats = Nats(work) if os.path.isdir(os.path.join(work, "js")) else None
    try:
        r = Relay(binary, os.path.join(work, "data"), nats and nats.url)
        try:
            answers = questions(r, kept)
            if after:
                after(r)
        finally:
            r.stop()
    finally:
        if nats:
            nats.stop()
        shutil.rmtree(work, ignore_errors=True)
    return answers


def check(args):
    with open(os.path.join(args.fixture, "expected.json")) as f:
        expected = json.load(f)
    kept = expected["kept"]
    problems = []

    def ids_continue(r):
        newest = max(c["last_id"] for c in r.json("GET", "/api/channels"))
        posted = r.json("POST", "/api/channels/dev/messages", {"body": "after the upgrade"}, TOKENS["coder"])
        # Above every id the store handed out (a restart may skip some: never reuse one).
        if posted["id"] <= newest:
            problems.append(f"a post after the upgrade took id {posted['id']}, not one above {newest}")

    got = dict(ask(args.crosstalk, os.path.join(args.fixture, "store.tar.gz"), kept, ids_continue))
    now = time.time()
    for name, want in expected["answers"]:
        # Left out as this version of the check leaves it out (what was recorded may hold more).
        want = as_now(name, scrub(want))
        # What expires with time alone: once past its time, it is gone (and was still read).
        if name == "GET /api/reservations?project=crosstalk" and now > kept["reservation_expires"]:
            want = {"reservations": []}
        if name == "MCP tasks/get" and now > kept["task_expires"] and "error" in got.get(name, {}):
            continue
        if not shows(want, got.get(name)):
            problems.append(f"{name}:\n    was {json.dumps(want)[:1500]}\n    now {json.dumps(got.get(name))[:1500]}")
    if problems:
        print(f"FAILED: the store written by {expected['written_by']} reads differently:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        sys.exit(1)
    print(f"upgrade: a store written by {expected['written_by']} shows the same {len(got)} answers, and ids continue")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("make")
    m.add_argument("--crosstalk", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--commit", help="the commit OLD_BINARY was built from, for the record")
    m.add_argument("--nats", action="store_true", help="a relay node on a nats-server of its own ($NATS_SERVER)")
    c = sub.add_parser("check")
    c.add_argument("--crosstalk", required=True)
    c.add_argument("--fixture", required=True)
    args = p.parse_args()
    make(args) if args.what == "make" else check(args)


if __name__ == "__main__":
    main()
