//! The OAuth face (`crosstalk serve --oauth`): the endpoints a hosted MCP client walks
//! through to connect — protected-resource metadata (RFC 9728), authorization-server metadata
//! (RFC 8414), dynamic client registration (RFC 7591), the consent page, where a person types
//! a single-use invite code, and the token and revocation endpoints — plus the admin's
//! `/api/oauth/*` routes that mint invites and list and revoke connections. The rules are
//! [`crate::ops::oauth`]'s; this file is HTTP and HTML. See docs/oauth.md.
//!
//! OAuth answers use RFC 6749's error shape (`{"error", "error_description"}`), not the
//! relay's. Nothing here logs a code, token or invite.

use crate::api;
use crate::http::routes::at;
use crate::http::Body;
use crate::ops::oauth::{self, ClientQuery, GrantList, InviteRequest, OAuth, OAuthError, Revoked, Tokens};
use crate::ops::Principal;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse, ResponseError};
use crosstalk_schema::oauth::{AuthCode, OAuthClient};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Failed invite codes allowed per client address, and relay-wide (every client behind one
/// proxy is one address), per [`GUESS_WINDOW`].
pub const GUESSES_PER_ADDRESS: usize = 5;
pub const GUESSES_PER_RELAY: usize = 30;
pub const GUESS_WINDOW: Duration = Duration::from_secs(60);
/// Client registrations per address and relay-wide, per [`GUESS_WINDOW`].
pub const REGISTRATIONS_PER_ADDRESS: usize = 10;
pub const REGISTRATIONS_PER_RELAY: usize = 100;
/// The largest registration request (RFC 7591 metadata), and the longest string in it: far
/// above what clients send (a few hundred bytes), and what keeps 10,000 registrations small.
pub const MAX_REGISTRATION_BYTES: usize = 8 * 1024;
pub const MAX_METADATA_STRING_BYTES: usize = 2000;
/// Metadata-document fetches a consent page may cause, per address and relay-wide.
pub const FETCHES_PER_ADDRESS: usize = 10;
pub const FETCHES_PER_RELAY: usize = 100;

/// A Client ID Metadata Document's size limit (CIMD draft §6.6: about 5 KB).
pub const CIMD_MAX_BYTES: usize = 5120;
/// How long fetching one may take, and how long a fetched one is trusted.
pub const CIMD_TIMEOUT: Duration = Duration::from_secs(5);
pub const CIMD_CACHE_MIN: Duration = Duration::from_secs(60);
pub const CIMD_CACHE_MAX: Duration = Duration::from_secs(24 * 3600);
pub const CIMD_CACHE_DEFAULT: Duration = Duration::from_secs(3600);
/// Metadata documents one node keeps.
pub const CIMD_CACHE_ENTRIES: usize = 1000;

/// Fetches and checks Client ID Metadata Documents: a client whose `client_id` is an HTTPS
/// URL publishes its metadata there, instead of registering. The fetch is bounded in time
/// and size, follows no redirect, and goes only to public addresses (a relay must not be
/// made to fetch from its own network), unless `allow_private` (tests).
pub struct Cimd {
    /// An extra trust root (tests: `--oauth-cimd-ca`).
    pub extra_root: Option<reqwest::Certificate>,
    pub allow_private: bool,
    cache: Mutex<HashMap<String, (OAuthClient, Instant)>>,
}

impl Cimd {
    pub fn new(extra_root: Option<reqwest::Certificate>, allow_private: bool) -> Self {
        Cimd {
            extra_root,
            allow_private,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `url`'s document is in the cache (no fetch needed).
    pub fn cached(&self, url: &str) -> bool {
        self.cache
            .lock()
            .get(url)
            .is_some_and(|(_, until)| Instant::now() < *until)
    }

    /// The client `url` describes, fetched (or from the cache) and checked.
    pub async fn client(&self, url: &str) -> Result<OAuthClient, String> {
        if let Some((c, until)) = self.cache.lock().get(url) {
            if Instant::now() < *until {
                return Ok(c.clone());
            }
        }
        let (client, ttl) = self.fetch(url).await?;
        let mut cache = self.cache.lock();
        if cache.len() >= CIMD_CACHE_ENTRIES {
            cache.retain(|_, (_, until)| Instant::now() < *until);
            // Still full of live entries: start over rather than grow (a fetch is cheap to redo).
            if cache.len() >= CIMD_CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(url.to_owned(), (client.clone(), Instant::now() + ttl));
        Ok(client)
    }

    async fn fetch(&self, url: &str) -> Result<(OAuthClient, Duration), String> {
        let u = cimd_url(url)?;
        let host = u.host_str().unwrap_or_default().to_owned();
        let http = crate::client::pinned(&u, self.allow_private, CIMD_TIMEOUT, self.extra_root.as_ref())
            .await
            .map_err(|e| e.message)?;
        let mut r = http
            .get(url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| format!("cannot fetch it: {}", crate::client::root(&e)))?;
        if r.status() != reqwest::StatusCode::OK {
            return Err(format!("it answered {} (a redirect is not followed)", r.status()));
        }
        let json_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .is_some_and(|t| t == "application/json" || (t.starts_with("application/") && t.ends_with("+json")));
        if !json_type {
            return Err("it is not served as application/json".into());
        }
        let max_age = r
            .headers()
            .get("cache-control")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.split(',')
                    .find_map(|d| d.trim().strip_prefix("max-age=")?.parse::<u64>().ok())
            })
            .map_or(CIMD_CACHE_DEFAULT, Duration::from_secs)
            .clamp(CIMD_CACHE_MIN, CIMD_CACHE_MAX);
        let mut body = Vec::new();
        while let Some(chunk) = r.chunk().await.map_err(|e| format!("reading it failed: {e}"))? {
            body.extend_from_slice(&chunk);
            if body.len() > CIMD_MAX_BYTES {
                return Err(format!("it is larger than {CIMD_MAX_BYTES} bytes"));
            }
        }
        let doc: Value = serde_json::from_slice(&body).map_err(|e| format!("it is not JSON: {e}"))?;
        Ok((cimd_client(url, &host, &doc)?, max_age))
    }
}

/// A `client_id` that names a metadata document: HTTPS, a path, no fragment, user or dot
/// segments, at most 2,000 bytes (CIMD draft §3).
fn cimd_url(url: &str) -> Result<reqwest::Url, String> {
    if url.len() > 2000 {
        return Err("the client_id URL is longer than 2,000 bytes".into());
    }
    let u = reqwest::Url::parse(url).map_err(|e| format!("the client_id is not a URL: {e}"))?;
    let dots = url
        .split(['?', '#'])
        .next()
        .unwrap_or("")
        .split('/')
        .skip(3)
        .any(|seg| seg == "." || seg == "..");
    if u.scheme() != "https"
        || u.path() == "/"
        || u.fragment().is_some()
        || !u.username().is_empty()
        || u.password().is_some()
        || dots
    {
        return Err("a client_id URL is https://, with a path, without a fragment, user or dot segments".into());
    }
    Ok(u)
}

/// The client a fetched document describes, checked as the authorization spec says.
fn cimd_client(url: &str, host: &str, doc: &Value) -> Result<OAuthClient, String> {
    if doc.get("client_id").and_then(Value::as_str) != Some(url) {
        return Err("its client_id is not the URL it was fetched from".into());
    }
    if doc.get("client_secret").is_some() || doc.get("client_secret_expires_at").is_some() {
        return Err("it has a client_secret (a metadata document describes a public client)".into());
    }
    if let Some(m) = doc.get("token_endpoint_auth_method").and_then(Value::as_str) {
        if m != "none" {
            return Err(format!(
                "token_endpoint_auth_method {m:?}: this relay takes public clients (none)"
            ));
        }
    }
    let redirect_uris: Vec<String> = doc
        .get("redirect_uris")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    if redirect_uris.is_empty()
        || redirect_uris.len() > oauth::MAX_REDIRECT_URIS
        || !redirect_uris.iter().all(|r| oauth::redirect_uri_ok(r))
    {
        return Err("its redirect_uris must be 1 to 10 https:// (or loopback http://) URIs".into());
    }
    let client_name = doc
        .get("client_name")
        .and_then(Value::as_str)
        .map(|n| n.trim().chars().take(200).collect::<String>())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| host.to_owned());
    Ok(OAuthClient {
        client_id: url.to_owned(),
        client_name,
        redirect_uris,
        created_at: 0,
    })
}

/// Recent events of one kind (failed invite codes, registrations, metadata fetches) by client
/// address, counted per address and relay-wide (behind a proxy every client is one address)
/// over [`GUESS_WINDOW`].
pub struct Window {
    per_address: usize,
    relay_wide: usize,
    seen: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl Window {
    pub fn new(per_address: usize, relay_wide: usize) -> Self {
        Window {
            per_address,
            relay_wide,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Seconds until `address` may try again, if it is over its limit.
    fn blocked(&self, address: &str) -> Option<u64> {
        let mut map = self.seen.lock();
        let now = Instant::now();
        let mut wait = None;
        // The relay-wide count is kept under a key no address has.
        for (key, limit) in [(address, self.per_address), ("\0all", self.relay_wide)] {
            if let Some(q) = map.get_mut(key) {
                while q.front().is_some_and(|t| now.duration_since(*t) > GUESS_WINDOW) {
                    q.pop_front();
                }
                if q.len() >= limit {
                    let until = GUESS_WINDOW.saturating_sub(now.duration_since(q[0]));
                    wait = Some(wait.unwrap_or(0).max(until.as_secs() + 1));
                }
            }
        }
        wait
    }

    fn hit(&self, address: &str) {
        let mut map = self.seen.lock();
        if map.len() > 10_000 {
            map.retain(|_, q| q.back().is_some_and(|t| t.elapsed() < GUESS_WINDOW));
        }
        let now = Instant::now();
        for key in [address, "\0all"] {
            map.entry(key.to_owned()).or_default().push_back(now);
        }
    }
}

/// What the OAuth face limits per client address: wrong invite codes, registrations, and
/// the metadata documents a consent page makes the relay fetch.
pub struct Limits {
    pub guesses: Window,
    pub registrations: Window,
    pub fetches: Window,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            guesses: Window::new(GUESSES_PER_ADDRESS, GUESSES_PER_RELAY),
            registrations: Window::new(REGISTRATIONS_PER_ADDRESS, REGISTRATIONS_PER_RELAY),
            fetches: Window::new(FETCHES_PER_ADDRESS, FETCHES_PER_RELAY),
        }
    }
}

/// A 429 for the OAuth endpoints, RFC 6749's shape.
fn slow_down(wait: u64, what: &str) -> HttpResponse {
    let mut resp = oauth_error(OAuthError::new(
        429,
        "temporarily_unavailable",
        format!("too many {what} from this address; try again in {wait} s"),
    ));
    resp.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_str(&wait.to_string()).expect("digits"),
    );
    resp
}

/// Mounts the flow and the admin routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource/cc/mcp",
    ] {
        cfg.route(path, web::get().to(resource_metadata));
    }
    cfg.route(
        "/.well-known/oauth-authorization-server",
        web::get().to(server_metadata),
    );
    for (path, alias) in [
        ("/oauth/register", "/register"),
        ("/oauth/token", "/token"),
        ("/oauth/revoke", "/revoke"),
        ("/oauth/authorize", "/authorize"),
    ] {
        for p in [path, alias] {
            match path {
                "/oauth/register" => cfg.route(p, web::post().to(register)),
                "/oauth/token" => cfg.route(p, web::post().to(token)),
                "/oauth/revoke" => cfg.route(p, web::post().to(revoke)),
                _ => cfg
                    .route(p, web::get().to(authorize_page))
                    .route(p, web::post().to(authorize_submit)),
            };
        }
    }
    cfg.route(api::MINT_INVITE.path, at(api::MINT_INVITE.verb).to(mint_invite));
    cfg.route(api::LIST_CLIENTS.path, at(api::LIST_CLIENTS.verb).to(list_clients));
    cfg.route(api::REVOKE_CLIENT.path, at(api::REVOKE_CLIENT.verb).to(revoke_client));
    cfg.route(api::REVOKE_GRANT.path, at(api::REVOKE_GRANT.verb).to(revoke_grant));
}

