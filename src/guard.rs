//! What keeps a relay safe to expose, for every route at once (the one middleware the
//! assembler wraps the app in — one layer, as each layer costs every request):
//! - **Host and Origin allow-list** (DNS rebinding, cross-site requests): a request must name
//!   an allowed host, and a browser's `Origin` must be one of them, on every route, as on
//!   `/mcp`. Loopback is always allowed; `--allowed-hosts` adds names.
//! - **CORS only by explicit allow-list** (`--cors-origins`): matching origins get
//!   `Access-Control-Allow-Origin: <origin>` (never `*`) and preflights are answered.
//! - **No requests from other sites' pages**: a browser's `Sec-Fetch-Site: cross-site` (or
//!   `same-site`: another origin on this site) is refused unless its origin is allowed by
//!   `--cors-origins` — `<img>` and no-cors GETs carry no `Origin`, and a GET can change state.
//! - **Browser headers**: `X-Content-Type-Options: nosniff` everywhere, `Cache-Control:
//!   no-store` on API answers, the guard's own refusals (401, 403, 408, 413, 429) included.
//! - **Tokens** ([`crate::auth::authenticate`]): the principal, or a 401.
//! - **Bodies**: a request body must arrive within [`BODY_TIMEOUT`] (408 otherwise) and
//!   within the size limit (413), before any handler runs; it is read here only, and handed on
//!   as [`crate::http::Body`].
//! - **Compact request heads** ([`compact_headers`]): a parked wait holds its request for
//!   minutes, so its header map should cost what its headers need.

use crate::error::ApiError;
use crate::http::{is_sse_stream, Body};
use crate::ops::Principal;
use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, ResponseError};
use futures_util::{FutureExt as _, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Longest a client may take to send a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Hosts always accepted: loopback, so a relay on one machine needs no setting.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// What the guard checks against, shared by every worker.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Allowed hosts: `name` (any port) or `name:port`; loopback included.
    pub hosts: Vec<String>,
    /// Origins that get CORS answers (exact `scheme://host[:port]`).
    pub cors_origins: Vec<String>,
    /// Largest request body read, in bytes.
    pub max_body: usize,
    /// Requests per second each token may make (0: unlimited).
    pub rate: f64,
    /// Failed authentications per second each client address may make (0: unlimited).
    pub auth_failure_rate: f64,
    /// Longest URL (path and query) read, in bytes.
    pub max_url: usize,
}

/// Default of `--rate-limit`: far above what agents and people do, low enough that one
/// leaked or runaway token cannot monopolise the relay.
pub const DEFAULT_RATE: u32 = 1000;

/// Default of `--auth-failure-rate`: a person who mistypes a token, or a client retrying with
/// a stale one, stays well under it; guessing tokens at it would take longer than anyone has.
pub const DEFAULT_AUTH_FAILURE_RATE: u32 = 5;

/// A token bucket per token: `rate` requests a second, bursts up to one second's worth.
#[derive(Default)]
pub struct RateLimiter(parking_lot::Mutex<std::collections::HashMap<String, (f64, std::time::Instant)>>);

/// Buckets kept before idle ones are dropped (full buckets carry no information).
const MAX_BUCKETS: usize = 10_000;

impl RateLimiter {
    /// `Ok` if `key` may make a request now, else the seconds until it may.
    pub fn check(&self, key: &str, rate: f64) -> Result<(), f64> {
        if rate <= 0.0 {
            return Ok(());
        }
        let now = std::time::Instant::now();
        let mut buckets = self.0.lock();
        if buckets.len() > MAX_BUCKETS {
            buckets.retain(|_, (tokens, at)| *tokens + at.elapsed().as_secs_f64() * rate < rate);
        }
        let (tokens, at) = buckets.entry(key.to_owned()).or_insert((rate, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * rate).min(rate);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err((1.0 - *tokens) / rate)
        }
    }
}

/// Loopback plus the configured hosts. Never empty: an empty list must never read as "any".
pub fn allowed_hosts(extra: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    for h in extra {
        if !hosts.contains(h) {
            hosts.push(h.clone());
        }
    }
    hosts
}

/// Splits `host[:port]` (with `[v6]:port` and bare `::1`) into host and port, without
/// allocating: this runs on every request.
fn split_authority(authority: &str) -> (&str, Option<&str>) {
    let a = authority.trim();
    if let Some(rest) = a.strip_prefix('[') {
        let (host, after) = rest.split_once(']').unwrap_or((rest, ""));
        return (host, after.strip_prefix(':'));
    }
    if a.bytes().filter(|b| *b == b':').count() > 1 {
        return (a, None);
    }
    match a.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (a, None),
    }
}

