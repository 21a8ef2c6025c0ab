// A conversation over crosstalk held by the official TypeScript MCP SDK, a client we did not
// write: two agents on one channel, a wait woken by the other agent's post, a resource
// subscription notified by a post (2025-11-25 sessions), and a wait whose connection the test
// cuts mid-call, which the SDK resumes with Last-Event-ID and which still returns its answer.
//
//   node conversation.mjs v1|v2|v2-modern|mcp-remote http://127.0.0.1:PORT /mcp|/cc/mcp [TOKEN]
//
// v1 is @modelcontextprotocol/sdk 1.x, v2 is @modelcontextprotocol/client 2.x (a 2025-11-25
// session; v2-modern pins it to 2026-07-28: stateless requests, no resource subscriptions,
// what scripts/mcp-interop runs through the cluster example's load balancer); with
// mcp-remote, alice and carol talk over stdio to mcp-remote (spawned here, with the token as a
// header), which relays to the relay, and carol's mcp-remote is the one whose connection is
// cut; bob talks HTTP (SDK 1.x). Prints one line per check; exits 1 on the first failure, and
// by itself after 60 s.

import net from "node:net";

const [sdk, base, path, token] = process.argv.slice(2);
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const face = path.startsWith("/cc") ? "cc" : "ct";
setTimeout(() => fail("the conversation took longer than 60 s"), 60_000).unref();

function fail(why) {
  console.error(`FAIL [${sdk} ${path}] ${why}`);
  process.exit(1);
}
function ok(what) {
  console.log(`ok   [${sdk} ${path}] ${what}`);
}
function check(cond, what, detail) {
  if (!cond) fail(`${what}: ${JSON.stringify(detail)}`);
  ok(what);
}

const modern = sdk === "v2-modern";
const lib =
  !sdk.startsWith("v2")
    ? {
        ...(await import("@modelcontextprotocol/sdk/client/index.js")),
        ...(await import("@modelcontextprotocol/sdk/client/streamableHttp.js")),
      }
    : await import("@modelcontextprotocol/client");
const { Client, StreamableHTTPClientTransport } = lib;

// The two faces name the same operations differently.
const tools =
  face === "ct"
    ? {
        post: (channel, sender, text) => ["post_message", { channel, sender, body: text }],
        wait: (channel, after, s) => ["wait_for_message", { channel, since_id: after, timeout_s: s }],
        register: (id) => ["register", { instance_id: id }],
      }
    : {
        post: (channel, sender, text) => ["send_message", { channel, sender, content: text }],
        wait: (channel, after, s) => ["wait_for_reply", { channel, after_id: after, max_wait_minutes: s / 60 }],
        register: (id) => ["register", { instance_id: id }],
      };

const result = (r) => r.structuredContent ?? JSON.parse(r.content?.[0]?.text ?? "null");
const text = (m) => m.body ?? m.content;

async function connect(name, url = base + path) {
  const client = new Client(
    { name, version: "0" },
    modern ? { capabilities: {}, versionNegotiation: { mode: { pin: "2026-07-28" } } } : { capabilities: {} },
  );
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers },
    reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
  });
  await client.connect(transport);
  if (modern && client.getProtocolEra() !== "modern") fail(`${name} did not speak 2026-07-28: ${client.getProtocolEra()}`);
  return client;
}

async function call(client, [name, args], options) {
  const r = await client.callTool({ name, arguments: args }, undefined, options);
  if (r.isError) fail(`${name} failed: ${JSON.stringify(r.content)}`);
  return result(r);
}

