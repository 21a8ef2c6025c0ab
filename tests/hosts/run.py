"""The real agent hosts follow the README's loop against a relay: Claude Code (`claude -p`) and
Codex (`codex exec`, then `codex exec resume --last`), each over HTTP (the relay's /mcp) and
through the stdio bridge (`crosstalk mcp`), with a scripted model of our own on loopback
(tests/hosts/model.py) in place of Anthropic's and OpenAI's.

Usage: run.py --crosstalk BIN --claude BIN --codex BIN [--only claude|codex]

Each host runs the loop: register, post, a long wait_for_message from the id its post gave
(woken by another agent posting over REST while it waits), check_messages; its identity is
named once, in register. Then the host is started again (Claude Code: a second `claude -p`;
Codex: `codex exec resume --last`) and must take its name back at once. `claude mcp list` must
report both servers connected. Codex runs with its default approval settings, as `codex exec`
does out of the box.

What is checked: on the relay, what the host did (the messages, their sender, the identity);
in the model's record, what the model was given (the tool results, as the host passed them);
the host's exit and final answer. Every check prints a line; a failed one says what was
expected and what came instead, and the run goes on with the next scenario. Exits 1 if any
check failed, and keeps the hosts' homes, the relay's log and the model's record.

Nothing may leave loopback: scripts/hosts-test runs this in a network namespace of its own;
the hosts are also told to send no telemetry, and to use the model server as their proxy,
which refuses and records every request for elsewhere.
"""

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Call, Model, Say, ScriptError, serve  # noqa: E402

# How long one host process may run: a loop with a parked wait takes a few seconds; a host
# stuck on something (an MCP server, a model request) fails its scenario instead of hanging.
HOST_LIMIT_S = 120
# The timeout of the wait the host parks: longer than the scenario, so only the other agent's
# post ends it.
WAIT_TIMEOUT_S = 50
# How long the other agent lets the host's wait stay parked before it posts, so the answer goes
# to a wait that really waited through its host, not to one still being set up.
HOLD_S = 2
# How long the other agent waits for the host's wait to be parked.
PARK_LIMIT_S = 90
# The steps of the README's loop whose results the model must be given, in order.
LOOP = ["register", "post_message", "wait_for_message", "check_messages"]


class Failed(Exception):
    """A check failed: what was expected, and what came instead."""


