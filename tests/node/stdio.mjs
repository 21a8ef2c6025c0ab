// `crosstalk mcp` spawned as a host spawns it, by the official TypeScript SDK's stdio client
// (@modelcontextprotocol/sdk 1.x StdioClientTransport), a client we did not write:
//  - a conversation between the stdio agent and an HTTP agent (SDK, streamable HTTP);
//  - listen_live, then a post from elsewhere -> notifications/claude/channel on its stdout;
//  - the relay SIGKILLed and restarted mid-stream -> the next post still arrives, once;
//  - closing the stdio client (stdin) marks its instance offline at once.
// It starts its own relay (it restarts it).
//
//   node stdio.mjs /path/to/crosstalk crosstalk|cross-claude
//
// Prints one line per check; exits 1 on the first failure, and by itself after 90 s.

import { harness, sleep } from "./harness.mjs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [bin, toolSet] = process.argv.slice(2);
const cc = toolSet === "cross-claude";
const { base, fail, ok, check, ...relay } = await harness(bin, `stdio ${toolSet}`, 90_000);

const post = (channel, sender, text) =>
  cc ? ["send_message", { channel, sender, content: text }] : ["post_message", { channel, sender, body: text }];
const wait = (channel, after, s) =>
  cc
    ? ["wait_for_reply", { channel, after_id: after, max_wait_minutes: s / 60 }]
    : ["wait_for_message", { channel, since_id: after, timeout_s: s }];
const result = (r) => r.structuredContent ?? JSON.parse(r.content?.[0]?.text ?? "null");
const body = (m) => m.body ?? m.content;

async function call(client, [name, args]) {
  const r = await client.callTool({ name, arguments: args });
  if (r.isError) fail(`${name} failed: ${JSON.stringify(r.content)}`);
  return result(r);
}

/// A stdio agent: the SDK spawns `crosstalk mcp` and talks JSON-RPC over its pipes.
async function stdioAgent(name) {
  const pushed = [];
  const client = new Client({ name, version: "0" }, { capabilities: {} });
  client.fallbackNotificationHandler = async (n) => {
    if (n.method === "notifications/claude/channel") pushed.push(n.params);
  };
  const args = ["mcp", "--relay", base];
  if (cc) args.push("--tools", "cross-claude");
  const transport = new StdioClientTransport({ command: bin, args, stderr: "inherit", env: { PATH: process.env.PATH } });
  await client.connect(transport);
  const caps = client.getServerCapabilities();
  check(caps?.experimental?.["claude/channel"] !== undefined, `${name}: the bridge declares claude/channel`, caps);
  return { client, pushed };
}

async function httpAgent(name) {
  const client = new Client({ name, version: "0" }, { capabilities: {} });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${base}${cc ? "/cc/mcp" : "/mcp"}`)));
  return client;
}

async function until(cond, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return true;
    await sleep(20);
  }
  return cond();
}

async function status(id) {
  const r = await (await fetch(`${base}/api/instances`)).json();
  const list = r.instances ?? r;
  return list.find((i) => i.instance_id === id)?.status;
}

await relay.start();
const channel = `stdio-${toolSet}`;
const a = await stdioAgent("stdio-a");
const b = await httpAgent("http-b");
await call(a.client, ["register", { instance_id: "stdio-a" }]);
await call(b, ["register", { instance_id: "http-b" }]);
const { tools } = await a.client.listTools();
const names = tools.map((t) => t.name);
check(
  names.includes(cc ? "send_message" : "post_message") && names.includes("listen_live") && names.includes("delivery_status"),
  `tools/list through the bridge has the relay's tools and listen_live (${names.length})`,
  names,
);

// The conversation: the HTTP agent waits, the stdio agent posts, and the other way round.
const first = await call(a.client, post(channel, "stdio-a", "hello from stdio"));
const bWaits = call(b, wait(channel, first.id, 10));
await sleep(300);
const second = await call(a.client, post(channel, "stdio-a", "are you there?"));
const woke = await bWaits;
check(woke.messages?.[0]?.id === second.id, "the HTTP agent's wait is woken by the stdio agent's post", woke);
const aWaits = call(a.client, wait(channel, second.id, 10));
await sleep(300);
const answer = await call(b, post(channel, "http-b", "yes, here"));
const aWoke = await aWaits;
check(aWoke.messages?.[0]?.id === answer.id, "the stdio agent's wait is woken by the HTTP agent's post", aWoke);

// Live push.
await call(a.client, ["listen_live", { channel }]);
const pushedBefore = a.pushed.length;
const live = await call(b, post(channel, "http-b", "pushed to you"));
check(
  await until(() => a.pushed.length > pushedBefore, 5000) &&
    a.pushed.at(-1).content === "pushed to you" &&
    a.pushed.at(-1).meta.message_id === String(live.id),
  "listen_live: the HTTP agent's post arrives as notifications/claude/channel",
  a.pushed,
);
await call(a.client, post(channel, "stdio-a", "my own post"));
await sleep(500);
check(a.pushed.length === pushedBefore + 1, "its own post is not pushed back", a.pushed);

// Kill and restart the relay mid-stream: the next post still arrives, once.
await relay.stop("SIGKILL");
ok("relay SIGKILLed");
await relay.start();
ok("relay restarted on the same store");
const r = await fetch(`${base}/api/channels/${channel}/messages`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ sender: "rest-c", body: "after the restart" }),
});
const afterRestart = await r.json();
check(
  await until(() => a.pushed.some((p) => p.content === "after the restart"), 15000),
  "the post after the restart is pushed",
  a.pushed,
);
await sleep(1000);
check(
  a.pushed.filter((p) => p.meta.message_id === String(afterRestart.id)).length === 1 &&
    a.pushed.filter((p) => p.content === "pushed to you").length === 1,
  "each message pushed exactly once across the restart",
  a.pushed,
);
const again = await call(a.client, post(channel, "stdio-a", "still talking after the restart"));
check(again.id > afterRestart.id, "the stdio agent's tools work after the relay restart", again);
// The bridge claims its identity again for the session rmcp re-created.
await call(a.client, ["list_channels", {}]);
const st = await call(a.client, ["delivery_status", {}]);
check(st.pushed?.[0]?.connected === true && st.pushed[0].channel === channel, "delivery_status: pushed and connected", st);

// Presence follows the process: a fresh stdio agent registers, the host closes it.
const c = await stdioAgent("stdio-c");
await call(c.client, ["register", { instance_id: "stdio-c" }]);
check((await status("stdio-c")) === "online", "stdio-c is online", await status("stdio-c"));
await c.client.close();
check(
  await untilAsync(async () => (await status("stdio-c")) === "offline", 3000),
  "closing its stdin marks it offline at once",
  await status("stdio-c"),
);

async function untilAsync(cond, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await cond()) return true;
    await sleep(50);
  }
  return cond();
}

check((await status("stdio-a")) === "online", "stdio-a is online after the restart", await status("stdio-a"));
await Promise.all([a.client.close(), b.close()]);
check(
  await untilAsync(async () => (await status("stdio-a")) === "offline", 3000),
  "after a relay restart, closing the bridge still marks its identity offline at once",
  await status("stdio-a"),
);
await relay.done();