/// A relay without `--oauth`: its `/api/oauth/…` routes answer 404 with how to turn OAuth on,
/// not the bare "no route" of a mistyped path.
pub fn routes_off(cfg: &mut web::ServiceConfig) {
    cfg.service(web::scope("/api/oauth").default_service(web::to(|| async {
        crate::error::ApiError::new(
            StatusCode::NOT_FOUND,
            crate::error::OAUTH_OFF,
            "this relay was started without OAuth: restart it with --oauth --token TOKEN (the admin's token, \
             which mints invites and lists connections; see docs/oauth.md)",
        )
        .error_response()
    })));
}

fn oauth_of(req: &HttpRequest) -> &OAuth {
    req.app_data::<web::Data<OAuth>>()
        .expect("the OAuth routes are mounted with the OAuth service")
}

fn no_store(mut resp: HttpResponse) -> HttpResponse {
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    resp
}

/// RFC 6749 §5.2's error answer.
fn oauth_error(e: OAuthError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    no_store(HttpResponse::build(status).json(json!({"error": e.error, "error_description": e.description})))
}

// ---- metadata

async fn resource_metadata(req: HttpRequest) -> HttpResponse {
    let o = oauth_of(&req);
    let suffix = req.path().trim_start_matches("/.well-known/oauth-protected-resource");
    HttpResponse::Ok().json(json!({
        "resource": format!("{}{suffix}", o.issuer),
        "authorization_servers": [o.issuer],
        "scopes_supported": [oauth::SCOPE],
        "bearer_methods_supported": ["header"],
        "resource_name": "crosstalk",
    }))
}

