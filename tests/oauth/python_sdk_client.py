"""An OAuth client we did not write, driving a relay started with `--oauth`: the official Python
MCP SDK's `OAuthClientProvider` (mcp 2.x, the version scripts/mcp-interop installs).

Usage (see tests/oauth/README.md for every option):

    python_sdk_client.py connect --url http://127.0.0.1:PORT/mcp --invite CODE [options]
    python_sdk_client.py make-cert DIR

`connect` lets the SDK discover the relay's authorization server from the 401, register (dynamic
client registration, or with `--registration cimd` a Client ID Metadata Document this script
serves over HTTPS on 127.0.0.1), and send the person to the consent page. The redirect handler
plays the person: it GETs the page, fills the one text field of its form with the invite code
and POSTs the form, as a browser does when someone types the code and presses the button; the
relay's answer is a redirect to our redirect URI, whose `code`, `state` and `iss` the callback
handler gives back to the SDK, which checks `state` and `iss` and exchanges the code. Then the
script lists the tools, calls one, optionally forces a refresh (and a reuse of the spent refresh
token), and prints ONE JSON line on stdout: {"ok": true, ...} or {"ok": false, "error": ...}.
It exits 0 only when every check passed.

`make-cert DIR` writes a throwaway CA (DIR/ca.pem, for the relay's trust store) and a leaf
certificate for 127.0.0.1 and localhost signed by it (DIR/leaf.pem, DIR/leaf-key.pem, for the
metadata document's HTTPS server), and prints their paths as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import html.parser
import json
import logging
import os
import ssl
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

SDK = "python"


class Failed(Exception):
    """A check that did not hold; its message is the reason printed."""


# ---------------------------------------------------------------- the person at the consent page


class _FormParser(html.parser.HTMLParser):
    """The first <form> of a page: its method, action and inputs (name, type, value)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[dict[str, Any]] = []
        self._in_form = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k.lower(): (v or "") for k, v in attrs}
        if tag == "form":
            self.forms.append({"method": a.get("method", "get").lower(), "action": a.get("action", ""), "inputs": []})
            self._in_form = True
        elif tag == "input" and self._in_form:
            self.forms[-1]["inputs"].append((a.get("name", ""), a.get("type", "text").lower(), a.get("value", "")))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = False


def browser_headers(origin: str, *, post: bool) -> dict[str, str]:
    """What a browser sends on a top-level navigation (GET from another site's button) or on the
    submission of the relay's own form (same-origin POST)."""
    h = {
        "User-Agent": "Mozilla/5.0 (crosstalk oauth test driver)",
        "Accept": "text/html,application/xhtml+xml",
        "Sec-Fetch-Mode": "navigate",
        "Sec-Fetch-Dest": "document",
    }
    if post:
        h["Sec-Fetch-Site"] = "same-origin"
        h["Origin"] = origin
    else:
        # The authorization URL is opened from the host's page (claude.ai, chatgpt.com, ...).
        h["Sec-Fetch-Site"] = "cross-site"
    return h


