// An OAuth client we did not write, driving a relay started with `--oauth`: the official
// TypeScript MCP SDK's auth (`@modelcontextprotocol/sdk` 1.x, or `@modelcontextprotocol/client`
// 2.x with --sdk v2), the versions scripts/mcp-interop installs under .venv-test/npm.
//
//   node ts_sdk_client.mjs --url http://127.0.0.1:PORT/mcp --invite CODE [options]
//
// ES modules resolve packages next to the script: copy it into the directory whose
// node_modules holds the SDKs (as scripts/mcp-interop does with tests/node/*.mjs) and run it
// there. Options are listed in tests/oauth/README.md and by --help.
//
// The SDK meets the relay's 401, discovers the authorization server, registers (dynamic client
// registration, or with --registration cimd a Client ID Metadata Document served here over
// HTTPS on 127.0.0.1) and calls redirectToAuthorization. This provider plays the person there:
// it GETs the consent page, types the invite code into the form's one text field and POSTs it;
// the relay's answer redirects to our redirect URI, whose code, state and iss are checked here
// and handed to transport.finishAuth, as a host does when its callback is hit. Then a second
// connection lists the tools and calls one; --refresh makes the SDK refresh (and --check-reuse
// replays the spent refresh token). Prints ONE JSON line on stdout; exits 0 only on success.

import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import https from "node:https";
import { parseArgs } from "node:util";

const HELP = `ts_sdk_client.mjs --url URL --invite CODE
  --sdk v1|v2              @modelcontextprotocol/sdk (default) or @modelcontextprotocol/client
  --wrong-invite CODE      type this first; it must be refused
  --registration dcr|cimd  how the client identifies itself (default dcr)
  --cimd-cert PEM --cimd-key PEM   TLS for the metadata document (python_sdk_client.py make-cert)
  --client-name NAME       --redirect-port N (default 53683)   --redirect-uri URI
  --tool NAME --args JSON  the tool to call (default list_channels, {})
  --refresh [--check-reuse]  force a refresh; replay the spent refresh token
  --timeout SECONDS        (default 60)
Env: CROSSTALK_MCP_URL, CROSSTALK_INVITE stand in for --url, --invite.`;

const { values: opt } = parseArgs({
  options: {
    url: { type: "string", default: process.env.CROSSTALK_MCP_URL },
    invite: { type: "string", default: process.env.CROSSTALK_INVITE },
    sdk: { type: "string", default: "v1" },
    "wrong-invite": { type: "string" },
    registration: { type: "string", default: "dcr" },
    "cimd-cert": { type: "string" },
    "cimd-key": { type: "string" },
    "client-name": { type: "string", default: "crosstalk oauth test (typescript sdk)" },
    "redirect-port": { type: "string", default: "53683" },
    "redirect-uri": { type: "string" },
    tool: { type: "string" },
    args: { type: "string", default: "{}" },
    refresh: { type: "boolean", default: false },
    "check-reuse": { type: "boolean", default: false },
    timeout: { type: "string", default: "60" },
    help: { type: "boolean", default: false },
  },
});
if (opt.help || !opt.url || !opt.invite) {
  console.error(HELP);
  process.exit(opt.help ? 0 : 2);
}

const out = { sdk: `typescript-${opt.sdk}`, registration: opt.registration, url: opt.url };
class Failed extends Error {}
function finish(code, extra) {
  console.log(JSON.stringify({ ...out, ...extra }));
  process.exit(code);
}
setTimeout(() => finish(1, { ok: false, error: `timed out after ${opt.timeout} s` }), Number(opt.timeout) * 1000).unref();

const lib =
  opt.sdk === "v2"
    ? await import("@modelcontextprotocol/client")
    : {
        ...(await import("@modelcontextprotocol/sdk/client/index.js")),
        ...(await import("@modelcontextprotocol/sdk/client/streamableHttp.js")),
        ...(await import("@modelcontextprotocol/sdk/client/auth.js")),
      };
const { Client, StreamableHTTPClientTransport, UnauthorizedError, auth } = lib;
out.sdk_version = await sdkVersion();

// ------------------------------------------------------------------ the person at the consent page

const unescapeHtml = (s) =>
  s.replace(/&(amp|lt|gt|quot|#39|#x27);/g, (_, e) => ({ amp: "&", lt: "<", gt: ">", quot: '"', "#39": "'", "#x27": "'" })[e]);

function attrs(tag) {
  const a = {};
  for (const m of tag.matchAll(/([a-zA-Z_:-]+)\s*(?:=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+)))?/g)) {
    a[m[1].toLowerCase()] = unescapeHtml(m[2] ?? m[3] ?? m[4] ?? "");
  }
  return a;
}