async fn server_metadata(req: HttpRequest) -> HttpResponse {
    let i = &oauth_of(&req).issuer;
    HttpResponse::Ok().json(json!({
        "issuer": i,
        "authorization_endpoint": format!("{i}/oauth/authorize"),
        "token_endpoint": format!("{i}/oauth/token"),
        "registration_endpoint": format!("{i}/oauth/register"),
        "revocation_endpoint": format!("{i}/oauth/revoke"),
        "scopes_supported": [oauth::SCOPE],
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "code_challenge_methods_supported": ["S256"],
        "client_id_metadata_document_supported": true,
        "authorization_response_iss_parameter_supported": true,
    }))
}

// ---- registration

async fn register(req: HttpRequest, limits: web::Data<Limits>) -> HttpResponse {
    let o = oauth_of(&req);
    let who = address(&req);
    if let Some(wait) = limits.registrations.blocked(&who) {
        crate::guard::rejected("oauth_register");
        return slow_down(wait, "client registrations");
    }
    limits.registrations.hit(&who);
    let body = match Body::take(&req) {
        Ok(b) => b,
        Err(_) => return oauth_error(OAuthError::new(400, "invalid_client_metadata", "no body")),
    };
    if body.len() > MAX_REGISTRATION_BYTES {
        return oauth_error(OAuthError::new(
            400,
            "invalid_client_metadata",
            format!(
                "the registration is {} bytes; the relay takes at most {MAX_REGISTRATION_BYTES}",
                body.len()
            ),
        ));
    }
    let meta: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return oauth_error(OAuthError::new(
                400,
                "invalid_client_metadata",
                "the body must be a JSON object (RFC 7591)",
            ))
        }
    };
    // Every string the client sent, kept or not, within one bound (the redirect URIs and the
    // name have tighter ones of their own).
    let long = meta.as_object().into_iter().flatten().find_map(|(field, v)| {
        let longest = match v {
            Value::String(s) => s.len(),
            Value::Array(a) => a.iter().filter_map(Value::as_str).map(str::len).max().unwrap_or(0),
            _ => 0,
        };
        (longest > MAX_METADATA_STRING_BYTES).then(|| (field.clone(), longest))
    });
    if let Some((field, len)) = long {
        let error = if field == "redirect_uris" {
            "invalid_redirect_uri"
        } else {
            "invalid_client_metadata"
        };
        return oauth_error(OAuthError::new(
            400,
            error,
            format!("{field} holds a string of {len} bytes; the relay takes at most {MAX_METADATA_STRING_BYTES}"),
        ));
    }
    let strings = |field: &str| -> Option<Result<Vec<String>, OAuthError>> {
        meta.get(field).map(|v| {
            v.as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|s| s.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| {
                    OAuthError::new(
                        400,
                        "invalid_client_metadata",
                        format!("{field} must be an array of strings"),
                    )
                })
        })
    };
    let redirect_uris = match strings("redirect_uris") {
        Some(Ok(u)) => u,
        Some(Err(e)) => return oauth_error(e),
        None => {
            return oauth_error(OAuthError::new(
                400,
                "invalid_redirect_uri",
                "redirect_uris is required",
            ))
        }
    };
    for (field, allowed) in [
        ("grant_types", &["authorization_code", "refresh_token"][..]),
        ("response_types", &["code"][..]),
    ] {
        match strings(field) {
            Some(Ok(v)) => {
                if let Some(bad) = v.iter().find(|g| !allowed.contains(&g.as_str())) {
                    return oauth_error(OAuthError::new(
                        400,
                        "invalid_client_metadata",
                        format!("{field} {bad:?} is not supported (only {})", allowed.join(", ")),
                    ));
                }
            }
            Some(Err(e)) => return oauth_error(e),
            None => {}
        }
    }
    let name = match meta.get("client_name") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) => Some(n.clone()),
        Some(_) => {
            return oauth_error(OAuthError::new(
                400,
                "invalid_client_metadata",
                "client_name must be a string",
            ))
        }
    };
    match o.register(name, redirect_uris).await {
        Ok(c) => no_store(HttpResponse::Created().json(json!({
            "client_id": c.client_id,
            "client_id_issued_at": c.created_at,
            "client_name": c.client_name,
            "redirect_uris": c.redirect_uris,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
            "scope": oauth::SCOPE,
        }))),
        Err(e) => oauth_error(e),
    }
}