class ConsentDriver:
    """Plays the person: opens the authorization URL, types the invite code, submits."""

    def __init__(self, invite: str, wrong_invite: str | None, redirect_uri: str):
        self.invite = invite
        self.wrong_invite = wrong_invite
        self.redirect_uri = redirect_uri
        self.result: AuthorizationCodeResult | None = None
        self.authorize_params: dict[str, str] = {}
        self.consent_pages = 0
        self.wrong_invite_status: int | None = None
        self.iss: str | None = None

    async def redirect_handler(self, authorization_url: str) -> None:
        self.consent_pages += 1
        self.authorize_params = {k: v[0] for k, v in parse_qs(urlsplit(authorization_url).query).items()}
        parts = urlsplit(authorization_url)
        origin = f"{parts.scheme}://{parts.netloc}"
        async with httpx2.AsyncClient(follow_redirects=False, timeout=15) as http:
            page = await http.get(authorization_url, headers=browser_headers(origin, post=False))
            if page.status_code != 200:
                raise Failed(f"consent page: HTTP {page.status_code}: {page.text[:300]}")
            if "text/html" not in page.headers.get("content-type", ""):
                raise Failed(f"consent page is not HTML: {page.headers.get('content-type')}")
            if self.wrong_invite is not None:
                wrong = await self._submit(http, authorization_url, page.text, self.wrong_invite, origin)
                self.wrong_invite_status = wrong.status_code
                if wrong.is_redirect:
                    raise Failed(f"a wrong invite code was accepted: {wrong.headers.get('location')}")
                # The answer to a wrong code is the form again, with a message.
                page = wrong
            answer = await self._submit(http, authorization_url, page.text, self.invite, origin)
        if answer.status_code not in (302, 303):
            raise Failed(f"submitting the invite code: HTTP {answer.status_code}: {answer.text[:300]}")
        location = answer.headers.get("location", "")
        if not location.startswith(self.redirect_uri.split("?")[0]):
            raise Failed(f"redirected to {location!r}, not to the redirect URI {self.redirect_uri!r}")
        query = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
        if "error" in query:
            raise Failed(f"authorization error: {query}")
        if "code" not in query:
            raise Failed(f"no code in the redirect: {location}")
        self.iss = query.get("iss")
        self.result = AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))

    async def _submit(self, http: httpx2.AsyncClient, page_url: str, page: str, code: str, origin: str):
        parser = _FormParser()
        parser.feed(page)
        if not parser.forms:
            raise Failed("the consent page has no <form>")
        form = parser.forms[0]
        if form["method"] != "post":
            raise Failed(f"the consent form's method is {form['method']!r}, not post")
        fields: list[tuple[str, str]] = []
        typed = False
        for name, kind, value in form["inputs"]:
            if not name:
                continue
            if kind in ("text", "password", "") and not typed:
                fields.append((name, code))  # the one field a person types into
                typed = True
            elif kind in ("hidden", "text", "password"):
                fields.append((name, value))
        if not typed:
            raise Failed("the consent form has no text field for the invite code")
        action = urljoin(page_url, form["action"] or page_url)
        headers = browser_headers(origin, post=True)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        return await http.post(action, content=urlencode(fields), headers=headers)

    async def callback_handler(self) -> AuthorizationCodeResult:
        if self.result is None:
            raise Failed("the callback came before the consent page was submitted")
        result, self.result = self.result, None
        return result


# ---------------------------------------------------------------- storage, metadata document


class MemoryStorage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None
        self.token_history: list[OAuthToken] = []

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.token_history.append(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class MetadataDocumentServer:
    """Serves a Client ID Metadata Document at https://127.0.0.1:PORT/oauth/client.json and counts
    the relay's fetches of it."""

    def __init__(self, cert: str, key: str, client_name: str, redirect_uri: str):
        self.fetches = 0
        self.user_agents: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path != "/oauth/client.json":
                    self.send_error(404)
                    return
                outer.fetches += 1
                outer.user_agents.append(self.headers.get("User-Agent", ""))
                body = json.dumps(outer.document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "max-age=300")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}/oauth/client.json"
        self.document = {
            "client_id": self.url,
            "client_name": client_name,
            "client_uri": f"https://127.0.0.1:{self.httpd.server_address[1]}/",
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
            "application_type": "native",
        }
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


# ---------------------------------------------------------------- the run


def structured(result: Any) -> Any:
    if result.structured_content is not None:
        return result.structured_content
    texts = [getattr(c, "text", None) for c in result.content or []]
    return "\n".join(t for t in texts if t)


async def raw_post(url: str, data: dict[str, str]) -> tuple[int, Any]:
    async with httpx2.AsyncClient(timeout=15) as http:
        r = await http.post(url, data=data, headers={"Accept": "application/json"})
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text[:300]


