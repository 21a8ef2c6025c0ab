#!/usr/bin/env node
// One fixed cross-claude-mcp session played by two MCP clients, alice and bob, against an
// endpoint, printing every tool call and the text of its result as one JSON line:
//   {"step": n, "who": "alice", "tool": "...", "args": {...}, "text": "..."}
// ("error": true is added when the call failed or its result had isError).
//
// Usage:
//   node session.mjs [--distinct-seconds] http URL             streamable HTTP (http://127.0.0.1:PORT/mcp)
//   node session.mjs [--distinct-seconds] stdio CMD [ARGS...]  one server process per client (CMD ARGS)
//
// --distinct-seconds: before each send_message, wait until the wall clock has moved to a later
// second than the previous send's answer. cross-claude-mcp keeps created_at in whole seconds and
// orders by it, so messages sent within one second tie and its "newest" (check_messages without
// after_id, list_channels, search) then depends on where the second boundaries fell; with this
// flag every message has a second of its own and the peer's orders follow the ids.
//
// The MCP TypeScript SDK is imported by absolute path: from $MCP_SDK_DIR if set, else from the
// first of the candidate folders below that holds it.
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..");
const candidates = [
  process.env.MCP_SDK_DIR,
  join(root, ".venv-test/npm/node_modules/@modelcontextprotocol/sdk"),
  join(root, ".venv-test/peer-cc/app/node_modules/@modelcontextprotocol/sdk"),
].filter(Boolean);
const sdkDir = candidates.find((d) => existsSync(join(d, "dist/esm/client/index.js")));
if (!sdkDir) {
  console.error(`session.mjs: no @modelcontextprotocol/sdk in: ${candidates.join(", ")}`);
  process.exit(2);
}
const sdk = (p) => import(pathToFileURL(join(sdkDir, "dist/esm", p)).href);
const { Client } = await sdk("client/index.js");

const argv = process.argv.slice(2);
const distinctSeconds = argv[0] === "--distinct-seconds";
if (distinctSeconds) argv.shift();
const [mode, ...rest] = argv;
if (!["http", "stdio"].includes(mode) || rest.length === 0) {
  console.error("usage: session.mjs [--distinct-seconds] http URL | session.mjs [--distinct-seconds] stdio CMD [ARGS...]");
  process.exit(2);
}

const CALL_TIMEOUT_MS = 30_000;
// The whole session is bounded: a hung server must not hang the test.
const overall = setTimeout(() => {
  console.error("session.mjs: session took over 150 s; giving up");
  process.exit(3);
}, 150_000);

async function connect(who) {
  const client = new Client({ name: `session-${who}`, version: "1.0.0" });
  let transport;
  if (mode === "http") {
    const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");
    transport = new StreamableHTTPClientTransport(new URL(rest[0]));
  } else {
    const { StdioClientTransport } = await sdk("client/stdio.js");
    transport = new StdioClientTransport({
      command: rest[0],
      args: rest.slice(1),
      env: { ...process.env },
      stderr: "ignore",
    });
  }
  await client.connect(transport, { timeout: CALL_TIMEOUT_MS });
  return { client, transport };
}

const peers = {};
peers.alice = await connect("alice");
peers.bob = await connect("bob");

const second = () => Math.floor(Date.now() / 1000);
let lastSendSecond = -1;
let step = 0;
async function call(who, tool, args) {
  if (distinctSeconds && tool === "send_message") {
    while (second() <= lastSendSecond) await new Promise((r) => setTimeout(r, 1000 - (Date.now() % 1000) + 5));
  }
  step += 1;
  const line = { step, who, tool, args };
  try {
    const result = await peers[who].client.callTool({ name: tool, arguments: args }, undefined, {
      timeout: CALL_TIMEOUT_MS,
    });
    line.text = (result.content || [])
      .filter((c) => c.type === "text")
      .map((c) => c.text)
      .join("\n");
    if (result.isError) line.error = true;
  } catch (e) {
    line.text = String(e?.message ?? e);
    line.error = true;
  }
  if (tool === "send_message") lastSendSecond = second();
  process.stdout.write(JSON.stringify(line) + "\n");
}

const alice = (tool, args) => call("alice", tool, args);
const bob = (tool, args) => call("bob", tool, args);

await alice("register", { instance_id: "alice", description: "writes the plan" });
await bob("register", { instance_id: "bob" });

await alice("create_channel", { name: "release-plan", description: "the 2.0 release" });
await alice("create_channel", { name: "release-plan" });

await alice("send_message", { sender: "alice", content: "first" });
await bob("send_message", { sender: "bob", content: "reply", message_type: "response", in_reply_to: 1 });
await alice("send_message", { channel: "release-plan", sender: "alice", content: "plan", message_type: "request" });

await alice("list_channels", {});

await bob("check_messages", { channel: "general", limit: 1 });
await bob("check_messages", { channel: "general", limit: 1 });
await alice("check_messages", {});
await alice("check_messages", { after_id: 0 });
await alice("check_messages", { after_id: 0, instance_id: "alice" });
await alice("check_messages", { after_id: 2, instance_id: "alice" });
await alice("check_messages", { channel: "empty-one" });

await bob("send_message", { sender: "bob", content: "crossing" });
await alice("send_message", { sender: "alice", content: "mine" });
await alice("check_messages", { after_id: 5, instance_id: "alice" });

await alice("get_replies", { message_id: 1 });
await alice("search_messages", { query: "crossing" });

await alice("wait_for_reply", {
  channel: "general", after_id: 1, instance_id: "alice",
  timeout_seconds: 5, poll_interval_seconds: 1, persistent: false,
});
await alice("wait_for_reply", {
  channel: "general", after_id: 5, instance_id: "alice", timeout_seconds: 1, persistent: false,
});

await bob("send_message", { sender: "bob", content: "last words" });
await bob("send_message", { sender: "bob", content: "bye", message_type: "done" });
await alice("wait_for_reply", {
  channel: "general", after_id: 5, instance_id: "alice",
  timeout_seconds: 5, poll_interval_seconds: 1, persistent: false,
});

await alice("list_instances", {});
await alice("find_channel", { query: "release" });
await alice("find_channel", { query: "nothing-like-it" });
await alice("get_replies", { message_id: 999 });

for (const who of ["bob", "alice"]) {
  const { client, transport } = peers[who];
  try {
    if (mode === "http" && transport.sessionId) await transport.terminateSession();
  } catch { /* the server may not support DELETE */ }
  try { await client.close(); } catch { /* already closed */ }
}
clearTimeout(overall);
process.exit(0);