/** The first <form> of a page: method, action, inputs. */
function parseForm(page) {
  const form = page.match(/<form\b([^>]*)>([\s\S]*?)<\/form>/i);
  if (!form) throw new Failed("the consent page has no <form>");
  const fa = attrs(form[1]);
  const inputs = [...form[2].matchAll(/<input\b([^>]*)>/gi)].map((m) => attrs(m[1]));
  return { method: (fa.method ?? "get").toLowerCase(), action: fa.action ?? "", inputs };
}

function browserHeaders(origin, post) {
  const h = {
    "user-agent": "Mozilla/5.0 (crosstalk oauth test driver)",
    accept: "text/html,application/xhtml+xml",
    "sec-fetch-mode": "navigate",
    "sec-fetch-dest": "document",
    // The authorization URL is opened from the host's page; the form is the relay's own.
    "sec-fetch-site": post ? "same-origin" : "cross-site",
  };
  if (post) h.origin = origin;
  return h;
}

async function submit(pageUrl, page, code, origin) {
  const form = parseForm(page);
  if (form.method !== "post") throw new Failed(`the consent form's method is ${form.method}, not post`);
  const fields = new URLSearchParams();
  let typed = false;
  for (const i of form.inputs) {
    const type = (i.type ?? "text").toLowerCase();
    if (!i.name) continue;
    if ((type === "text" || type === "password") && !typed) {
      fields.append(i.name, code); // the one field a person types into
      typed = true;
    } else if (["hidden", "text", "password"].includes(type)) {
      fields.append(i.name, i.value ?? "");
    }
  }
  if (!typed) throw new Failed("the consent form has no text field for the invite code");
  return fetch(new URL(form.action || pageUrl, pageUrl), {
    method: "POST",
    redirect: "manual",
    headers: { ...browserHeaders(origin, true), "content-type": "application/x-www-form-urlencoded" },
    body: fields.toString(),
  });
}

/** Opens the authorization URL, types the invite code, submits; returns the redirect's query. */
async function consent(authorizationUrl, redirectUri) {
  const origin = authorizationUrl.origin;
  const pageRes = await fetch(authorizationUrl, { redirect: "manual", headers: browserHeaders(origin, false) });
  let page = await pageRes.text();
  if (pageRes.status !== 200) throw new Failed(`consent page: HTTP ${pageRes.status}: ${page.slice(0, 300)}`);
  if (!(pageRes.headers.get("content-type") ?? "").includes("text/html")) throw new Failed("the consent page is not HTML");
  if (opt["wrong-invite"] !== undefined) {
    const wrong = await submit(authorizationUrl, page, opt["wrong-invite"], origin);
    out.wrong_invite_status = wrong.status;
    if (wrong.status >= 300 && wrong.status < 400) throw new Failed(`a wrong invite code was accepted: ${wrong.headers.get("location")}`);
    page = await wrong.text(); // the form again, with a message
  }
  const answer = await submit(authorizationUrl, page, opt.invite, origin);
  if (answer.status !== 302 && answer.status !== 303) {
    throw new Failed(`submitting the invite code: HTTP ${answer.status}: ${(await answer.text()).slice(0, 300)}`);
  }
  const location = answer.headers.get("location") ?? "";
  if (!location.startsWith(redirectUri.split("?")[0])) throw new Failed(`redirected to ${location}, not to ${redirectUri}`);
  const params = new URL(location).searchParams;
  if (params.get("error")) throw new Failed(`authorization error: ${params}`);
  if (!params.get("code")) throw new Failed(`no code in the redirect: ${location}`);
  return params;
}

// ------------------------------------------------------------------ the provider