async def mcp_status_with(url: str, access_token: str) -> int:
    """The status of a bare MCP initialize sent with `access_token`, outside the SDK."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
    }
    async with httpx2.AsyncClient(timeout=15) as http:
        r = await http.post(
            url,
            json=body,
            headers={"Authorization": f"Bearer {access_token}", "Accept": "application/json, text/event-stream"},
        )
        return r.status_code


async def run(args: argparse.Namespace, out: dict[str, Any]) -> dict[str, Any]:
    out.update({"sdk": SDK, "sdk_version": _version(), "registration": args.registration, "url": args.url})
    redirect_uri = args.redirect_uri or f"http://127.0.0.1:{args.redirect_port}/callback"
    consent = ConsentDriver(args.invite, args.wrong_invite, redirect_uri)
    storage = MemoryStorage()
    doc_server: MetadataDocumentServer | None = None
    client_metadata_url = None
    if args.registration == "cimd":
        if not (args.cimd_cert and args.cimd_key):
            raise Failed("--registration cimd needs --cimd-cert and --cimd-key (see make-cert)")
        doc_server = MetadataDocumentServer(args.cimd_cert, args.cimd_key, args.client_name, redirect_uri)
        client_metadata_url = doc_server.url
    metadata = OAuthClientMetadata(
        client_name=args.client_name,
        redirect_uris=[redirect_uri],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
    )
    provider = OAuthClientProvider(
        server_url=args.url,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=consent.redirect_handler,
        callback_handler=consent.callback_handler,
        client_metadata_url=client_metadata_url,
    )
    http = httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30, read=300), follow_redirects=False)
    try:
        async with http, Client(streamable_http_client(args.url, http_client=http), mode=args.mode) as client:
            ctx = provider.context
            out["protocol_version"] = client.protocol_version
            out["client_id"] = storage.client_info.client_id if storage.client_info else None
            out["issuer"] = str(ctx.oauth_metadata.issuer) if ctx.oauth_metadata else None
            out["iss"] = consent.iss
            out["resource_metadata"] = ctx.protected_resource_metadata.model_dump(mode="json", exclude_none=True) if ctx.protected_resource_metadata else None
            out["authorization_server_metadata"] = ctx.oauth_metadata.model_dump(mode="json", exclude_none=True) if ctx.oauth_metadata else None
            out["authorize_params"] = {k: v for k, v in consent.authorize_params.items() if k != "code_challenge"}
            out["consent_pages"] = consent.consent_pages
            if args.wrong_invite is not None:
                out["wrong_invite_status"] = consent.wrong_invite_status
            first = storage.tokens
            if first is None:
                raise Failed("connected without tokens")
            out["token"] = {
                "token_type": first.token_type,
                "expires_in": first.expires_in,
                "scope": first.scope,
                "has_refresh_token": first.refresh_token is not None,
            }
            if args.registration == "cimd":
                out["cimd_fetches"] = doc_server.fetches if doc_server else 0
                if out["client_id"] != client_metadata_url:
                    raise Failed(f"the SDK used client_id {out['client_id']!r}, not the metadata document URL (is client_id_metadata_document_supported advertised?)")
                if out["cimd_fetches"] == 0:
                    raise Failed("the relay never fetched the client metadata document")
            if consent.iss is None:
                raise Failed("the authorization response carried no iss (RFC 9207)")

            tools = [t.name for t in (await client.list_tools()).tools]
            out["tools"] = tools
            tool = args.tool or ("list_channels" if "list_channels" in tools else tools[0])
            result = await client.call_tool(tool, json.loads(args.args))
            out["tool"] = tool
            out["tool_is_error"] = bool(result.is_error)
            out["tool_result"] = structured(result)
            if result.is_error:
                raise Failed(f"{tool} failed: {out['tool_result']}")

            if args.refresh:
                old = storage.tokens
                ctx.token_expiry_time = time.time() - 1  # the SDK now refreshes before its next request
                again = await client.call_tool(tool, json.loads(args.args))
                new = storage.tokens
                refresh: dict[str, Any] = {
                    "refreshed": new is not old,
                    "access_token_changed": new.access_token != old.access_token,
                    "refresh_token_rotated": new.refresh_token is not None and new.refresh_token != old.refresh_token,
                    "call_after_refresh_ok": not again.is_error,
                }
                if not (refresh["refreshed"] and refresh["access_token_changed"] and refresh["call_after_refresh_ok"]):
                    raise Failed(f"refresh: {refresh}")
                if not refresh["refresh_token_rotated"]:
                    raise Failed("the refresh token was not rotated")
                refresh["old_access_token_status"] = await mcp_status_with(args.url, old.access_token)
                if args.check_reuse:
                    token_url = str(ctx.oauth_metadata.token_endpoint)
                    status, body = await raw_post(
                        token_url,
                        {"grant_type": "refresh_token", "refresh_token": old.refresh_token, "client_id": out["client_id"]},
                    )
                    refresh["reuse_status"] = status
                    refresh["reuse_error"] = body.get("error") if isinstance(body, dict) else body
                    if status != 400 or refresh["reuse_error"] != "invalid_grant":
                        raise Failed(f"reusing a rotated refresh token: HTTP {status} {body}")
                    # Reuse revokes the grant: the current access token stops working too.
                    refresh["current_access_token_status_after_reuse"] = await mcp_status_with(args.url, new.access_token)
                out["refresh"] = refresh
    finally:
        if doc_server:
            out["cimd_fetches"] = doc_server.fetches
            doc_server.close()
    out["ok"] = True
    return out


def _version() -> str:
    import importlib.metadata

    return importlib.metadata.version("mcp")


# ---------------------------------------------------------------- make-cert


def make_cert(directory: str) -> dict[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    import ipaddress

    os.makedirs(directory, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "crosstalk oauth test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {
        "ca": os.path.join(directory, "ca.pem"),
        "cert": os.path.join(directory, "leaf.pem"),
        "key": os.path.join(directory, "leaf-key.pem"),
    }
    with open(paths["ca"], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths["cert"], "wb") as f:
        f.write(leaf.public_bytes(serialization.Encoding.PEM))
    with open(paths["key"], "wb") as f:
        f.write(
            leaf_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return paths


# ---------------------------------------------------------------- command line


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("connect", help="run the whole flow against a relay")
    c.add_argument("--url", default=os.environ.get("CROSSTALK_MCP_URL"), help="the MCP endpoint, e.g. http://127.0.0.1:8765/mcp")
    c.add_argument("--invite", default=os.environ.get("CROSSTALK_INVITE"), help="the invite code to type (env CROSSTALK_INVITE)")
    c.add_argument("--wrong-invite", help="first type this code, which must be refused, then the right one")
    c.add_argument("--registration", choices=["dcr", "cimd"], default="dcr")
    c.add_argument("--cimd-cert", help="PEM certificate for the metadata document's HTTPS server (make-cert's leaf.pem)")
    c.add_argument("--cimd-key", help="its PEM key (make-cert's leaf-key.pem)")
    c.add_argument("--client-name", default="crosstalk oauth test (python sdk)")
    c.add_argument("--redirect-port", type=int, default=53682, help="port of the loopback redirect URI (nothing listens)")
    c.add_argument("--redirect-uri", help="use this redirect URI instead, e.g. https://claude.ai/api/mcp/auth_callback")
    c.add_argument("--mode", default="auto", help="the SDK's connect mode: auto (2026-07-28 discover) or legacy (initialize)")
    c.add_argument("--tool", help="the tool to call (default: list_channels)")
    c.add_argument("--args", default="{}", help="its arguments, as JSON")
    c.add_argument("--refresh", action="store_true", help="force a refresh and check the refresh token rotated")
    c.add_argument("--check-reuse", action="store_true", help="with --refresh: reuse the spent refresh token, expect invalid_grant")
    c.add_argument("--timeout", type=float, default=60)
    m = sub.add_parser("make-cert", help="write a test CA and a 127.0.0.1 leaf certificate to DIR")
    m.add_argument("dir")
    args = p.parse_args(argv)
    if args.command == "connect" and (not args.url or not args.invite):
        p.error("connect needs --url and --invite (or CROSSTALK_MCP_URL and CROSSTALK_INVITE)")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if not os.environ.get("CROSSTALK_OAUTH_DEBUG"):
        # The SDK logs a traceback for every failed flow; the JSON line says why, once.
        logging.getLogger("mcp.client.auth").setLevel(logging.CRITICAL)
    if args.command == "make-cert":
        print(json.dumps(make_cert(args.dir)))
        return 0
    out: dict[str, Any] = {}  # what was collected, printed on failure too
    try:
        asyncio.run(asyncio.wait_for(run(args, out), timeout=args.timeout))
        print(json.dumps(out, default=str))
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported as one JSON line
        err = e
        # anyio task groups wrap the cause; show the innermost.
        while isinstance(err, BaseExceptionGroup) and err.exceptions:
            err = err.exceptions[0]
        print(json.dumps({**out, "ok": False, "sdk": SDK, "error": f"{type(err).__name__}: {err}"}, default=str))
        if os.environ.get("CROSSTALK_OAUTH_DEBUG"):
            traceback.print_exception(e)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