// ---- the consent page

/// An authorization request's parameters, from the query (the page) or the form (the submit).
#[derive(Debug, Default, Deserialize)]
struct AuthorizeParams {
    response_type: Option<String>,
    client_id: Option<String>,
    redirect_uri: Option<String>,
    state: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
    scope: Option<String>,
    resource: Option<String>,
    /// Typed into the page.
    invite_code: Option<String>,
}

/// An authorization request that checked out: what the consent page shows and a consent
/// sends back to the client.
struct Checked {
    client_id: String,
    client_name: String,
    redirect_uri: String,
    challenge: String,
    resource: String,
}

/// Where an answer to the authorization request goes: a page of our own for every refusal,
/// a redirect to the client only with the code a consent made.
enum Refusal {
    Page(StatusCode, String),
    Redirect(String),
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// `uri` with `pairs` added to its query.
fn with_query(uri: &str, pairs: &[(&str, &str)]) -> String {
    let mut out = uri.to_owned();
    let mut sep = if uri.contains('?') { '&' } else { '?' };
    for (k, v) in pairs {
        out.push(sep);
        out.push_str(k);
        out.push('=');
        out.push_str(&enc(v));
        sep = '&';
    }
    out
}

async fn check(
    o: &OAuth,
    cimd: &Cimd,
    fetches: Option<(&Window, &str)>,
    p: &AuthorizeParams,
) -> Result<Checked, Refusal> {
    let page = |why: String| Refusal::Page(StatusCode::BAD_REQUEST, why);
    let client_id = p.client_id.clone().unwrap_or_default();
    let client = if client_id.starts_with("https://") {
        if let Some((window, who)) = fetches {
            if !cimd.cached(&client_id) {
                if let Some(wait) = window.blocked(who) {
                    return Err(Refusal::Page(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!("Too many clients to look up from this address; try again in {wait} s."),
                    ));
                }
                window.hit(who);
            }
        }
        match cimd.client(&client_id).await {
            Ok(c) => Ok(Some(c)),
            Err(why) => {
                return Err(page(format!(
                    "The client's metadata document {} cannot be used: {}",
                    escape(&client_id.chars().take(200).collect::<String>()),
                    escape(&why)
                )))
            }
        }
    } else {
        o.client(&client_id).await
    };
    let client = match client {
        Ok(Some(c)) => c,
        Ok(None) => {
            return Err(page(format!(
                "This connection's registration ({}) is unknown to the relay. Remove the connector and add it again.",
                escape(&client_id.chars().take(80).collect::<String>())
            )))
        }
        Err(e) => return Err(Refusal::Page(StatusCode::SERVICE_UNAVAILABLE, escape(&e.description))),
    };
    let redirect_uri = p.redirect_uri.clone().unwrap_or_default();
    if !client
        .redirect_uris
        .iter()
        .any(|r| oauth::redirect_matches(r, &redirect_uri))
    {
        return Err(page(format!(
            "The redirect address {} is not one this client registered.",
            escape(&redirect_uri.chars().take(200).collect::<String>())
        )));
    }
    // Even with a registered redirect URI, a mistake is told on this page, never by sending
    // the browser there: registration is open to anyone, so a redirect URI may be an
    // attacker's page, and an error redirect from the relay's origin would lend it the
    // relay's name (RFC 9700 §4.11.2). Only a consent sends the browser to the client.
    let back = |error: &str, description: &str| {
        page(format!(
            "The connection request is not valid ({}): {}.",
            escape(error),
            escape(description)
        ))
    };
    if p.response_type.as_deref() != Some("code") {
        return Err(back("unsupported_response_type", "response_type must be code"));
    }
    let challenge = p.code_challenge.clone().unwrap_or_default();
    if !oauth::pkce_shaped(&challenge) || p.code_challenge_method.as_deref() != Some("S256") {
        return Err(back(
            "invalid_request",
            "PKCE is required: code_challenge with code_challenge_method=S256",
        ));
    }
    let resource = match o.resource(p.resource.as_deref()) {
        Ok(r) => r,
        Err(e) => return Err(back(e.error, &e.description)),
    };
    if let Some(scope) = p.scope.as_deref().filter(|s| !s.trim().is_empty()) {
        if !scope.split_whitespace().any(|s| s == oauth::SCOPE) {
            return Err(back("invalid_scope", "the one scope is crosstalk"));
        }
    }
    Ok(Checked {
        client_id,
        client_name: client.client_name,
        redirect_uri,
        challenge,
        resource,
    })
}

fn html(status: StatusCode, body: String) -> HttpResponse {
    let mut resp = HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" \
             content=\"width=device-width\"><title>Connect to crosstalk</title><style>body{{font:16px \
             system-ui,sans-serif;max-width:32em;margin:3em auto;padding:0 1em;color:#222}}input[type=text]\
             {{font:inherit;padding:.4em;width:12em;letter-spacing:.1em}}button{{font:inherit;padding:.4em \
             1em}}.warn{{color:#8a5300}}.err{{color:#b00020}}</style></head><body>{body}</body></html>"
        ));
    let h = resp.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"),
    );
    // Not no-referrer: with it Chromium sends `Origin: null` on the form's POST, which the
    // guard (rightly) refuses. same-origin sends nothing to other sites.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    no_store(resp)
}

