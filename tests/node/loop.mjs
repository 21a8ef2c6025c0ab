// The README's agent loop with the official TypeScript MCP client 2.x
// (@modelcontextprotocol/client) pinned to 2026-07-28, where requests carry no session: an agent
// registers, then posts, waits from the id its post returned and checks its inbox without ever
// naming itself, and a second agent's reply wakes the wait. With a participant token, the
// agent's host then "restarts" (a new client, the old one never closed, as Claude Code never
// sends DELETE) and registers the same name again: it takes the name back at once.
//
//   node loop.mjs http://127.0.0.1:PORT http|CROSSTALK_BINARY [TOKEN OTHER_TOKEN]
//
// With a path to the crosstalk binary instead of `http`, each agent spawns `crosstalk mcp
// --relay … [--token …]` and talks to it over stdio, as a host spawns the bridge. Prints one
// line per check; exits 1 on the first failure, and by itself after 60 s.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/client/stdio";

const [base, via, token, otherToken] = process.argv.slice(2);
const bridge = via === "http" ? null : via;
const label = `client 2.x, 2026-07-28${bridge ? " through crosstalk mcp" : " on /mcp"}, ${token ? "participant token" : "no token"}`;
setTimeout(() => fail("the loop took longer than 60 s"), 60_000).unref();

function fail(why) {
  console.error(`FAIL [${label}] ${why}`);
  process.exit(1);
}
function check(cond, what, detail) {
  if (!cond) fail(`${what}: ${JSON.stringify(detail)}`);
  console.log(`ok   [${label}] ${what}`);
}

const open = [];
async function connect(name, tok) {
  const client = new Client({ name, version: "0" }, { capabilities: {}, versionNegotiation: { mode: { pin: "2026-07-28" } } });
  const transport = bridge
    ? new StdioClientTransport({
        command: bridge,
        args: ["mcp", "--relay", base, ...(tok ? ["--token", tok] : [])],
        // The host's own environment, without a CROSSTALK_* that names another relay or token.
        env: getDefaultEnvironment(),
        stderr: "ignore",
      })
    : new StreamableHTTPClientTransport(new URL(base + "/mcp"), {
        requestInit: { headers: tok ? { Authorization: `Bearer ${tok}` } : {} },
      });
  await client.connect(transport);
  if (client.getProtocolEra() !== "modern") fail(`${name} did not speak 2026-07-28: ${client.getProtocolEra()}`);
  open.push(client);
  return client;
}

// What the model sees: Claude Code and Codex pass only the structured result.
async function call(client, name, args = {}) {
  const r = await client.callTool({ name, arguments: args });
  if (r.isError) fail(`${name} failed: ${JSON.stringify(r.structuredContent ?? r.content)}`);
  if (!r.structuredContent) fail(`${name} gave no structured result: ${JSON.stringify(r.content)}`);
  return r.structuredContent;
}

const channel = `loop-ts-${Math.random().toString(16).slice(2, 10)}`;
const me = token ? "coder" : `agent-${Math.random().toString(16).slice(2, 8)}`;
const agent = await connect("agent", token);
const peer = await connect("peer", otherToken);

const reg = await call(agent, "register", { instance_id: me });
check(typeof reg.next === "string" && reg.next.includes(me), "register says what to send next", reg);
const posted = await call(agent, "post_message", { channel, body: "ready for review?" });
check(posted.sender === me, "a post without a sender is the registered name's", posted);

const waiting = call(agent, "wait_for_message", { channel, since_id: posted.id, timeout_s: 30 });
await new Promise((r) => setTimeout(r, 500));
await call(peer, "post_message", { channel, sender: "reviewer", body: "yes, go", reply_to: posted.id });
const got = await waiting;
check(JSON.stringify(got.messages.map((m) => m.body)) === '["yes, go"]', "the other agent's reply wakes the wait", got);
check(typeof got.next_since_id === "number", "the wait names the id to wait from next", got);

const inbox = await call(agent, "check_messages");
check((inbox.instance_id ?? me) === me, "check_messages reads the registered name's inbox", inbox);
const quiet = await call(agent, "wait_for_message", { channel, since_id: got.next_since_id, timeout_s: 0.5 });
check(quiet.messages.length === 0, "its own messages never wake it", quiet);

if (token) {
  // The host restarts: the old client is never closed, a new one of the same token registers.
  const again = await connect("agent-restarted", token);
  await call(again, "register", { instance_id: me });
  const back = await call(again, "post_message", { channel, body: "back after a restart" });
  check(back.sender === me, "a restarted host takes its name back at once", back);
}

for (const c of open) await c.close().catch(() => {});
console.log(`ok   [${label}] the loop on ${channel}`);
process.exit(0);