def loopback_up():
    """A fresh network namespace has its loopback down: bring it up (SIOCSIFFLAGS, as `ip link
    set lo up` does), so the relay, the model and the hosts can reach each other."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, struct.pack("16sH14x", b"lo", 0)))[1]
        if not flags & iff_up:
            fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


class Relay:
    """A relay of this run's own: `crosstalk serve` on a free loopback port, fresh data."""

    def __init__(self, binary, work):
        self.log = open(os.path.join(work, "relay.log"), "w+")
        self.process = subprocess.Popen(
            [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", os.path.join(work, "relay")],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        line = self.process.stdout.readline()
        if not line.startswith("crosstalk listening on "):
            self.log.seek(0)
            raise Failed(f"the relay did not start: {line!r} {self.log.read()[-2000:]}")
        self.base = line.split()[-1]

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return json.load(r)

    def post(self, path, body):
        headers = {"content-type": "application/json"}
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.load(r)

    def messages(self, channel):
        return self.get(f"/api/channels/{channel}/messages?since_id=0")

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Waker:
    """The other agent: once the host's wait is parked on the relay (`/healthz` counts it), and
    has stayed parked HOLD_S, it posts over REST. Scenarios run one at a time, so the one parked
    wait is the host's."""

    def __init__(self, relay, channel, body):
        self.relay, self.channel, self.body = relay, channel, body
        self.posted = None
        self.error = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            deadline = time.monotonic() + PARK_LIMIT_S
            while self.relay.get("/healthz")["waits"] < 1:
                if self.stop.wait(0.05) or time.monotonic() > deadline:
                    self.error = "the host's wait was never parked on the relay"
                    return
            if self.stop.wait(HOLD_S) or self.relay.get("/healthz")["waits"] < 1:
                self.error = f"the host's wait ended before it had been parked {HOLD_S} s"
                return
            message = {"sender": "peer", "type": "answer", "body": self.body}
            self.posted = self.relay.post(f"/api/channels/{self.channel}/messages", message)
        except Exception as e:  # noqa: BLE001 - reported as the scenario's failure
            self.error = f"{type(e).__name__}: {e}"

    def finish(self):
        self.stop.set()
        self.thread.join(10)


def since(history):
    """The id a model waits from after its post, as the README says: the answer's
    `next_since_id`, else the id of its own post."""
    last = history[-1].json() if history else None
    if not isinstance(last, dict) or not {"next_since_id", "id"} & last.keys():
        shown = history[-1].text[:300] if history else None
        raise ScriptError(f"the post's result carries neither next_since_id nor id: {shown}")
    return last.get("next_since_id", last.get("id"))


def newest(history, key):
    """`key` of the newest result that carries it at its top level."""
    for seen in reversed(history):
        value = seen.json()
        if isinstance(value, dict) and key in value:
            return value[key]
    raise ScriptError(f"no result the model was given carries {key!r}")


class Suite:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.model = Model()
        self.server = serve(self.model)
        self.model_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.relay = Relay(args.crosstalk, work)
        self.passed = 0
        self.failed = []

    # ---- reporting
    def check(self, cond, what, detail=""):
        if not cond:
            raise Failed(f"{what}: {detail}")
        self.passed += 1
        print(f"ok   {what}", flush=True)

    def scenario(self, title, f):
        print(f"== {title}", flush=True)
        started = time.monotonic()
        try:
            f()
        except Failed as e:
            self.failed.append(str(e))
            print(f"FAIL {e}", flush=True)
        except Exception:  # noqa: BLE001 - a bug in the harness fails the run as loudly
            self.failed.append(f"{title}: {traceback.format_exc()}")
            print(f"FAIL {title}:\n{traceback.format_exc()}", flush=True)
        print(f"   ({time.monotonic() - started:.1f} s)", flush=True)

    # ---- the hosts' environments
    def home(self, name):
        return tempfile.mkdtemp(prefix=f"{name}-", dir=self.work)

    def base_env(self, home):
        """What every host gets: a home of its own, and no way out but loopback (a proxy that
        refuses, for whatever honours the proxy variables)."""
        loopback = "127.0.0.1,localhost"
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "TMPDIR": home,
            "LANG": "C.UTF-8",
            **{v: self.model_url for v in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")},
            **{v: loopback for v in ("NO_PROXY", "no_proxy")},
        }

    def claude_env(self, home):
        return {
            **self.base_env(home),
            "ANTHROPIC_BASE_URL": self.model_url,
            "ANTHROPIC_API_KEY": "scripted-model",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }

    def mcp_server(self, transport):
        """The relay as a host's MCP server: its /mcp, or the bridge, started by the host."""
        if transport == "http":
            return {"type": "http", "url": f"{self.relay.base}/mcp"}
        return {"type": "stdio", "command": self.args.crosstalk, "args": ["mcp", "--relay", self.relay.base]}

    def run(self, argv, env, cwd, what):
        try:
            return subprocess.run(
                argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HOST_LIMIT_S
            )
        except subprocess.TimeoutExpired as e:
            output = (e.stdout or b"")[-2000:]
            raise Failed(f"{what} ran longer than {HOST_LIMIT_S} s; its output: {output!r}") from None

    # ---- what both hosts do
    def loop_script(self, name, channel):
        """register, post, wait from the post's id, check_messages: the README's loop, the
        identity named once, in register."""

        def wait(history):
            return {"channel": channel, "since_id": since(history), "timeout_s": WAIT_TIMEOUT_S}

        return [
            Call("register", {"instance_id": name}),
            Call("post_message", {"channel": channel, "type": "status", "body": f"hello from {name}"}),
            Call("wait_for_message", wait),
            Call("check_messages", {}),
            Say(f"loop done: {name}"),
        ]

    def check_loop(self, script, name, channel, waker, label):
        """What the model's record and the relay must show after the loop."""
        error = self.model.errors.get(script)
        self.check(error is None, f"{label}: the model could play the whole loop", error)
        seen = self.model.seen.get(script, [])
        self.check(
            [s.tool for s in seen] == LOOP,
            f"{label}: the model was given the results of {', '.join(LOOP)}",
            [s.tool for s in seen],
        )
        parked = f"{label}: the wait stayed parked on the relay until another agent posted"
        self.check(waker.error is None, parked, waker.error)
        got = seen[2].json()
        self.check(
            [m.get("id") for m in got.get("messages", [])] == [waker.posted["id"]] and not got.get("timed_out"),
            f"{label}: the wait woke with the other agent's message, and the model was given it",
            seen[2].text[:500],
        )
        stored = [(m["sender"], m["body"]) for m in self.relay.messages(channel)]
        self.check(
            stored == [(name, f"hello from {name}"), ("peer", waker.body)],
            f"{label}: the relay holds the host's post under its registered name, then the other agent's",
            stored,
        )
        instances = sorted(i["instance_id"] for i in self.relay.get("/api/instances"))
        self.check(name in instances, f"{label}: the relay lists {name} among its identities", instances)

    # ---- Claude Code
    def claude(self, transport):
        label = f"Claude Code over {transport}"
        name, channel = f"claude-{transport}", f"hosts-claude-{transport}"
        home = self.home(f"claude-{transport}")
        config = json.dumps({"mcpServers": {"crosstalk": self.mcp_server(transport)}})

        def claude_p(script, prompt):
            argv = [self.args.claude, "-p", f"[script:{script}] {prompt}"]
            argv += ["--mcp-config", config, "--strict-mcp-config", "--output-format", "json"]
            # In -p mode nobody answers a permission prompt: the relay's tools are allowed by
            # their server's name, as a user of a headless agent allows them.
            argv += ["--allowedTools", "mcp__crosstalk"]
            p = self.run(argv, self.claude_env(home), home, label)
            try:
                out = json.loads(p.stdout)
            except ValueError:
                output = f"{p.stdout[-1500:]} {p.stderr[-1500:]}"
                raise Failed(f"claude -p exited {p.returncode} without its JSON answer: {output}") from None
            exited = (p.returncode, out.get("result"))
            self.check(p.returncode == 0 and not out.get("is_error"), f"{label}: claude -p exits 0", exited)
            return out

        def first_run():
            script = f"claude-{transport}-1"
            self.model.script(script, self.loop_script(name, channel))
            waker = Waker(self.relay, channel, f"a reply for {name}")
            try:
                out = claude_p(script, "Join the team channel and wait for a reply.")
            finally:
                waker.finish()
            self.check_loop(script, name, channel, waker, label)
            answer = out.get("result")
            self.check(answer == f"loop done: {name}", f"{label}: its answer is the model's final text", answer)

        def second_run():
            script = f"claude-{transport}-2"
            self.model.script(
                script,
                [
                    Call("register", {"instance_id": name}),
                    Call("post_message", {"channel": channel, "type": "status", "body": f"{name} is back"}),
                    Say(f"back: {name}"),
                ],
            )
            out = claude_p(script, "You were restarted: carry on as before.")
            error = self.model.errors.get(script)
            self.check(error is None, f"{label}, started again: it registers {name} and posts at once", error)
            last = self.relay.messages(channel)[-1]
            self.check(
                (last["sender"], last["body"]) == (name, f"{name} is back"),
                f"{label}, started again: the relay holds its post under {name}",
                last,
            )
            answer = out.get("result")
            again = f"{label}, started again: its answer is the model's final text"
            self.check(answer == f"back: {name}", again, answer)

        self.scenario(f"{label}: register, post, a wait woken by another agent, check_messages", first_run)
        self.scenario(f"{label}: a second claude -p takes the same name at once", second_run)

    def claude_relay_down(self):
        """A host whose bridge cannot reach its relay still gets the relay's whole tool list at
        once, and a call says why it failed and what to run, instead of a run with no relay
        tools that "succeeds"."""
        label = "Claude Code through crosstalk mcp, the relay down"
        home = self.home("claude-down")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            down = f"http://127.0.0.1:{s.getsockname()[1]}"
        server = {"type": "stdio", "command": self.args.crosstalk, "args": ["mcp", "--relay", down]}
        config = json.dumps({"mcpServers": {"crosstalk": server}})
        script = "claude-down"
        self.model.script(
            script,
            [Call("post_message", {"channel": "hosts-down", "body": "anyone there?"}, refused=True), Say("relay down")],
        )
        argv = [self.args.claude, "-p", f"[script:{script}] Post to the team channel."]
        argv += ["--mcp-config", config, "--strict-mcp-config", "--output-format", "json"]
        argv += ["--allowedTools", "mcp__crosstalk"]
        p = self.run(argv, self.claude_env(home), home, label)
        error = self.model.errors.get(script)
        self.check(error is None, f"{label}: the host offered the relay's post_message to the model", error)
        seen = self.model.seen.get(script, [])
        self.check(len(seen) == 1, f"{label}: the model called it once", [s.tool for s in seen])
        told = seen[0].text
        self.check(
            seen[0].error and down.split("//")[1] in told and "crosstalk serve" in told,
            f"{label}: the model was told the call failed, which relay is unreachable and what to run",
            told[:500],
        )
        self.check(p.returncode == 0, f"{label}: claude -p exits 0 with the model's answer", p.returncode)

    @contextlib.contextmanager
    def woken_claude(self, label, me, name, script, *flags):
        """`crosstalk wake --as me` whose turns are the real `claude -p` with crosstalk's tools
        (through `crosstalk mcp`), its model playing `script`: yields once wake holds the
        identity (the wake process and its home); stops it with SIGTERM after, which must
        end it cleanly."""
        home = self.home(name)
        server = {"type": "stdio", "command": self.args.crosstalk, "args": ["mcp", "--relay", self.relay.base]}
        config = os.path.join(home, "mcp.json")
        with open(config, "w") as f:
            json.dump({"mcpServers": {"crosstalk": server}}, f)
        argv = [self.args.crosstalk, "wake", "--relay", self.relay.base, "--as", me, "--log-dir", home, "--"]
        argv += [self.args.claude, "-p", f"[script:{script}] {{prompt}}", "--mcp-config", config]
        argv += ["--strict-mcp-config", "--allowedTools", "mcp__crosstalk", *flags]
        wake = subprocess.Popen(
            argv, env=self.claude_env(home), cwd=home, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            deadline = time.monotonic() + 20
            while not any(w["identity"] == me for w in self.relay.get("/api/wake")["woken"]):
                if time.monotonic() > deadline or wake.poll() is not None:
                    raise Failed(f"{label}: wake never held {me}")
                time.sleep(0.1)
            yield wake, home
        finally:
            wake.terminate()
            try:
                _, err = wake.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                wake.kill()
                _, err = wake.communicate()
        self.check(wake.returncode == 0, f"{label}: wake stops cleanly on SIGTERM", err[-1500:])

    def claude_woken(self):
        """`crosstalk wake` with the real Claude Code as the agent: a directive wakes it, the
        model answers on the channel through the relay's tools, and the reply to that answer
        wakes it again; each turn a `claude -p` of its own, the new messages in its prompt."""
        label = "crosstalk wake running claude -p"
        channel, me = "hosts-wake", "claude-woken"
        script = "claude-woken"
        self.model.script(
            script,
            [
                Call("post_message", {"channel": channel, "sender": me, "body": "on it"}),
                Say("answered"),
            ],
        )
        with self.woken_claude(label, me, "claude-wake", script) as (wake, _home):
            directive = {"sender": "lead", "type": "DIRECTIVE", "recipient": me, "body": "review the plan"}
            asked = self.relay.post(f"/api/channels/{channel}/messages", directive)

            def answers(n):
                deadline = time.monotonic() + HOST_LIMIT_S
                while True:
                    mine = [m for m in self.relay.messages(channel) if m["sender"] == me]
                    if len(mine) >= n:
                        return mine
                    if time.monotonic() > deadline or wake.poll() is not None:
                        raise Failed(f"{label}: {len(mine)} answers from {me}, not {n}")
                    time.sleep(0.2)

            first = answers(1)[0]
            self.check(
                first["body"] == "on it" and first["id"] > asked["id"],
                f"{label}: a directive woke the real host, which answered on the channel through the relay's tools",
                first,
            )
            # The relay holds the post before Claude Code hands the tool's result back to the
            # model: wait for that request too.
            deadline = time.monotonic() + HOST_LIMIT_S
            while not self.model.seen.get(script) and time.monotonic() < deadline:
                time.sleep(0.1)
            seen = self.model.seen.get(script, [])
            self.check(
                [s.tool for s in seen][:1] == ["post_message"] and not seen[0].error,
                f"{label}: the model's post_message went through",
                [(s.tool, s.text[:200]) for s in seen],
            )
            self.relay.post(
                f"/api/channels/{channel}/messages",
                {"sender": "lead", "body": "thanks; one more thing", "reply_to": first["id"]},
            )
            second = answers(2)[1]
            self.check(second["id"] > first["id"], f"{label}: the reply to its answer woke it again", second)
            # The turn that posted it ends (and is recorded) once claude -p exits.
            deadline = time.monotonic() + 30
            while True:
                state = next(w for w in self.relay.get("/api/wake")["woken"] if w["identity"] == me)
                if len(state["turns"]) >= 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            outcomes = [t["outcome"] for t in state["turns"]]
            self.check(outcomes == ["ok", "ok"], f"{label}: two turns, each claude -p exiting 0", state)

    def claude_permission(self):
        """A woken turn whose model wants a tool it was not allowed: Claude Code asks
        `--permission-prompt-tool mcp__crosstalk__permission_prompt`, the bridge posts a
        PERMISSION to the humans, a person allows it over REST, and the tool runs."""
        label = "crosstalk wake, claude -p --permission-prompt-tool"
        channel, me = "hosts-permission", "claude-asks"
        script = "claude-permission"
        flags = ("--permission-prompt-tool", "mcp__crosstalk__permission_prompt")
        with self.woken_claude(label, me, "claude-permission", script, *flags) as (wake, home):
            # A command that changes something: Claude Code asks before running it (an echo
            # it would run unasked).
            made = os.path.join(home, "permitted-by-a-person")
            self.model.script(script, [Call("Bash", {"command": f"mkdir {made} && echo made"}), Say("ran it")])
            directive = {"sender": "lead", "type": "DIRECTIVE", "recipient": me, "body": "run the check"}
            self.relay.post(f"/api/channels/{channel}/messages", directive)
            deadline = time.monotonic() + 60
            while True:
                asks = [m for m in self.relay.messages(channel) if m["type"] == "PERMISSION"]
                if asks:
                    break
                if time.monotonic() > deadline or wake.poll() is not None:
                    raise Failed(f"{label}: no PERMISSION reached the relay; model saw {self.model.seen.get(script)}")
                time.sleep(0.2)
            ask = asks[0]
            self.check(
                ask["sender"] == me and ask["recipient"] == "any-human" and "Allow Bash?" in ask["body"],
                f"{label}: Claude Code's permission request reached the humans on the turn's channel",
                ask,
            )
            answer = {"sender": "pat", "type": "ANSWER", "body": "allow", "reply_to": ask["id"]}
            self.relay.post(f"/api/channels/{channel}/messages", answer)
            deadline = time.monotonic() + HOST_LIMIT_S
            while not self.model.seen.get(script):
                if time.monotonic() > deadline:
                    raise Failed(f"{label}: the tool never ran after the allow")
                time.sleep(0.2)
            ran = self.model.seen[script][0]
            self.check(
                ran.tool == "Bash" and not ran.error and "made" in ran.text and os.path.isdir(made),
                f"{label}: a person's allow let the tool run, and the model got its output",
                (ran.tool, ran.error, ran.text[:300]),
            )
            # The turn ends (claude -p exits, its bridge closes its session) before wake stops.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                state = next(w for w in self.relay.get("/api/wake")["woken"] if w["identity"] == me)
                if state["turns"]:
                    break
                time.sleep(0.1)
            self.check(
                [t["outcome"] for t in state["turns"]] == ["ok"],
                f"{label}: the turn ended, claude -p exiting 0",
                state,
            )
        # The verdict went to the turn that asked; it woke nothing more.
        self.check(len(state["turns"]) == 1, f"{label}: the verdict did not wake it again", state)

    def claude_mcp_list(self):
        home = self.home("claude-list")
        env = self.claude_env(home)
        for transport in ("http", "stdio"):
            server = self.mcp_server(transport)
            if transport == "http":
                add = ["--transport", "http", f"crosstalk-{transport}", server["url"]]
            else:
                add = [f"crosstalk-{transport}", "--", server["command"], *server["args"]]
            p = self.run([self.args.claude, "mcp", "add", "--scope", "user", *add], env, home, "claude mcp add")
            self.check(p.returncode == 0, f"claude mcp add crosstalk-{transport}", p.stdout + p.stderr)
        p = self.run([self.args.claude, "mcp", "list"], env, home, "claude mcp list")
        lines = {line.split(":")[0]: line for line in p.stdout.splitlines()}
        for transport in ("http", "stdio"):
            line = lines.get(f"crosstalk-{transport}", "")
            connected = f"claude mcp list: crosstalk-{transport} is connected"
            self.check(line.endswith("Connected"), connected, p.stdout + p.stderr)

    # ---- Codex
    def codex_home(self, transport):
        home = self.home(f"codex-{transport}")
        codex_home = os.path.join(home, ".codex")
        os.makedirs(codex_home)
        server = self.mcp_server(transport)
        if transport == "http":
            mcp = f"url = {json.dumps(server['url'])}"
        else:
            mcp = f"command = {json.dumps(server['command'])}\nargs = {json.dumps(server['args'])}"
        with open(os.path.join(codex_home, "config.toml"), "w") as f:
            f.write(
                f"""# The scripted model, speaking the Responses API. No approval or sandbox setting:
# those are `codex exec`'s defaults.
model = "scripted"
model_provider = "scripted"
check_for_update_on_startup = false

[model_providers.scripted]
name = "scripted model on loopback"
base_url = "{self.model_url}/v1"
wire_api = "responses"

[analytics]
enabled = false

[feedback]
enabled = false

[mcp_servers.crosstalk]
{mcp}
"""
            )
        return home, {**self.base_env(home), "CODEX_HOME": codex_home}

    def codex(self, transport):
        label = f"Codex over {transport}"
        name, channel = f"codex-{transport}", f"hosts-codex-{transport}"
        home, env = self.codex_home(transport)
        # --strict-config: a setting this Codex does not know fails the run instead of doing
        # nothing. Outside a git checkout Codex asks for --skip-git-repo-check.
        flags = ["--strict-config", "--skip-git-repo-check"]
        state = {}

        def first_run():
            script = f"codex-{transport}-1"
            self.model.script(script, self.loop_script(name, channel))
            waker = Waker(self.relay, channel, f"a reply for {name}")
            try:
                prompt = f"[script:{script}] Join the team channel and wait for a reply."
                p = self.run([self.args.codex, "exec", *flags, prompt], env, home, label)
            finally:
                waker.finish()
            state["ran"] = p.returncode == 0
            self.check(p.returncode == 0, f"{label}: codex exec exits 0", p.stderr[-1500:])
            self.check_loop(script, name, channel, waker, label)
            answer = f"{label}: its answer is the model's final text"
            self.check(f"loop done: {name}" in p.stdout, answer, p.stdout[-500:])

        def resumed():
            if not state.get("ran"):
                raise Failed("codex exec did not finish, so there is no session to resume")
            # While the host is away another agent posts; the resumed host reads on from where
            # its history says it was.
            away = {"sender": "peer", "type": "status", "body": f"while {name} was away"}
            away = self.relay.post(f"/api/channels/{channel}/messages", away)
            script = f"codex-{transport}-2"
            self.model.script(
                script,
                [
                    Call("register", {"instance_id": name}),
                    # The first run's wait gave next_since_id; the newest result is register's.
                    Call("get_messages", lambda h: {"channel": channel, "since_id": newest(h[:-1], "next_since_id")}),
                    Say(f"resumed: {name}"),
                ],
            )
            prompt = f"[script:{script}] You were restarted: carry on."
            p = self.run([self.args.codex, "exec", "resume", "--last", *flags, prompt], env, home, label)
            self.check(p.returncode == 0, f"{label}: codex exec resume --last exits 0", p.stderr[-1500:])
            error = self.model.errors.get(script)
            self.check(
                error is None, f"{label}, resumed: it registers {name} again at once and reads on from its wait", error
            )
            history = [s.tool for s in self.model.history.get(script, [])]
            given = f"{label}, resumed: the model was given the first run's history"
            self.check(history[: len(LOOP)] == LOOP, given, history)
            got = self.model.seen[script][1].json()
            self.check(
                [m.get("id") for m in got.get("messages", [])] == [away["id"]],
                f"{label}, resumed: it read exactly what was posted while it was away",
                got,
            )
            answer = f"{label}, resumed: its answer is the model's final text"
            self.check(f"resumed: {name}" in p.stdout, answer, p.stdout[-500:])

        self.scenario(
            f"{label}: codex exec with its default approval settings: register, post, a wait woken by another agent, "
            "check_messages",
            first_run,
        )
        self.scenario(f"{label}: codex exec resume --last takes the same name back at once", resumed)

    def keep_record(self):
        """What the model was sent and answered, beside the hosts' homes, for a failure."""
        with open(os.path.join(self.work, "model.json"), "w") as f:
            json.dump({"requests": self.model.requests, "last_body": self.model.last_body}, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--crosstalk", required=True)
    parser.add_argument("--claude", required=True)
    parser.add_argument("--codex", required=True)
    parser.add_argument("--only", choices=["claude", "codex"])
    args = parser.parse_args()
    for host in ("crosstalk", "claude", "codex"):
        setattr(args, host, os.path.abspath(getattr(args, host)))
    loopback_up()
    work = tempfile.mkdtemp(prefix="crosstalk-hosts-")
    started = time.monotonic()
    suite = Suite(args, work)
    try:
        print(f"== relay {suite.relay.base}, scripted model {suite.model_url}", flush=True)
        if args.only in (None, "claude"):
            for transport in ("http", "stdio"):
                suite.claude(transport)
            listed = "claude mcp list: the relay connected, over HTTP and through crosstalk mcp"
            suite.scenario(listed, suite.claude_mcp_list)
            down = "Claude Code through crosstalk mcp with its relay down: every tool offered, a call says why"
            suite.scenario(down, suite.claude_relay_down)
            woken = "crosstalk wake: a directive wakes the real Claude Code, which answers, and the reply wakes it again"
            suite.scenario(woken, suite.claude_woken)
            asks = "crosstalk wake: a woken Claude Code's permission request decided by a person on the relay"
            suite.scenario(asks, suite.claude_permission)
        if args.only in (None, "codex"):
            for transport in ("http", "stdio"):
                suite.codex(transport)
        # What the hosts left behind: a host that never sends DELETE leaves its session open.
        sessions = suite.relay.get("/healthz")["sessions"]
        print(f"== MCP sessions still open on the relay after every host exited: {sessions}")
    finally:
        suite.relay.stop()
        suite.server.shutdown()
    escapes = sorted(set(suite.model.escapes))
    print(f"== requests for elsewhere, refused: {', '.join(escapes) if escapes else 'none'}")
    took = time.monotonic() - started
    if suite.failed:
        suite.keep_record()
        failed = f"{len(suite.failed)} scenarios FAILED"
        print(f"hosts: {suite.passed} checks passed, {failed}, in {took:.0f} s:", file=sys.stderr)
        for f in suite.failed:
            print(f"  - {f}", file=sys.stderr)
        print(f"(kept in {work}: the hosts' homes, relay.log, model.json)", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)
    print(f"hosts: {suite.passed} checks passed in {took:.0f} s")


if __name__ == "__main__":
    main()