/// alice over stdio through mcp-remote, which relays to the relay's streamable HTTP.
async function viaMcpRemote(url = base + path) {
  const { StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js");
  const { createRequire } = await import("node:module");
  const bin = createRequire(import.meta.url).resolve("mcp-remote/dist/proxy.js");
  const args = [bin, url, "--transport", "http-only", "--allow-http"];
  if (token) args.push("--header", `Authorization:Bearer ${token}`);
  const client = new Client({ name: "alice-stdio", version: "0" }, { capabilities: {} });
  await client.connect(new StdioClientTransport({ command: process.execPath, args, stderr: "ignore" }));
  return client;
}

const channel = `node-${sdk}-${face}-${Date.now()}`;
const alice = sdk === "mcp-remote" ? await viaMcpRemote() : await connect("alice");
const bob = await connect("bob");
await call(alice, tools.register(`alice-${sdk}-${face}`));
await call(bob, tools.register(`bob-${sdk}-${face}`));
const { tools: listed } = await alice.listTools();
check(listed.length >= 12, `tools/list has ${listed.length} tools`, listed.length);

// A wait woken by the other agent.
const first = await call(alice, tools.post(channel, `alice-${sdk}-${face}`, "hello bob"));
const waiting = call(bob, tools.wait(channel, first.id, 10));
await new Promise((r) => setTimeout(r, 300));
const started = Date.now();
const reply = await call(alice, tools.post(channel, `alice-${sdk}-${face}`, "are you there?"));
const woke = await waiting;
check(woke.messages?.[0]?.id === reply.id, `bob's wait woken by alice's post in ${Date.now() - started} ms`, woke);

// A resource subscription notified by a post (crosstalk's face, 2025-11-25 sessions).
if (face === "ct" && !modern && typeof bob.subscribeResource === "function") {
  const uri = `crosstalk://channels/${channel}`;
  const updated = new Promise((resolve) => {
    bob.fallbackNotificationHandler = async (n) => {
      if (n.method === "notifications/resources/updated" && n.params?.uri === uri) resolve(n);
    };
  });
  await bob.subscribeResource({ uri });
  await call(alice, tools.post(channel, `alice-${sdk}-${face}`, "for subscribers"));
  const note = await Promise.race([updated, new Promise((r) => setTimeout(() => r(null), 5000))]);
  check(note !== null, "a post notified bob's resource subscription", note);
}

// And the other way round: alice waits (through mcp-remote, if that is how she talks).
const mine = await call(bob, tools.post(channel, `bob-${sdk}-${face}`, "yes"));
const aliceWaits = call(alice, tools.wait(channel, mine.id, 10));
await new Promise((r) => setTimeout(r, 300));
const back = await call(bob, tools.post(channel, `bob-${sdk}-${face}`, "still here"));
const aliceWoke = await aliceWaits;
check(aliceWoke.messages?.[0]?.id === back.id, "alice's wait woken by bob's post", aliceWoke);
if (modern) {
  // A 2026-07-28 call cut mid-way is not resumed by the 2.x client (it has no session to
  // resume in): nothing more to check here.
  await Promise.all([alice.close(), bob.close()]);
  ok("conversation done");
  process.exit(0);
}

// A wait whose connection is cut mid-call: the SDK resumes with Last-Event-ID.
const target = new URL(base);
const sockets = new Set();
const proxy = net.createServer((inbound) => {
  const outbound = net.connect(Number(target.port), target.hostname);
  sockets.add(inbound);
  sockets.add(outbound);
  inbound.pipe(outbound).pipe(inbound);
  const drop = () => {
    inbound.destroy();
    outbound.destroy();
  };
  inbound.on("error", drop);
  outbound.on("error", drop);
});
await new Promise((r) => proxy.listen(0, "127.0.0.1", r));
const viaProxy = `http://127.0.0.1:${proxy.address().port}${path}`;
// With mcp-remote, carol talks stdio to mcp-remote, and mcp-remote's connection is cut.
const carol = sdk === "mcp-remote" ? await viaMcpRemote(viaProxy) : await connect("carol", viaProxy);
await call(carol, tools.register(`carol-${sdk}-${face}`));
const last = await call(alice, tools.post(channel, `alice-${sdk}-${face}`, "before the cut"));
let lastEventId;
const cutWait = call(carol, tools.wait(channel, last.id, 15), {
  resumptionToken: undefined,
  onresumptiontoken: (t) => (lastEventId = t),
});
await new Promise((r) => setTimeout(r, 500));
for (const s of sockets) s.destroy();
ok(`cut carol's connection mid-call (last event id ${lastEventId ?? "not reported"})`);
await new Promise((r) => setTimeout(r, 200));
const after = await call(alice, tools.post(channel, `alice-${sdk}-${face}`, "after the cut"));
const resumed = await cutWait;
check(
  resumed.messages?.[0]?.id === after.id && text(resumed.messages[0]) === "after the cut",
  "carol's wait returned the post made while her connection was cut",
  resumed,
);

// A resource subscription whose standalone stream (GET) is cut: the SDK reconnects it with
// Last-Event-ID, and an update sent while it was away still arrives (#34).
let dora;
if (face === "ct" && (sdk === "v1" || sdk === "v2")) {
  dora = await connect("dora", viaProxy);
  const uri = `crosstalk://channels/${channel}`;
  const seen = [];
  let notify = () => {};
  dora.fallbackNotificationHandler = async (n) => {
    if (n.method === "notifications/resources/updated" && n.params?.uri === uri) {
      seen.push(n);
      notify();
    }
  };
  const next = (ms) =>
    new Promise((resolve) => {
      const had = seen.length;
      notify = () => seen.length > had && resolve(true);
      setTimeout(() => resolve(seen.length > had), ms);
    });
  await dora.subscribeResource({ uri });
  await new Promise((r) => setTimeout(r, 300)); // the standalone stream is open
  // Cut once before the stream carried any notification (only its priming event), and once
  // after it had carried one.
  for (const when of ["before any notification", "after a notification"]) {
    if (when === "after a notification") {
      const arrived = next(5000);
      await call(alice, tools.post(channel, `alice-${sdk}-${face}`, "before dora's cut"));
      check(await arrived, "dora's subscription notified before the cut", seen.length);
    }
    for (const s of sockets) s.destroy();
    ok(`cut dora's standalone stream ${when}`);
    const arrived = next(8000);
    await call(alice, tools.post(channel, `alice-${sdk}-${face}`, `while dora was away (${when})`));
    check(await arrived, `the update sent while dora's stream was cut (${when}) arrived after it reconnected`, seen.length);
  }
}

await Promise.all([alice.close(), bob.close(), carol.close(), dora?.close()]);
proxy.close();
ok("conversation done");
process.exit(0);