fn refusal(r: Refusal) -> HttpResponse {
    match r {
        Refusal::Page(status, why) => html(status, format!("<h1>Cannot connect</h1><p class=\"err\">{why}</p>")),
        Refusal::Redirect(to) => no_store(HttpResponse::SeeOther().insert_header((header::LOCATION, to)).finish()),
    }
}

/// The form: every parameter of the request as a hidden field, and one text field for the
/// invite code.
fn form(p: &AuthorizeParams, c: &Checked, error: Option<&str>) -> String {
    let redirect_host = oauth::host_of(&c.redirect_uri);
    let local = oauth::is_loopback(&redirect_host);
    let mut hidden = String::new();
    for (name, value) in [
        ("response_type", &p.response_type),
        ("client_id", &p.client_id),
        ("redirect_uri", &p.redirect_uri),
        ("state", &p.state),
        ("code_challenge", &p.code_challenge),
        ("code_challenge_method", &p.code_challenge_method),
        ("scope", &p.scope),
        ("resource", &p.resource),
    ] {
        if let Some(v) = value {
            hidden.push_str(&format!(
                "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                escape(v)
            ));
        }
    }
    format!(
        "<h1>Connect {name} to crosstalk</h1>\
         <p>{name} asks to read and post on this relay's channels. After you allow it, the relay sends \
         the connection to <b>{host}</b>.</p>{warn}{error}\
         <form method=\"post\" action=\"/oauth/authorize\">{hidden}\
         <p><label>Invite code<br><input type=\"text\" name=\"invite_code\" autocomplete=\"off\" \
         autocapitalize=\"characters\" spellcheck=\"false\" autofocus required placeholder=\"ABCDE-FGHJK\">\
         </label></p><p><button type=\"submit\">Allow</button></p></form>\
         <p>An invite code comes from whoever runs this relay (<code>crosstalk invite</code>). It works once.</p>",
        name = escape(&c.client_name),
        host = escape(&redirect_host),
        warn = if local {
            "<p class=\"warn\">The connection goes to a program on this computer.</p>"
        } else {
            ""
        },
        error = error.map_or(String::new(), |e| format!("<p class=\"err\">{}</p>", escape(e))),
    )
}

