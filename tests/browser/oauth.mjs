// OAuth as a person meets it: mcp-remote (a client we did not write) connects to a relay
// started with --oauth, gets the 401, registers, and opens the consent page in a browser —
// here Debian's Chromium, driven by playwright-core — where the invite from `crosstalk invite`
// is typed and Allow clicked; Chromium follows the relay's redirect to mcp-remote's own
// callback server, and mcp-remote finishes the flow by itself. Then an MCP client talks
// through mcp-remote's stdio: tools/list, a post as the invite's identity, a post as anyone
// else refused. Also: the page's wrong-code answer, seen in the browser.
//
//   node oauth.mjs /path/to/crosstalk

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, writeFileSync, chmodSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { harness, sleep } from "./harness.mjs";

const [bin] = process.argv.slice(2);
const ADMIN = "browser-oauth-admin";
const h = await harness(bin, "oauth in chromium", 150_000);
const { check, base } = h;
let browser;
h.onFail(() => browser?.close());

await h.start(["--oauth", "--token", ADMIN]);
const invite = (...args) =>
  execFileSync(bin, ["invite", "--relay", base, "--token", ADMIN, ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })
    .trim()
    .split("\n")
    .pop();
check(/^[0-9A-Z]{5}-[0-9A-Z]{5}$/.test(invite()), "crosstalk invite printed a code", "");

// The admin mints the invite in the console instead.
browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const context = await browser.newContext();
const consolePage = await context.newPage();
await consolePage.goto(`${base}/ui`);
await consolePage.locator("#login").waitFor({ timeout: 10_000 });
await consolePage.fill("#token", ADMIN);
await consolePage.press("#token", "Enter");
await consolePage.locator("#oauth").waitFor({ state: "visible", timeout: 10_000 });
await consolePage.fill("#invite-as", "browser-agent");
await consolePage.click("#invite-form button");
await consolePage.locator("#invite-code code").waitFor({ timeout: 10_000 });
const code = (await consolePage.textContent("#invite-code code")).trim();
check(/^[0-9A-Z]{5}-[0-9A-Z]{5}$/.test(code), "the console minted an invite", code);

// mcp-remote opens the browser with $BROWSER (through xdg-open): a script that notes the URL.
const work = mkdtempSync(join(tmpdir(), "crosstalk-oauth-browser-"));
const opened = join(work, "opened-url");
const fakeBrowser = join(work, "browser.sh");
writeFileSync(fakeBrowser, `#!/bin/sh\nprintf '%s\\n' "$1" >> '${opened}'\n`);
chmodSync(fakeBrowser, 0o755);

const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js");
const proxy = createRequire(import.meta.url).resolve("mcp-remote/dist/proxy.js");
const client = new Client({ name: "oauth-browser", version: "0" }, { capabilities: {} });
const transport = new StdioClientTransport({
  command: process.execPath,
  args: [proxy, `${base}/mcp`, "--transport", "http-only", "--allow-http"],
  env: {
    ...process.env,
    BROWSER: fakeBrowser,
    DISPLAY: "",
    MCP_REMOTE_CONFIG_DIR: join(work, "mcp-auth"),
  },
  stderr: "pipe",
});
let remoteLog = "";
transport.stderr?.on("data", (d) => (remoteLog += d));
h.onFail(() => console.error(remoteLog.slice(-3000)));
// connect() resolves once mcp-remote has authorized and relayed initialize.
const connected = client.connect(transport);

// The consent page, when mcp-remote asks for it.
let url;
for (let i = 0; i < 300 && !url; i++) {
  if (existsSync(opened)) url = readFileSync(opened, "utf8").trim().split("\n")[0];
  else await sleep(100);
}
check(url?.startsWith(`${base}/oauth/authorize?`), "mcp-remote opened the relay's consent page", url);

const page = await (await browser.newContext()).newPage();
await page.goto(url);
check((await page.locator("input[type=text]").count()) === 1, "the page has one text field", await page.content());
check((await page.textContent("h1")).includes("Connect"), "the page names the connection", await page.textContent("h1"));

// A wrong code: the same page again, saying so.
await page.fill("input[name=invite_code]", "AAAAA-AAAAA");
await page.click("button[type=submit]");
await page.locator("p.err").waitFor({ timeout: 10_000 });
const said = await page.textContent("p.err");
check(said.includes("not valid"), "a wrong code is refused on the page", said);

// The right one: Chromium follows the relay's 303 to mcp-remote's callback.
await page.fill("input[name=invite_code]", code.toLowerCase());
const callback = page.waitForURL((u) => u.hostname === "localhost" || u.hostname === "127.0.0.1", { timeout: 20_000 });
await page.click("button[type=submit]");
await callback;
const landed = new URL(page.url());
check(landed.searchParams.get("code")?.startsWith("ct_ac_"), "the browser reached mcp-remote's callback with a code", landed.pathname);
check(landed.searchParams.get("iss") === base, "the callback carries the issuer", landed.search);

await connected;
const { tools } = await client.listTools();
check(tools.some((t) => t.name === "post_message"), "tools/list through mcp-remote", tools.length);
const post = (sender) =>
  client.callTool({ name: "post_message", arguments: { channel: "oauth-browser", sender, body: `from ${sender}` } });
const mine = await post("browser-agent");
check(!mine.isError, "a post as the invite's identity", mine.content?.[0]?.text);
const other = await post("someone-else");
check(other.isError, "a post as anyone else is refused", other.content?.[0]?.text);

// The console lists the connection; its revoke button ends mcp-remote's token.
await consolePage.reload();
await consolePage.locator("#grants li").first().waitFor({ timeout: 10_000 });
const row = consolePage.locator("#grants li", { hasText: "as browser-agent" });
check((await row.count()) === 1, "the console lists the connection", await consolePage.textContent("#grants"));
await row.locator("button").click();
await consolePage.waitForFunction(() => !document.querySelector("#grants").textContent.includes("browser-agent"), null, { timeout: 10_000 });
const list = await (await fetch(`${base}/api/oauth/clients`, { headers: { Authorization: `Bearer ${ADMIN}` } })).json();
check(!list.clients.some((c) => c.as === "browser-agent"), "revoked from the console", list);
await browser.close();
browser = undefined;
// mcp-remote keeps its tokens in its config directory: the one it holds is refused now.
const tokenFile = readdirSync(join(work, "mcp-auth"), { recursive: true }).find((f) => String(f).endsWith("_tokens.json"));
check(tokenFile, "mcp-remote stored its tokens", readdirSync(join(work, "mcp-auth"), { recursive: true }));
const held = JSON.parse(readFileSync(join(work, "mcp-auth", String(tokenFile)), "utf8"));
const refused = await fetch(`${base}/api/channels`, { headers: { Authorization: `Bearer ${held.access_token}` } });
check(refused.status === 401, "after revocation its token is refused", refused.status);

await client.close().catch(() => {});
await h.done();
