// MCP tasks held by clients we did not write, against a relay of this script's own (it
// restarts it), with the tool-call cap at its default 55 s:
//  - the TypeScript SDK 1.x's experimental tasks client (@modelcontextprotocol/sdk, 2025-11-25:
//    params.task, tasks/get, tasks/result, tasks/cancel, notifications/tasks/status);
//  - @modelcontextprotocol/ext-tasks over @modelcontextprotocol/client 2.x on 2026-07-28 (the
//    tasks extension: tasks/get with the result inline, tasks/cancel, resumeTask), and a
//    subscriptions/listen naming the task, which must carry notifications/tasks.
// Each: a wait answered after 57 s (longer than any tool call here lasts), a cancel, and a
// task that is still waiting when the relay restarts and is answered after it.
//
//   node tasks.mjs /path/to/crosstalk
//
// Prints one line per check; exits 1 on the first failure, and by itself after 150 s. With
// CROSSTALK_TASKS_CAP_S=N the relay's tool-call cap is N s instead (--mcp-wait-cap-secs) and the
// long wait N + 2 s: the cluster rerun of scripts/mcp-interop checks the same on a node without
// a minute of waiting.

import { harness, sleep } from "./harness.mjs";
import { Client as ClientV1 } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport as TransportV1 } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema, TaskStatusNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient, resultFromTaskOutcome } from "@modelcontextprotocol/ext-tasks/client";

const [bin] = process.argv.slice(2);
const { base, fail, ok, check, ...relay } = await harness(bin, "tasks", 150_000);
const CAP_S = Number(process.env.CROSSTALK_TASKS_CAP_S ?? 55);
const CAP = process.env.CROSSTALK_TASKS_CAP_S ? ["--mcp-wait-cap-secs", String(CAP_S)] : [];
await relay.start(CAP);
const MODERN = "2026-07-28";
const LONG_MS = (CAP_S + 2) * 1000;
const LATE = `after ${CAP_S + 2} s`;
const url = `${base}/mcp`;

/// Posts over REST as `sender`.
async function post(channel, sender, body) {
  const r = await fetch(`${base}/api/channels/${channel}/messages`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ sender, body }),
  });
  if (!r.ok) fail(`post to ${channel}: ${r.status} ${await r.text()}`);
  return r.json();
}

/// The first JSON-RPC message with `id` (or any, without) in a JSON or event-stream answer.
async function answerOf(r, id) {
  const text = await r.text();
  if (!(r.headers.get("content-type") ?? "").startsWith("text/event-stream")) return JSON.parse(text);
  for (const line of text.split("\n")) {
    if (!line.startsWith("data:") || !line.slice(5).trim()) continue;
    const m = JSON.parse(line.slice(5));
    if (m.id === id) return m;
  }
  fail(`no answer to ${id} in ${text}`);
}

let rawId = 1_000;
/// ext-tasks' raw path for 2026-07-28 task requests: it frames `_meta` itself; this adds the
/// JSON-RPC envelope and the SEP-2243 headers, and posts.
async function rawDispatch(request, options = {}) {
  const id = rawId++;
  const params = request.params ?? {};
  const headers = {
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "mcp-protocol-version": MODERN,
    "mcp-method": request.method,
  };
  const name = params.name ?? params.taskId;
  if (name) headers["mcp-name"] = name;
  // ext-tasks names the headers it routes by itself (Mcp-Name for tasks/*): its spelling wins.
  for (const [k, v] of Object.entries(options.context?.headers ?? {})) headers[k.toLowerCase()] = v;
  const r = await fetch(url, {
    method: "POST",
    headers,
    body: JSON.stringify({ jsonrpc: "2.0", id, ...request }),
    signal: options.signal,
  });
  const m = await answerOf(r, id);
  return m.error ? { kind: "error", error: m.error } : { kind: "result", result: m.result };
}

const clientInfo = { name: "ext-tasks-check", version: "0" };
async function modernSession() {
  const client = new ClientV2(clientInfo, { capabilities: {}, versionNegotiation: { mode: { pin: MODERN } } });
  await client.connect(new TransportV2(new URL(url)));
  check(client.getProtocolEra() === "modern", "client 2.x speaks 2026-07-28 to the relay", client.getProtocolEra());
  return createTaskSessionFromClient(client, {
    endpointId: "crosstalk-relay",
    rawDispatch,
    v2RequestFraming: { protocolVersion: MODERN, clientInfo, clientCapabilities: {} },
  });
}

async function legacyClient(name) {
  const client = new ClientV1({ name, version: "0" }, { capabilities: { tasks: {} } });
  await client.connect(new TransportV1(new URL(url)));
  return client;
}

const first = (r) => r?.structuredContent?.messages?.[0]?.body;

/// Opens subscriptions/listen for `taskIds` (2026-07-28) and resolves with the first
/// notifications/tasks it carries.
async function listenFor(taskIds) {
  const id = rawId++;
  const controller = new AbortController();
  const r = await fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": MODERN,
      "mcp-method": "subscriptions/listen",
    },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id,
      method: "subscriptions/listen",
      params: {
        notifications: { taskIds },
        _meta: {
          "io.modelcontextprotocol/protocolVersion": MODERN,
          "io.modelcontextprotocol/clientInfo": clientInfo,
          "io.modelcontextprotocol/clientCapabilities": { extensions: { "io.modelcontextprotocol/tasks": {} } },
        },
      },
    }),
    signal: controller.signal,
  });
  if (!r.ok) fail(`subscriptions/listen: ${r.status}`);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  const told = (async () => {
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return null;
      buffer += decoder.decode(value, { stream: true });
      for (let at; (at = buffer.indexOf("\n")) >= 0; ) {
        const line = buffer.slice(0, at);
        buffer = buffer.slice(at + 1);
        if (!line.startsWith("data:") || !line.slice(5).trim()) continue;
        const m = JSON.parse(line.slice(5));
        if (m.method === "notifications/tasks") return m;
      }
    }
  })();
  return { told, close: () => controller.abort() };
}