/// Whether `authority` (a Host header, or an Origin's authority) is allowed: an allowed
/// `name` matches it on any port, `name:port` on that port only; names ignore case.
pub fn host_allowed(hosts: &[String], authority: &str) -> bool {
    let (host, port) = split_authority(authority);
    hosts.iter().any(|allowed| {
        let (h, p) = split_authority(allowed);
        h.eq_ignore_ascii_case(host) && (p.is_none() || p == port)
    })
}

/// Whether a browser's `Origin` names an allowed host over http or https.
pub fn origin_allowed(hosts: &[String], origin: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https") && host_allowed(hosts, authority)
}

/// Answers a refused request, counting it under `reason` (`crosstalk_rejected_total`).
fn refuse(
    req: ServiceRequest,
    reason: &'static str,
    status: StatusCode,
    code: &'static str,
    message: String,
) -> ServiceResponse {
    rejected(reason);
    answer(req, ApiError::new(status, code, message).error_response())
}

/// The guard's own answer (a refusal), with the browser headers every answer carries.
fn answer(req: ServiceRequest, mut res: actix_web::HttpResponse) -> ServiceResponse {
    browser_headers(res.headers_mut(), false);
    req.into_response(res)
}

/// `nosniff` on every answer; `no-store` on all but event streams (and answers that set
/// their own caching).
fn browser_headers(headers: &mut header::HeaderMap, sse: bool) {
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !sse && !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}

/// Whether a browser says this request comes from a page of another site (or of another
/// origin on this site) — `Sec-Fetch-Site`, which browsers send on every request, `<img>` and
/// no-cors fetches included, where they send no `Origin`. Typing the console's address or
/// following a link to it (a top-level navigation to the console's pages) is allowed; no
/// other route answers another site's page, since a GET such as an inbox read changes state.
fn from_another_site(req: &ServiceRequest) -> bool {
    let fetch = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    match fetch("sec-fetch-site") {
        Some("cross-site" | "same-site") => {
            let navigation = fetch("sec-fetch-mode") == Some("navigate") && req.method() == Method::GET;
            // A hosted client opens the OAuth consent page from its own site; showing it
            // changes nothing (its form posts back from the relay's own origin).
            let consent = req.method() == Method::GET && matches!(req.path(), "/oauth/authorize" | "/authorize");
            let console = navigation && crate::http::console::PATHS.contains(&req.path());
            !(consent || console)
        }
        _ => false,
    }
}

/// A 429 with `Retry-After` (whole seconds, at least one), counted under `reason`.
fn too_many(
    req: ServiceRequest,
    reason: &'static str,
    code: &'static str,
    message: String,
    wait: f64,
) -> ServiceResponse {
    rejected(reason);
    let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, message);
    e.retry_after = Some(wait.ceil().max(1.0) as u32);
    answer(req, e.error_response())
}

/// The error code of a 429 for failed authentications beyond `--auth-failure-rate`: a client
/// (the stdio bridge) tells it apart from a busy token by this.
pub const AUTH_RATE_LIMITED: &str = "auth_rate_limited";

pub(crate) fn rejected(reason: &'static str) {
    metrics::counter!("crosstalk_rejected_total", "reason" => reason).increment(1);
}

/// Default of `--max-url-bytes`: far above any URL the routes need, and above the 8,000 bytes
/// RFC 9110 asks servers to take.
pub const DEFAULT_MAX_URL_BYTES: usize = 16 * 1024;