async fn authorize_page(req: HttpRequest, cimd: web::Data<Cimd>, limits: web::Data<Limits>) -> HttpResponse {
    let o = oauth_of(&req);
    let p: AuthorizeParams = web::Query::<AuthorizeParams>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .unwrap_or_default();
    let who = address(&req);
    match check(o, &cimd, Some((&limits.fetches, &who)), &p).await {
        Ok(c) => html(StatusCode::OK, form(&p, &c, None)),
        Err(r) => refusal(r),
    }
}

fn address(req: &HttpRequest) -> String {
    req.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default()
}

async fn authorize_submit(req: HttpRequest, limits: web::Data<Limits>, cimd: web::Data<Cimd>) -> HttpResponse {
    let o = oauth_of(&req);
    let body = Body::take(&req).unwrap_or_default();
    let p: AuthorizeParams = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let who = address(&req);
    let c = match check(o, &cimd, Some((&limits.fetches, &who)), &p).await {
        Ok(c) => c,
        Err(r) => return refusal(r),
    };
    if let Some(wait) = limits.guesses.blocked(&who) {
        crate::guard::rejected("invite");
        let mut resp = html(
            StatusCode::TOO_MANY_REQUESTS,
            format!("<h1>Too many wrong codes</h1><p class=\"err\">Try again in {wait} s.</p>"),
        );
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_str(&wait.to_string()).expect("digits"),
        );
        return resp;
    }
    let typed = p.invite_code.clone().unwrap_or_default();
    let invite = match o.redeem(&typed).await {
        Ok(Some(i)) => i,
        Ok(None) => {
            limits.guesses.hit(&who);
            return html(
                StatusCode::BAD_REQUEST,
                form(&p, &c, Some("That code is not valid, or was already used.")),
            );
        }
        Err(e) => return refusal(Refusal::Page(StatusCode::SERVICE_UNAVAILABLE, escape(&e.description))),
    };
    let code = AuthCode {
        client_id: c.client_id,
        client_name: c.client_name,
        redirect_uri: c.redirect_uri.clone(),
        challenge: c.challenge,
        resource: c.resource,
        scope: oauth::SCOPE.to_owned(),
        identity: invite.identity,
        invite_id: invite.id,
        expires_at: crosstalk_schema::Timestamp::now().0 / 1_000_000 + oauth::CODE_TTL.as_secs() as i64,
    };
    let secret = match o.issue_code(code).await {
        Ok(s) => s,
        Err(e) => return refusal(Refusal::Page(StatusCode::SERVICE_UNAVAILABLE, escape(&e.description))),
    };
    let mut pairs = vec![("code", secret.as_str())];
    if let Some(s) = &p.state {
        pairs.push(("state", s));
    }
    pairs.push(("iss", &o.issuer));
    refusal(Refusal::Redirect(with_query(&c.redirect_uri, &pairs)))
}