class TestProvider {
  constructor({ redirectUrl, clientMetadataUrl }) {
    this._redirectUrl = redirectUrl;
    if (clientMetadataUrl) this.clientMetadataUrl = clientMetadataUrl;
    this.callback = undefined;
    this.authorizeUrl = undefined;
    this.consentPages = 0;
    this.tokenHistory = [];
    this.invalidated = [];
    this._state = undefined;
  }
  get redirectUrl() {
    return this._redirectUrl;
  }
  get clientMetadata() {
    return {
      client_name: opt["client-name"],
      redirect_uris: [this._redirectUrl],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }
  state() {
    this._state = randomBytes(16).toString("hex");
    return this._state;
  }
  clientInformation() {
    return this._client;
  }
  saveClientInformation(info) {
    this._client = info;
  }
  tokens() {
    return this._tokens;
  }
  saveTokens(tokens) {
    this._tokens = tokens;
    this.tokenHistory.push(tokens);
  }
  async redirectToAuthorization(url) {
    this.consentPages += 1;
    this.authorizeUrl = url;
    this.callback = await consent(url, this._redirectUrl);
  }
  saveCodeVerifier(v) {
    this._verifier = v;
  }
  codeVerifier() {
    return this._verifier;
  }
  discoveryState() {
    return this._discovery;
  }
  saveDiscoveryState(s) {
    this._discovery = s;
  }
  invalidateCredentials(scope) {
    this.invalidated.push(scope);
    if (scope === "all" || scope === "client") this._client = undefined;
    if (scope === "all" || scope === "tokens") this._tokens = undefined;
  }
}

// ------------------------------------------------------------------ the metadata document

function serveMetadataDocument(redirectUri) {
  if (!opt["cimd-cert"] || !opt["cimd-key"]) throw new Failed("--registration cimd needs --cimd-cert and --cimd-key");
  const doc = { fetches: 0 };
  const server = https.createServer({ cert: readFileSync(opt["cimd-cert"]), key: readFileSync(opt["cimd-key"]) }, (req, res) => {
    if (req.url !== "/oauth/client.json") {
      res.writeHead(404).end();
      return;
    }
    doc.fetches += 1;
    const body = JSON.stringify(doc.document);
    res.writeHead(200, { "content-type": "application/json", "cache-control": "max-age=300" }).end(body);
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      doc.url = `https://127.0.0.1:${port}/oauth/client.json`;
      doc.document = {
        client_id: doc.url,
        client_name: opt["client-name"],
        redirect_uris: [redirectUri],
        grant_types: ["authorization_code", "refresh_token"],
        response_types: ["code"],
        token_endpoint_auth_method: "none",
        application_type: "native",
      };
      doc.close = () => server.close();
      server.unref();
      resolve(doc);
    }),
  );
}

// ------------------------------------------------------------------ the run

async function sdkVersion() {
  const { createRequire } = await import("node:module");
  const require = createRequire(import.meta.url);
  const name = opt.sdk === "v2" ? "@modelcontextprotocol/client" : "@modelcontextprotocol/sdk";
  const entry = opt.sdk === "v2" ? name : `${name}/client/index.js`; // 1.x exports no "."
  try {
    const { readFileSync: read } = await import("node:fs");
    const { dirname, join } = await import("node:path");
    let dir = dirname(require.resolve(entry));
    for (let i = 0; i < 6; i++, dir = dirname(dir)) {
      try {
        const pkg = JSON.parse(read(join(dir, "package.json"), "utf8"));
        if (pkg.name === name) return pkg.version;
      } catch {}
    }
  } catch {}
  return "unknown";
}

function newTransport(provider) {
  return new StreamableHTTPClientTransport(new URL(opt.url), { authProvider: provider });
}

async function connectClient(provider) {
  const client = new Client({ name: "crosstalk-oauth-test", version: "0" }, { capabilities: {} });
  await client.connect(newTransport(provider));
  return client;
}

async function mcpStatusWith(accessToken) {
  const r = await fetch(opt.url, {
    method: "POST",
    headers: { authorization: `Bearer ${accessToken}`, "content-type": "application/json", accept: "application/json, text/event-stream" },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method: "initialize",
      params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "probe", version: "0" } },
    }),
  });
  await r.body?.cancel();
  return r.status;
}

const structured = (r) => r.structuredContent ?? (r.content ?? []).map((c) => c.text).filter(Boolean).join("\n");