/// The middleware.
pub async fn guard(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    compact_headers(req.headers_mut());
    // The assembler always sets the policy; without one, loopback only.
    let policy = req.app_data::<web::Data<Policy>>().cloned().unwrap_or_else(|| {
        web::Data::new(Policy {
            hosts: allowed_hosts(&[]),
            cors_origins: Vec::new(),
            max_body: 1 << 20,
            rate: DEFAULT_RATE as f64,
            auth_failure_rate: DEFAULT_AUTH_FAILURE_RATE as f64,
            max_url: DEFAULT_MAX_URL_BYTES,
        })
    });
    // A URL longer than any the relay's routes need: refused before anything reads it (a
    // parked long-poll would hold it for minutes). Longer than actix-http's own limit never
    // gets here: vendor/actix-http answers those with the same JSON 414.
    let url_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    let max_url = policy.max_url;
    if url_len > max_url {
        return Ok(refuse(
            req,
            "uri_too_long",
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the URL is {url_len} bytes; the relay reads at most {max_url} (--max-url-bytes)"),
        )
        .map_into_right_body());
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    // /healthz answers any Host: load balancers probe it by address, and it tells nothing.
    let health = crate::http::is_health(req.path());
    if !host_allowed(&policy.hosts, &host) && !health {
        return Ok(refuse(
            req,
            "host",
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("Host {host:?} is not allowed (DNS rebinding defence); start the relay with --allowed-hosts"),
        )
        .map_into_right_body());
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let cors = origin
        .as_ref()
        .filter(|o| policy.cors_origins.iter().any(|c| c == *o))
        .cloned();
    if let Some(o) = &origin {
        if cors.is_none() && !origin_allowed(&policy.hosts, o) {
            return Ok(refuse(
                req,
                "origin",
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("Origin {o:?} is not allowed (cross-site requests are refused)"),
            )
            .map_into_right_body());
        }
    }
    if cors.is_none() && from_another_site(&req) {
        return Ok(refuse(
            req,
            "cross_site",
            StatusCode::FORBIDDEN,
            "forbidden",
            "cross-site requests are refused (Sec-Fetch-Site); a page of another origin may call the relay only \
             if it is in --cors-origins"
                .into(),
        )
        .map_into_right_body());
    }
    if req.method() == Method::OPTIONS {
        if let Some(o) = &cors {
            let mut res = actix_web::HttpResponse::NoContent().finish();
            cors_headers(res.headers_mut(), o);
            return Ok(req.into_response(res).map_into_right_body());
        }
    }
    let principal = match crate::auth::authenticate(&req).await {
        Ok(principal) => principal,
        Err(unauthorized) => {
            // Failures are limited per client address, so tokens cannot be guessed at speed;
            // a client with the right token is never held up by this.
            // A request with no token guesses nothing (every OAuth client's first request
            // is one): only wrong tokens count.
            let address = req.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default();
            let limiter = req
                .app_data::<web::Data<RateLimiter>>()
                .cloned()
                .filter(|_| crate::auth::presented(&req));
            if let Some(Err(wait)) =
                limiter.map(|l| l.check(&format!("\0auth-failures {address}"), policy.auth_failure_rate))
            {
                let message = format!(
                    "more than {} failed authentications a second from this address (--auth-failure-rate); check the \
                     token",
                    policy.auth_failure_rate
                );
                return Ok(too_many(req, AUTH_RATE_LIMITED, AUTH_RATE_LIMITED, message, wait).map_into_right_body());
            }
            rejected("unauthorized");
            return Ok(answer(req, *unauthorized).map_into_right_body());
        }
    };
    // Per token; without tokens the relay serves loopback only, and is not limited.
    let key = (principal != Principal::Anyone).then(|| principal.key());
    if let (Some(key), Some(limiter)) = (key, req.app_data::<web::Data<RateLimiter>>()) {
        if let Err(wait) = limiter.check(key, policy.rate) {
            let message = format!(
                "more than {} requests a second with this token (--rate-limit)",
                policy.rate
            );
            return Ok(too_many(req, "rate_limited", "rate_limited", message, wait).map_into_right_body());
        }
    }
    req.extensions_mut().insert(principal);
    if matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        match read_body(req.take_payload(), policy.max_body).await {
            Ok(body) => {
                // Read once, here: handlers take it (`http::Body`), libraries read the payload.
                req.set_payload(Payload::from(body.clone()));
                req.extensions_mut().insert(Body(body));
            }
            Err((status, code, message)) => {
                return Ok(refuse(req, code, status, code, message).map_into_right_body());
            }
        }
    }
    let sse = is_sse_stream(req.path());
    // A stream opened with an OAuth token lasts no longer than the token (a long-poll is cut
    // short where REST operations are answered, `http::routes`).
    // The watch is made only for an answer that streams.
    let watch = req
        .extensions()
        .get::<crate::ops::oauth::Credential>()
        .cloned()
        .and_then(|c| Some((c, req.app_data::<web::Data<crate::ops::oauth::OAuth>>()?.clone())));
    let mut res = next.call(req).await?.map_body(|_, body| match watch {
        Some((credential, oauth)) if matches!(body.size(), BodySize::Stream) => EitherBody::right(Lasting {
            body: body.boxed(),
            ended: Some(Box::pin(oauth.get_ref().clone().ended(credential))),
        }),
        _ => EitherBody::left(body),
    });
    let headers = res.headers_mut();
    browser_headers(headers, sse);
    if let Some(o) = &cors {
        cors_headers(headers, o);
    }
    Ok(res.map_into_left_body())
}

/// A streamed answer (an SSE stream, an MCP event stream) to a request made with an OAuth
/// token: it ends, as a stream ends, once the token is no longer good.
pub struct Lasting {
    body: BoxBody,
    /// Resolves when the token is revoked, rotated away from or expired; `None` once it has.
    ended: Option<Pin<Box<dyn Future<Output = ()>>>>,
}

impl MessageBody for Lasting {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<web::Bytes, Self::Error>>> {
        let this = self.get_mut();
        if let Some(ended) = &mut this.ended {
            if ended.as_mut().poll(cx).is_ready() {
                this.ended = None;
                tracing::debug!("a stream's OAuth token ended; the stream ends");
                return Poll::Ready(None);
            }
        } else {
            return Poll::Ready(None);
        }
        Pin::new(&mut this.body).poll_next(cx)
    }
}

/// Rebuilds a request's header map at the size its headers need, when it is much larger.
///
/// actix-http makes each new request head with room for 16 headers, as every slot holds a
/// name and a small vector of four values. Heads are pooled and reused, 128 per worker; beyond
/// that each request allocates one, and keeps it until it is answered, so parked long-polls
/// hold tables of nearly all empty slots (docs/benchmarks.md, "Measurements behind design
/// choices"). A compacted head goes back to the pool at its new size, so a steady stream
/// of requests rebuilds nothing: only heads made fresh, under concurrency the pool cannot
/// cover, are rebuilt. Names, values and the order of repeated values are kept.
pub fn compact_headers(headers: &mut header::HeaderMap) {
    let keys = headers.len_keys();
    if headers.capacity() <= 2 * keys + 8 {
        return;
    }
    let mut compact = header::HeaderMap::with_capacity(keys);
    for (name, value) in std::mem::take(headers) {
        compact.append(name, value);
    }
    *headers = compact;
}

fn cors_headers(headers: &mut header::HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "authorization, content-type, x-crosstalk-session, mcp-session-id, mcp-protocol-version, last-event-id",
        ),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("mcp-session-id, retry-after"),
    );
}