// ---- tokens

/// A form body, and the client id of a Basic header if the client sent one (its password
/// is ignored: every client here is public).
fn form_of(req: &HttpRequest) -> Result<HashMap<String, String>, OAuthError> {
    let ct = req.content_type();
    if !ct.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(OAuthError::new(
            400,
            "invalid_request",
            "send the parameters as application/x-www-form-urlencoded",
        ));
    }
    let body = Body::take(req).map_err(|_| OAuthError::new(400, "invalid_request", "no body"))?;
    let mut form: HashMap<String, String> = HashMap::new();
    for (k, v) in form_urlencoded::parse(&body) {
        if form.insert(k.to_string(), v.to_string()).is_some() {
            return Err(OAuthError::new(400, "invalid_request", format!("{k} is given twice")));
        }
    }
    if let Some(basic) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic ").or_else(|| v.strip_prefix("basic ")))
    {
        let id = basic_user(basic.trim())
            .ok_or_else(|| OAuthError::new(401, "invalid_client", "a Basic header that is not id:secret"))?;
        match form.get("client_id") {
            Some(given) if *given != id => {
                return Err(OAuthError::new(
                    400,
                    "invalid_request",
                    "client_id differs from the Basic header's",
                ))
            }
            _ => {
                form.insert("client_id".into(), id);
            }
        }
    }
    Ok(form)
}

/// The user part of an HTTP Basic credential (RFC 7617), form-decoded as RFC 6749 §2.3.1 says.
fn basic_user(b64: &str) -> Option<String> {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in b64.bytes().take_while(|&c| c != b'=') {
        let v = A.iter().position(|&a| a == c)? as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    let (user, _) = s.split_once(':')?;
    Some(
        form_urlencoded::parse(format!("u={user}").as_bytes())
            .next()?
            .1
            .into_owned(),
    )
}

fn tokens(t: Tokens) -> HttpResponse {
    no_store(HttpResponse::Ok().json(json!({
        "access_token": t.access_token,
        "token_type": "Bearer",
        "expires_in": t.expires_in,
        "refresh_token": t.refresh_token,
        "scope": t.scope,
    })))
}

async fn token(req: HttpRequest) -> HttpResponse {
    let o = oauth_of(&req);
    let form = match form_of(&req) {
        Ok(f) => f,
        Err(e) => return oauth_error(e),
    };
    let get = |k: &str| form.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let missing = |k: &str| oauth_error(OAuthError::new(400, "invalid_request", format!("{k} is required")));
    let Some(client_id) = get("client_id") else {
        return oauth_error(OAuthError::new(401, "invalid_client", "client_id is required"));
    };
    let answer = match get("grant_type") {
        Some("authorization_code") => {
            let (Some(code), Some(redirect_uri), Some(verifier)) =
                (get("code"), get("redirect_uri"), get("code_verifier"))
            else {
                return missing("code, redirect_uri and code_verifier");
            };
            o.exchange(code, client_id, redirect_uri, verifier, get("resource"))
                .await
        }
        Some("refresh_token") => {
            let Some(refresh) = get("refresh_token") else {
                return missing("refresh_token");
            };
            if let Some(scope) = get("scope") {
                if scope.split_whitespace().any(|s| s != oauth::SCOPE) {
                    return oauth_error(OAuthError::new(400, "invalid_scope", "the one scope is crosstalk"));
                }
            }
            o.refresh(refresh, client_id, get("resource")).await
        }
        Some(other) => Err(OAuthError::new(
            400,
            "unsupported_grant_type",
            format!("grant_type {other:?}: this relay does authorization_code and refresh_token"),
        )),
        None => return missing("grant_type"),
    };
    match answer {
        Ok(t) => tokens(t),
        Err(e) => oauth_error(e),
    }
}

async fn revoke(req: HttpRequest) -> HttpResponse {
    let o = oauth_of(&req);
    let form = match form_of(&req) {
        Ok(f) => f,
        Err(e) => return oauth_error(e),
    };
    let Some(t) = form.get("token").filter(|t| !t.is_empty()) else {
        return oauth_error(OAuthError::new(400, "invalid_request", "token is required"));
    };
    match o.revoke_token(t).await {
        Ok(()) => no_store(HttpResponse::Ok().finish()),
        Err(e) => oauth_error(e),
    }
}

// ---- admin

fn admin(req: &HttpRequest) -> Result<(), Box<HttpResponse>> {
    match req.extensions().get::<Principal>() {
        Some(p) if p.manages_connections() => Ok(()),
        _ => Err(Box::new(
            crate::error::ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "only the relay's own token (--token) may manage OAuth invites and connections",
            )
            .error_response(),
        )),
    }
}