async function run() {
  const redirectUri = opt["redirect-uri"] ?? `http://127.0.0.1:${opt["redirect-port"]}/callback`;
  let doc;
  if (opt.registration === "cimd") doc = await serveMetadataDocument(redirectUri);
  else if (opt.registration !== "dcr") throw new Failed(`--registration ${opt.registration}: dcr or cimd`);
  const provider = new TestProvider({ redirectUrl: redirectUri, clientMetadataUrl: doc?.url });
  try {
    // 1. The first connection meets the 401; the SDK discovers, registers and sends the person
    //    to the consent page (redirectToAuthorization), then gives up with UnauthorizedError.
    const first = new Client({ name: "crosstalk-oauth-test", version: "0" }, { capabilities: {} });
    const transport = newTransport(provider);
    let connectedWithoutAuth = false;
    try {
      await first.connect(transport);
      connectedWithoutAuth = true;
    } catch (e) {
      if (!(e instanceof UnauthorizedError)) throw e;
    }
    if (connectedWithoutAuth) throw new Failed("connected without authorization: is the relay running with --oauth?");
    if (!provider.callback) throw new Failed("the SDK never sent the person to the consent page");
    const cb = provider.callback;
    const discovery = provider.discoveryState() ?? {};
    const asm = discovery.authorizationServerMetadata;
    out.issuer = asm?.issuer;
    out.iss = cb.get("iss");
    out.resource_metadata = discovery.resourceMetadata;
    out.authorization_server_metadata = asm;
    out.authorize_params = Object.fromEntries([...provider.authorizeUrl.searchParams].filter(([k]) => k !== "code_challenge"));
    out.consent_pages = provider.consentPages;
    // What the host checks before it spends the code (RFC 6749 state, RFC 9207 iss); 1.x does
    // not check iss itself, 2.x does in finishAuth.
    if (cb.get("state") !== provider._state) throw new Failed(`state mismatch: ${cb.get("state")} != ${provider._state}`);
    if (!out.iss) throw new Failed("the authorization response carried no iss (RFC 9207)");
    if (out.iss !== out.issuer) throw new Failed(`iss ${out.iss} is not the issuer ${out.issuer}`);
    // 2. The callback: exchange the code.
    if (opt.sdk === "v2") await transport.finishAuth(cb);
    else await transport.finishAuth(cb.get("code"));
    await first.close().catch(() => {});
    out.client_id = provider.clientInformation()?.client_id;
    const tokens = provider.tokens();
    if (!tokens?.access_token) throw new Failed("no tokens after finishAuth");
    out.token = {
      token_type: tokens.token_type,
      expires_in: tokens.expires_in,
      scope: tokens.scope,
      has_refresh_token: !!tokens.refresh_token,
    };
    if (doc) {
      out.cimd_fetches = doc.fetches;
      if (out.client_id !== doc.url) throw new Failed(`the SDK used client_id ${out.client_id}, not the metadata document URL`);
      if (doc.fetches === 0) throw new Failed("the relay never fetched the client metadata document");
    }
    // 3. A connection with the token: list the tools and call one.
    const client = await connectClient(provider);
    out.protocol_version = client.transport?.protocolVersion;
    const tools = (await client.listTools()).tools.map((t) => t.name);
    out.tools = tools;
    const tool = opt.tool ?? (tools.includes("list_channels") ? "list_channels" : tools[0]);
    const result = await client.callTool({ name: tool, arguments: JSON.parse(opt.args) });
    out.tool = tool;
    out.tool_is_error = !!result.isError;
    out.tool_result = structured(result);
    if (result.isError) throw new Failed(`${tool} failed: ${JSON.stringify(out.tool_result)}`);
    await client.close().catch(() => {});
    // 4. Refresh through the SDK (auth() with a refresh token refreshes), then use the new token.
    if (opt.refresh) {
      const old = provider.tokens();
      const r = await auth(provider, { serverUrl: new URL(opt.url) });
      const now = provider.tokens();
      const refresh = {
        result: r,
        access_token_changed: now.access_token !== old.access_token,
        refresh_token_rotated: !!now.refresh_token && now.refresh_token !== old.refresh_token,
      };
      const again = await connectClient(provider);
      const call = await again.callTool({ name: tool, arguments: JSON.parse(opt.args) });
      refresh.call_after_refresh_ok = !call.isError;
      await again.close().catch(() => {});
      if (r !== "AUTHORIZED" || !refresh.access_token_changed || !refresh.call_after_refresh_ok) {
        throw new Failed(`refresh: ${JSON.stringify(refresh)}`);
      }
      if (!refresh.refresh_token_rotated) throw new Failed("the refresh token was not rotated");
      refresh.old_access_token_status = await mcpStatusWith(old.access_token);
      if (opt["check-reuse"]) {
        const tokenUrl = provider.discoveryState().authorizationServerMetadata.token_endpoint;
        const res = await fetch(tokenUrl, {
          method: "POST",
          headers: { "content-type": "application/x-www-form-urlencoded", accept: "application/json" },
          body: new URLSearchParams({ grant_type: "refresh_token", refresh_token: old.refresh_token, client_id: out.client_id }),
        });
        const body = await res.json().catch(() => ({}));
        refresh.reuse_status = res.status;
        refresh.reuse_error = body.error;
        if (res.status !== 400 || body.error !== "invalid_grant") {
          throw new Failed(`reusing a rotated refresh token: HTTP ${res.status} ${JSON.stringify(body)}`);
        }
        refresh.current_access_token_status_after_reuse = await mcpStatusWith(now.access_token);
      }
      out.refresh = refresh;
    }
    if (provider.invalidated.length) out.invalidated = provider.invalidated;
  } finally {
    if (doc) {
      out.cimd_fetches = doc.fetches;
      doc.close();
    }
  }
}

try {
  await run();
  finish(0, { ok: true });
} catch (e) {
  if (process.env.CROSSTALK_OAUTH_DEBUG) console.error(e);
  finish(1, { ok: false, error: `${e?.name ?? "Error"}: ${e?.message ?? e}` });
}