/// Reads the whole body, within the time and size limits.
async fn read_body(mut payload: Payload, limit: usize) -> Result<web::Bytes, (StatusCode, &'static str, String)> {
    if matches!(payload, Payload::None) {
        return Ok(web::Bytes::new());
    }
    let mut body = Gathered::default();
    // actix-http calls the service as soon as a request's head is parsed, and hands it the
    // body only after that call: a yield lets it, so a body that came with its head (most do)
    // is then read without arming a timer.
    tokio::task::yield_now().await;
    loop {
        match payload.next().now_or_never() {
            Some(Some(chunk)) => body.add(chunk, limit)?,
            Some(None) => return Ok(body.done()),
            None => break,
        }
    }
    // The rest is on its way: bounded.
    let rest = async move {
        while let Some(chunk) = payload.next().await {
            body.add(chunk, limit)?;
        }
        Ok(body.done())
    };
    match tokio::time::timeout(BODY_TIMEOUT, rest).await {
        Ok(r) => r,
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!("the request body did not arrive within {} s", BODY_TIMEOUT.as_secs()),
        )),
    }
}

/// A body as its chunks arrive, within the size limit. Always a copy of its own: a chunk
/// shares the connection's read buffer, which a request parked for minutes (an ask, an MCP
/// wait) would otherwise keep whole.
#[derive(Default)]
struct Gathered(web::BytesMut);