// ---- both generations' long waits, at once

const started = Date.now();
const v1 = await legacyClient("tasks-v1");
const v1Told = new Promise((resolve) => {
  v1.setNotificationHandler(TaskStatusNotificationSchema, (n) => {
    if (n.params.status === "completed") resolve(n.params);
  });
});
await v1.listTools(); // the SDK learns which tools run as tasks
const v1Long = (async () => {
  const events = [];
  for await (const m of v1.experimental.tasks.callToolStream(
    { name: "wait_for_message", arguments: { channel: "long-v1", timeout_s: 120 } },
    CallToolResultSchema,
    { task: { ttl: 600_000 }, timeout: 150_000 },
  )) {
    events.push(m);
    if (m.type === "result" || m.type === "error") break;
  }
  return events;
})();

const modern = await modernSession();
const v2Long = await modern.callTool("wait_for_message", { channel: "long-v2", timeout_s: 120 }, { requestTimeoutMs: 150_000 });
check(v2Long.kind === "task", "ext-tasks: wait_for_message became a task", v2Long.kind);
const listened = await listenFor([v2Long.handle.taskId]);

// Cancels, meanwhile.
{
  const stream = v1.experimental.tasks.callToolStream(
    { name: "wait_for_message", arguments: { channel: "cancel-v1", timeout_s: 120 } },
    CallToolResultSchema,
    { task: {} },
  );
  let seen = [];
  for await (const m of stream) {
    seen.push(m.type);
    if (m.type === "taskCreated") await v1.experimental.tasks.cancelTask(m.task.taskId);
    if (m.type === "error" || m.type === "result") {
      check(m.type === "error" && /cancelled/.test(m.error.message), "SDK 1.x: a cancelled task ends its stream as cancelled", { seen, error: m.error?.message });
      break;
    }
  }
  const cancelled = await modern.callTool("wait_for_message", { channel: "cancel-v2", timeout_s: 120 });
  await cancelled.cancel();
  const { outcome } = await cancelled.settle();
  check(outcome.status === "cancelled", "ext-tasks: a cancelled task settles as cancelled", outcome.status);
}

await sleep(Math.max(0, LONG_MS - (Date.now() - started)));
await post("long-v1", "bob", `${LATE}, for v1`);
await post("long-v2", "bob", `${LATE}, for v2`);
const events = await v1Long;
const done = events.at(-1);
const waited = (Date.now() - started) / 1000;
check(done.type === "result" && first(done.result) === `${LATE}, for v1`, `SDK 1.x: the task's result came after ${waited.toFixed(0)} s`, events.map((e) => e.type));
check(events.some((e) => e.type === "taskStatus" && e.task.status === "working"), "SDK 1.x: it polled a working task", null);
const note = await Promise.race([v1Told, sleep(5000).then(() => null)]);
check(note?.status === "completed", "SDK 1.x: notifications/tasks/status said completed", note);
const { outcome } = await v2Long.settle();
check(outcome.status === "completed" && first(resultFromTaskOutcome(outcome)) === `${LATE}, for v2`, "ext-tasks: the task completed with the message", outcome);
const toldV2 = await Promise.race([listened.told, sleep(5000).then(() => null)]);
check(toldV2?.params?.status === "completed" && first(toldV2.params.result) === `${LATE}, for v2`, "2026-07-28: subscriptions/listen carried notifications/tasks", toldV2);
listened.close();
check(waited > CAP_S, `both waits outlived the ${CAP_S} s tool-call cap (${waited.toFixed(0)} s)`, waited);

// ---- a relay restart while tasks wait

const v1Restart = await v1.experimental.tasks.callToolStream(
  { name: "wait_for_message", arguments: { channel: "restart-v1", timeout_s: 60 } },
  CallToolResultSchema,
  { task: {} },
)[Symbol.asyncIterator]().next();
const restartV1 = v1Restart.value.task.taskId;
const v2Restart = await modern.callTool("wait_for_message", { channel: "restart-v2", timeout_s: 60 });
const restartV2 = v2Restart.handle.taskId;
await v2Restart.detach();
await relay.stop("SIGTERM");
await relay.start(CAP);
ok("restarted the relay with both tasks waiting");

const v1b = await legacyClient("tasks-v1-again");
const before = await v1b.experimental.tasks.getTask(restartV1);
check(before.status === "working", "SDK 1.x: after the restart the task is still working", before);
await post("restart-v1", "bob", "after the restart, for v1");
let after;
for (let i = 0; i < 50; i++) {
  after = await v1b.experimental.tasks.getTask(restartV1);
  if (after.status !== "working") break;
  await sleep(200);
}
const result = await v1b.experimental.tasks.getTaskResult(restartV1, CallToolResultSchema);
check(after.status === "completed" && first(result) === "after the restart, for v1", "SDK 1.x: answered after the restart", { after, result });

const modernAgain = await modernSession();
const resumed = await modernAgain.resumeTask({ endpointId: "crosstalk-relay", generation: "v2", taskId: restartV2, originalOperation: "tools/call" });
await post("restart-v2", "bob", "after the restart, for v2");
const { outcome: afterRestart } = await resumed.settle();
check(afterRestart.status === "completed" && first(resultFromTaskOutcome(afterRestart)) === "after the restart, for v2", "ext-tasks: resumeTask after the restart got the answer", afterRestart);

await Promise.allSettled([v1.close(), v1b.close(), modern.close(), modernAgain.close()]);
await relay.done();