fn api_error(e: OAuthError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let code = if status.is_server_error() {
        "store_unavailable"
    } else {
        "invalid_input"
    };
    crate::error::ApiError::new(status, code, e.description).error_response()
}

async fn mint_invite(req: HttpRequest) -> HttpResponse {
    if let Err(r) = admin(&req) {
        return *r;
    }
    let body = Body::take(&req).unwrap_or_default();
    let r: InviteRequest = if body.iter().all(u8::is_ascii_whitespace) {
        InviteRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return crate::error::ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_input",
                    format!("invalid invite request: {e}"),
                )
                .error_response()
            }
        }
    };
    match oauth_of(&req)
        .invite(r.identity, r.expires_in_s.map(Duration::from_secs), r.note)
        .await
    {
        Ok(i) => no_store(HttpResponse::Created().json(i)),
        Err(e) => api_error(e),
    }
}

async fn list_clients(req: HttpRequest) -> HttpResponse {
    if let Err(r) = admin(&req) {
        return *r;
    }
    match oauth_of(&req).grants().await {
        Ok(clients) => HttpResponse::Ok().json(GrantList { clients }),
        Err(e) => api_error(e),
    }
}

async fn revoke_grant(req: HttpRequest, grant: web::Path<String>) -> HttpResponse {
    if let Err(r) = admin(&req) {
        return *r;
    }
    match oauth_of(&req).revoke_grant(&grant).await {
        Ok(true) => HttpResponse::NoContent().finish(),
        Ok(false) => {
            crate::error::ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no connection {grant:?}"))
                .error_response()
        }
        Err(e) => api_error(e),
    }
}

async fn revoke_client(req: HttpRequest) -> HttpResponse {
    if let Err(r) = admin(&req) {
        return *r;
    }
    let Ok(q) = web::Query::<ClientQuery>::from_query(req.query_string()) else {
        return crate::error::ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", "name ?client_id=")
            .error_response();
    };
    match oauth_of(&req).revoke_client(&q.client_id).await {
        Ok(revoked) => HttpResponse::Ok().json(Revoked { revoked }),
        Err(e) => api_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_document_urls_and_addresses() {
        assert!(cimd_url("https://claude.ai/oauth/mcp-oauth-client-metadata").is_ok());
        for bad in [
            "http://claude.ai/x",
            "https://claude.ai/",
            "https://claude.ai/a#f",
            "https://u:p@claude.ai/x",
            "https://claude.ai/a/../b",
        ] {
            assert!(cimd_url(bad).is_err(), "{bad}");
        }
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!crate::client::public(ip.parse().unwrap()), "{ip}");
        }
        assert!(crate::client::public("93.184.216.34".parse().unwrap()));
        let doc = serde_json::json!({"client_id": "https://a.example/c", "redirect_uris": ["https://a.example/cb"]});
        assert_eq!(
            cimd_client("https://a.example/c", "a.example", &doc)
                .unwrap()
                .client_name,
            "a.example"
        );
        let wrong = serde_json::json!({"client_id": "https://b.example/c", "redirect_uris": ["https://a.example/cb"]});
        assert!(cimd_client("https://a.example/c", "a.example", &wrong).is_err());
    }

    #[test]
    fn basic_header_user() {
        // "ct_c_abc:x" in base64.
        assert_eq!(basic_user("Y3RfY19hYmM6eA==").as_deref(), Some("ct_c_abc"));
        assert_eq!(basic_user("!!"), None);
    }

    #[test]
    fn challenges_name_the_metadata_of_what_was_asked() {
        use crate::http::oauth_challenge as challenge;
        let c = challenge("https://r.example", "/cc/mcp", false);
        assert_eq!(
            c,
            "Bearer resource_metadata=\"https://r.example/.well-known/oauth-protected-resource/cc/mcp\", scope=\"crosstalk\""
        );
        assert!(challenge("https://r.example", "/api/channels", true).starts_with("Bearer error=\"invalid_token\", "));
    }
}