impl Gathered {
    fn add(
        &mut self,
        chunk: Result<web::Bytes, actix_web::error::PayloadError>,
        limit: usize,
    ) -> Result<(), (StatusCode, &'static str, String)> {
        let chunk = chunk.map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                "invalid_input",
                format!("unreadable body: {e}"),
            )
        })?;
        if self.0.len() + chunk.len() > limit {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("request body is larger than {limit} bytes"),
            ));
        }
        self.0.extend_from_slice(&chunk);
        Ok(())
    }

    fn done(self) -> web::Bytes {
        self.0.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request body as actix-http hands it over, fed by the test.
    fn body_stream() -> (impl FnMut(Option<&'static [u8]>), Payload) {
        let (mut tx, rx) = actix_http::h1::Payload::create(false);
        let feed = move |chunk: Option<&'static [u8]>| match chunk {
            Some(b) => tx.feed_data(web::Bytes::from_static(b)),
            None => tx.feed_eof(),
        };
        (feed, Payload::from(rx))
    }

    #[actix_web::test]
    async fn a_body_that_came_with_its_head_is_read_whole() {
        let (mut feed, payload) = body_stream();
        feed(Some(b"{\"content\":"));
        feed(Some(b"\"hi\"}"));
        feed(None);
        assert_eq!(read_body(payload, 100).await.unwrap(), &b"{\"content\":\"hi\"}"[..]);
        let (mut feed, payload) = body_stream();
        feed(Some(b"one chunk"));
        feed(None);
        assert_eq!(read_body(payload, 100).await.unwrap(), &b"one chunk"[..]);
        let (mut feed, payload) = body_stream();
        feed(None);
        assert_eq!(read_body(payload, 100).await.unwrap(), &b""[..]);
    }

    #[actix_web::test]
    async fn a_body_still_on_its_way_is_waited_for_and_bounded() {
        let (mut feed, payload) = body_stream();
        feed(Some(b"first, "));
        let read = actix_web::rt::spawn(read_body(payload, 100));
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
        feed(Some(b"then the rest"));
        feed(None);
        assert_eq!(read.await.unwrap().unwrap(), &b"first, then the rest"[..]);
        // Too large, whether the limit is passed at once or by a later chunk.
        for chunks in [&[&b"0123456789ab"[..]][..], &[&b"0123456"[..], &b"789ab"[..]][..]] {
            let (mut feed, payload) = body_stream();
            for c in chunks {
                feed(Some(c));
            }
            feed(None);
            let (status, code, _) = read_body(payload, 10).await.unwrap_err();
            assert_eq!((status, code), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
        }
    }

    #[test]
    fn a_fresh_request_head_is_compacted_and_keeps_every_value_in_order() {
        // As actix-http makes a head when its pool is empty.
        let mut headers = header::HeaderMap::with_capacity(16);
        let roomy = headers.capacity();
        headers.append(header::HOST, HeaderValue::from_static("127.0.0.1:8765"));
        headers.append(header::ACCEPT, HeaderValue::from_static("application/json"));
        headers.append(header::ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers.append(header::COOKIE, HeaderValue::from_static("a=1"));
        let before: Vec<_> = headers.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
        compact_headers(&mut headers);
        assert!(
            headers.capacity() < roomy / 2,
            "capacity {} of {roomy}",
            headers.capacity()
        );
        assert_eq!(headers.len(), 4);
        for (name, _) in &before {
            let want: Vec<_> = before.iter().filter(|(n, _)| n == name).map(|(_, v)| v).collect();
            let got: Vec<_> = headers.get_all(name).collect();
            assert_eq!(got, want, "{name}");
        }
        // A compacted head, reused from the pool, is not rebuilt again.
        let again = headers.capacity();
        compact_headers(&mut headers);
        assert_eq!(headers.capacity(), again);
        // Nor is one that grew for many headers.
        let mut many = header::HeaderMap::new();
        for i in 0..40 {
            many.append(
                header::HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        let cap = many.capacity();
        compact_headers(&mut many);
        assert_eq!(many.capacity(), cap);
    }

    #[test]
    fn hosts_and_origins() {
        let hosts = allowed_hosts(&["relay.example.com:8765".into(), "team.example".into()]);
        for ok in [
            "localhost:8765",
            "127.0.0.1",
            "[::1]:9",
            "relay.example.com:8765",
            "TEAM.example:1",
        ] {
            assert!(host_allowed(&hosts, ok), "{ok}");
        }
        for bad in [
            "evil.example:8765",
            "relay.example.com:80",
            "",
            "127.0.0.2",
            "localhost.evil.example",
        ] {
            assert!(!host_allowed(&hosts, bad), "{bad}");
        }
        assert!(origin_allowed(&hosts, "http://localhost:3000"));
        assert!(origin_allowed(&hosts, "https://team.example"));
        for bad in ["null", "http://evil.example", "file://localhost", "localhost"] {
            assert!(!origin_allowed(&hosts, bad), "{bad}");
        }
    }
}
