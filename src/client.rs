//! A client of a relay over HTTP, for the command line and the stdio MCP bridge: where the
//! relay is (`--relay`/`--token`, `CROSSTALK_URL`/`CROSSTALK_TOKEN`), JSON calls whose error
//! answers become one line, and following a channel's SSE stream across drops and restarts.

use crate::api::{self, Call, Verb};
use crate::ops::channels::ListRequest;
use crate::ops::messages::PostRequest;
use clap::Args;
use crosstalk_schema::{ChannelName, Message, NewMessage};
use futures_util::StreamExt;
use serde_json::Value;
use std::time::Duration;

pub mod served;

/// The relay a client uses when none is named.
pub const DEFAULT_RELAY: &str = "http://127.0.0.1:8765";

/// The data directory of the relay on this machine, whoever starts it (`crosstalk serve` with
/// no `--data-dir`, or the first `crosstalk mcp` in local mode): `crosstalk/store` in the
/// user's data directory (`$XDG_DATA_HOME`, else `~/.local/share` on Linux; the platform's own
/// elsewhere). One place, so `127.0.0.1:8765` serves the same history however it was started.
pub fn local_store_dir() -> Option<std::path::PathBuf> {
    local_data_dir().map(|d| d.join(LOCAL_STORE))
}

/// The local relay's folder: `crosstalk` in the user's data directory. It holds the store
/// ([`LOCAL_STORE`]) and, in local mode, the relay's log and start lock.
pub fn local_data_dir() -> Option<std::path::PathBuf> {
    dirs::data_dir().map(|d| d.join("crosstalk"))
}

/// The store's folder inside the local relay's folder.
pub const LOCAL_STORE: &str = "store";

/// The file in a data directory that says which process serves it: the relay holds an
/// exclusive lock on it while it runs, with its pid written in it.
pub const PID_FILE: &str = "relay.pid";

/// Where the relay is, for every client command.
#[derive(Debug, Clone, Default, Args)]
pub struct RelayArgs {
    /// The relay's URL [env: CROSSTALK_URL] [default: http://127.0.0.1:8765]
    #[arg(long)]
    pub relay: Option<String>,
    /// Bearer token [env: CROSSTALK_TOKEN]
    #[arg(long)]
    pub token: Option<String>,
}

impl RelayArgs {
    /// The URL given by flag or environment, if any.
    pub fn given_url(&self) -> Option<String> {
        self.relay
            .clone()
            .or_else(|| std::env::var("CROSSTALK_URL").ok())
            .filter(|u| !u.trim().is_empty())
    }

    /// The token given by flag or environment, if any.
    pub fn given_token(&self) -> Option<String> {
        self.token_and_origin().map(|(t, _)| t)
    }

    /// The token given by flag or environment, and which of them gave it.
    fn token_and_origin(&self) -> Option<(String, &'static str)> {
        match &self.token {
            Some(t) if !t.is_empty() => Some((t.clone(), "--token")),
            Some(_) => None,
            None => std::env::var("CROSSTALK_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
                .map(|t| (t, "$CROSSTALK_TOKEN")),
        }
    }
}

/// A failure worth one line: the message, and the exit status.
#[derive(Debug)]
pub struct Failure(pub String, pub i32);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string(), 2)
    }
}

/// A call that failed: the relay's error `code` when it answered with one, and the line.
#[derive(Debug)]
pub struct CallError {
    pub code: Option<String>,
    pub failure: Failure,
}

impl CallError {
    /// Whether the relay refused the call as conflicting with what it holds (409 `conflict`).
    pub fn is_conflict(&self) -> bool {
        self.code.as_deref() == Some("conflict")
    }
}

impl From<Failure> for CallError {
    fn from(failure: Failure) -> Self {
        CallError { code: None, failure }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.failure.0)
    }
}

/// TLS for `https://` relays: rustls with ring, installed once per process.
pub fn tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Whether the relay may fetch from `ip` (a webhook's receiver, a client's metadata document):
/// only an address that is globally reachable by the IANA special-purpose address registries
/// of both families. Refused: IPv4's this-network, private, shared (CGNAT), loopback,
/// link-local, IETF protocol, documentation, 6to4-relay, benchmarking (198.18.0.0/15),
/// reserved (240.0.0.0/4), multicast and broadcast space; for IPv6, everything outside global
/// unicast (2000::/3), and inside it the IETF protocol block (Teredo among it),
/// documentation and the SRv6 SIDs. An IPv4 address embedded in an IPv6 one (IPv4-mapped,
/// NAT64's 64:ff9b::/96, 6to4's 2002::/16) is unwrapped and judged as IPv4; the deprecated
/// IPv4-compatible `::a.b.c.d` and IPv4-translated forms are refused outright.
pub fn public(ip: std::net::IpAddr) -> bool {
    use std::net::{IpAddr, Ipv4Addr};
    match ip {
        IpAddr::V4(v4) => {
            let a = u32::from(v4);
            !NOT_PUBLIC_V4
                .iter()
                .any(|&(net, len)| a >> (32 - len) == u32::from(net) >> (32 - len))
        }
        IpAddr::V6(v6) => {
            let a = u128::from(v6);
            let within = |net: u128, len: u32| a >> (128 - len) == net >> (128 - len);
            if let Some(v4) = v6.to_ipv4_mapped() {
                return public(IpAddr::V4(v4));
            }
            // NAT64 (RFC 6052's well-known prefix): the low 32 bits are the IPv4 destination.
            if within(0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96) {
                return public(IpAddr::V4(Ipv4Addr::from(a as u32)));
            }
            // 6to4 (RFC 3056): bits 16..48 are the IPv4 address of the relay that is reached.
            if within(0x2002_0000_0000_0000_0000_0000_0000_0000, 16) {
                return public(IpAddr::V4(Ipv4Addr::from((a >> 80) as u32)));
            }
            within(0x2000_0000_0000_0000_0000_0000_0000_0000, 3)
                && !NOT_PUBLIC_V6_GLOBAL.iter().any(|&(net, len)| within(net, len))
        }
    }
}

/// IPv4 blocks that are not globally reachable (IANA IPv4 Special-Purpose Address Registry,
/// plus multicast), as (network, prefix length).
const NOT_PUBLIC_V4: [(std::net::Ipv4Addr, u32); 16] = {
    use std::net::Ipv4Addr as A;
    [
        (A::new(0, 0, 0, 0), 8),          // "this network"
        (A::new(10, 0, 0, 0), 8),         // private
        (A::new(100, 64, 0, 0), 10),      // shared address space (CGNAT)
        (A::new(127, 0, 0, 0), 8),        // loopback
        (A::new(169, 254, 0, 0), 16),     // link-local (cloud metadata lives here)
        (A::new(172, 16, 0, 0), 12),      // private
        (A::new(192, 0, 0, 0), 24),       // IETF protocol assignments
        (A::new(192, 0, 2, 0), 24),       // TEST-NET-1
        (A::new(192, 88, 99, 0), 24),     // 6to4 relay anycast (deprecated)
        (A::new(192, 168, 0, 0), 16),     // private
        (A::new(198, 18, 0, 0), 15),      // benchmarking
        (A::new(198, 51, 100, 0), 24),    // TEST-NET-2
        (A::new(203, 0, 113, 0), 24),     // TEST-NET-3
        (A::new(224, 0, 0, 0), 4),        // multicast
        (A::new(240, 0, 0, 0), 4),        // reserved for future use
        (A::new(255, 255, 255, 255), 32), // limited broadcast
    ]
};

/// Blocks inside global unicast (2000::/3) that are not globally reachable (IANA IPv6
/// Special-Purpose Address Registry), as (network, prefix length).
const NOT_PUBLIC_V6_GLOBAL: [(u128, u32); 4] = [
    (0x2001_0000_0000_0000_0000_0000_0000_0000, 23), // IETF protocol assignments, Teredo
    (0x2001_0db8_0000_0000_0000_0000_0000_0000, 32), // documentation
    (0x3fff_0000_0000_0000_0000_0000_0000_0000, 20), // documentation (RFC 9637)
    (0x5f00_0000_0000_0000_0000_0000_0000_0000, 16), // SRv6 SIDs
];

/// Why an outbound request the relay makes on someone's say-so cannot be made.
#[derive(Debug)]
pub struct Unreachable {
    pub message: String,
    /// Its host resolves to a loopback or private address, which was not allowed.
    pub private: bool,
}

/// An HTTP client for one request the relay makes on someone's say-so (a client's metadata
/// document, a webhook's delivery): `url`'s host is looked up once and refused if any of its
/// addresses is not [`public`] (unless `allow_private`), and the client connects to the
/// address checked, whatever a second lookup would say; it follows no redirect and gives up
/// after `timeout`.
pub async fn pinned(
    url: &reqwest::Url,
    allow_private: bool,
    timeout: Duration,
    extra_root: Option<&reqwest::Certificate>,
) -> Result<reqwest::Client, Unreachable> {
    let fail = |message: String| Unreachable {
        message,
        private: false,
    };
    let host = url
        .host_str()
        .ok_or_else(|| fail("the URL has no host".into()))?
        .to_owned();
    let bare = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs: Vec<std::net::SocketAddr> =
        tokio::time::timeout(timeout, tokio::net::lookup_host((bare.as_str(), port)))
            .await
            .map_err(|_| fail(format!("looking up {host} took too long")))?
            .map_err(|e| fail(format!("cannot look up {host}: {e}")))?
            .collect();
    let addr = *addrs.first().ok_or_else(|| fail(format!("{host} has no address")))?;
    if !allow_private {
        if let Some(bad) = addrs.iter().find(|a| !public(a.ip())) {
            return Err(Unreachable {
                message: format!("{host} resolves to {}, which is not a public address", bad.ip()),
                private: true,
            });
        }
    }
    tls();
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(3)))
        .user_agent(concat!("crosstalk/", env!("CARGO_PKG_VERSION")))
        .resolve(&bare, addr);
    if let Some(root) = extra_root {
        b = b.add_root_certificate(root.clone());
    }
    b.build().map_err(|e| fail(e.to_string()))
}

/// What following a channel reports.
pub enum Followed {
    /// The stream is open (again).
    Connected,
    /// A message after the last one reported, in id order, never twice.
    Message(Box<Message>),
    /// The stream dropped; it is being reopened.
    Dropped,
}

#[derive(Clone)]
pub struct RelayClient {
    pub http: reqwest::Client,
    pub base: String,
    pub token: Option<String>,
    /// Where the token came from (`--token`, `$CROSSTALK_TOKEN`), for a refusal of it.
    token_origin: &'static str,
}

impl RelayClient {
    pub fn new(relay: &RelayArgs) -> Result<RelayClient, Failure> {
        let base = relay.given_url().unwrap_or_else(|| DEFAULT_RELAY.into());
        let (token, origin) = relay.token_and_origin().unzip();
        let mut c = Self::at(&base, token)?;
        c.token_origin = origin.unwrap_or(c.token_origin);
        Ok(c)
    }

    /// A client of the relay at `base`: the relay's own address, `http://host:port`, which
    /// its REST API, `/healthz` and `/mcp` hang from. An MCP endpoint given in its place is
    /// refused with the address to give.
    pub fn at(base: &str, token: Option<String>) -> Result<RelayClient, Failure> {
        tls();
        let base = base.trim_end_matches('/').to_owned();
        let parsed = reqwest::Url::parse(&base).map_err(|e| Failure(format!("bad relay URL {base:?}: {e}"), 2))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Failure(format!("bad relay URL {base:?}: use http:// or https://"), 2));
        }
        let path = parsed.path().trim_end_matches('/');
        if let Some(root) = ["/cc/mcp", "/mcp"].iter().find_map(|p| path.strip_suffix(p)) {
            let mut origin = parsed.clone();
            origin.set_path(root);
            origin.set_query(None);
            return Err(Failure(
                format!(
                    "{base} is the relay's MCP endpoint; give the relay's own address instead: --relay {}",
                    origin.as_str().trim_end_matches('/')
                ),
                2,
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(RelayClient {
            http,
            base,
            token,
            token_origin: "the token",
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Sends a request and reads its JSON answer; an error answer is a one-line failure.
    pub async fn json(&self, req: reqwest::RequestBuilder) -> Result<Value, Failure> {
        let r = self.auth(req).send().await.map_err(|e| self.unreachable(&e))?;
        if !r.status().is_success() {
            return Err(self.refused(r).await);
        }
        Ok(r.json().await.unwrap_or(Value::Null))
    }

    /// A request that got no answer, as one line with what to do: TLS spoken to a relay that
    /// speaks plain HTTP is named as that, not as the TLS library's "corrupt message".
    pub fn unreachable(&self, e: &reqwest::Error) -> Failure {
        Failure(
            format!("cannot reach the relay at {}: {}", self.base, self.why_unreachable(e)),
            2,
        )
    }

    /// Why a request got no answer, in a few words and, where there is one, the remedy.
    pub fn why_unreachable(&self, e: &reqwest::Error) -> String {
        if self.base.starts_with("https://") && not_tls(e) {
            return format!(
                "it answers in plain HTTP, not TLS: use --relay {}",
                self.base.replacen("https://", "http://", 1)
            );
        }
        root(e)
    }

    /// The relay's `/healthz`, which any relay answers (a store that fails says so there).
    pub async fn health(&self) -> Result<reqwest::Response, reqwest::Error> {
        self.http.get(self.url("/healthz")).send().await
    }

    /// An error answer from the relay, as one line. A 401 says how the command line sends a
    /// token (not the `Authorization` header a program would).
    pub async fn refused(&self, r: reqwest::Response) -> Failure {
        self.refusal(r).await.failure
    }

    /// An error answer from the relay: its `code`, and the line to show.
    pub async fn refusal(&self, r: reqwest::Response) -> CallError {
        if r.status() != reqwest::StatusCode::UNAUTHORIZED {
            return refusal(r).await;
        }
        let code = r
            .json::<Value>()
            .await
            .ok()
            .and_then(|b| b["code"].as_str().map(str::to_owned));
        let why = match &self.token {
            None => "the relay needs a token: pass --token TOKEN, or set CROSSTALK_TOKEN (the relay's \
                     --token, or a participant's)"
                .to_owned(),
            Some(_) => format!(
                "the relay refused {}: it is neither the relay's --token nor a participant's (check \
                 --token and CROSSTALK_TOKEN)",
                self.token_origin
            ),
        };
        CallError {
            code,
            failure: Failure(format!("the relay answered 401 Unauthorized: {why}"), 2),
        }
    }

    /// Calls `route` with `request`, answering the route's answer as a client reads it
    /// ([`crate::api::Wire`]); an error answer is a one-line failure.
    pub async fn call<C: Call>(&self, route: C, request: &C::Request) -> Result<C::Read, Failure> {
        self.call_with(route, request, |r| r).await
    }

    /// [`RelayClient::call`], telling an error answer's `code` apart (a `conflict` from
    /// anything else) instead of reading it out of the line.
    pub async fn try_call<C: Call>(&self, route: C, request: &C::Request) -> Result<C::Read, CallError> {
        self.try_call_with(route, request, |r| r).await
    }

    /// [`RelayClient::call`], with `extra` adding to the request (a header).
    pub async fn call_with<C: Call>(
        &self,
        route: C,
        request: &C::Request,
        extra: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<C::Read, Failure> {
        self.try_call_with(route, request, extra).await.map_err(|e| e.failure)
    }

    /// The one way a call is made: [`RelayClient::try_call`] with `extra` adding to the request.
    async fn try_call_with<C: Call>(
        &self,
        route: C,
        request: &C::Request,
        extra: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<C::Read, CallError> {
        let req = extra(self.request(route, request)?);
        let r = self.auth(req).send().await.map_err(|e| self.unreachable(&e))?;
        if !r.status().is_success() {
            return Err(self.refusal(r).await);
        }
        Ok(self.answer(route, r).await?)
    }

    /// [`RelayClient::call`] for a route that answers 404 when what it names does not exist:
    /// `None` then.
    pub async fn call_found<C: Call>(&self, route: C, request: &C::Request) -> Result<Option<C::Read>, Failure> {
        let r = self
            .auth(self.request(route, request)?)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        self.answer(route, r).await.map(Some)
    }

    /// `route`'s answer `r`, read as a client reads it; an error answer is a one-line failure,
    /// and an empty one reads as JSON's `null` (so as `()`).
    pub async fn answer<C: Call>(&self, route: C, r: reqwest::Response) -> Result<C::Read, Failure> {
        if !r.status().is_success() {
            return Err(self.refused(r).await);
        }
        let bytes = r.bytes().await.map_err(|e| self.unreachable(&e))?;
        let json: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"null"
        } else {
            &bytes
        };
        serde_json::from_slice(json).map_err(|e| {
            Failure(
                format!(
                    "the relay's answer to {} {} is not what this client reads: {e}",
                    route.verb().as_str(),
                    route.path()
                ),
                2,
            )
        })
    }

    /// The HTTP request for `route` with `request`: the request's fields that the path names
    /// go in the path, the others in the query (GET, DELETE) or in the JSON body (POST).
    pub fn request<C: Call>(&self, route: C, request: &C::Request) -> Result<reqwest::RequestBuilder, Failure> {
        let Value::Object(mut fields) = serde_json::to_value(request)? else {
            return Err(Failure(format!("{} takes an object", route.path()), 2));
        };
        fields.retain(|_, v| !v.is_null());
        let template = route.path();
        let mut path = String::with_capacity(template.len() + 32);
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let close = rest[open..].find('}').map_or(rest.len(), |c| open + c);
            let name = &rest[open + 1..close];
            let value = match fields.remove(name) {
                Some(Value::String(s)) => s,
                Some(other) => other.to_string(),
                None => return Err(Failure(format!("{template} needs {name}"), 2)),
            };
            path.push_str(&rest[..open]);
            path.push_str(&segment(&value));
            rest = &rest[(close + 1).min(rest.len())..];
        }
        path.push_str(rest);
        let url = self.url(&path);
        Ok(match route.verb() {
            Verb::Post => self.http.post(url).json(&fields),
            verb => {
                let query = serde_urlencoded::to_string(&fields)?;
                let url = if query.is_empty() {
                    url
                } else {
                    format!("{url}?{query}")
                };
                match verb {
                    Verb::Delete => self.http.delete(url),
                    _ => self.http.get(url),
                }
            }
        })
    }

    /// Posts `message` to `channel`.
    pub async fn post(&self, channel: &ChannelName, message: NewMessage) -> Result<Message, Failure> {
        let request = PostRequest {
            channel: channel.clone(),
            message,
        };
        self.call(api::POST, &request).await
    }

    /// The id of the channel's newest message (0 for an empty or unknown channel).
    pub async fn newest(&self, channel: &ChannelName) -> Result<u64, Failure> {
        let list = self.call(api::LIST_CHANNELS, &ListRequest::default()).await?;
        Ok(list
            .iter()
            .find(|c| c.channel == channel.as_str())
            .map_or(0, |c| c.last_id))
    }

    /// Follows `channel`'s SSE stream from after `since`, reconnecting with `Last-Event-ID`
    /// (backoff 0.2 s doubling to 5 s) so nothing is missed or reported twice. Ends only with
    /// its caller, or with a refusal (4xx), or if the very first connection cannot be made.
    pub async fn follow(&self, channel: &ChannelName, since: u64, mut on: impl FnMut(Followed)) -> Result<(), Failure> {
        use eventsource_stream::Eventsource;
        let mut last = since;
        let mut backoff = Duration::from_millis(200);
        let mut connected = false;
        loop {
            let path = format!("/api/channels/{}/stream?since_id={last}", segment(channel.as_str()));
            let req = self
                .auth(self.http.get(self.url(&path)))
                .header("Last-Event-ID", last.to_string());
            match req.send().await {
                Ok(r) if r.status().is_success() => {
                    connected = true;
                    backoff = Duration::from_millis(200);
                    on(Followed::Connected);
                    let mut events = r.bytes_stream().eventsource();
                    while let Some(Ok(ev)) = events.next().await {
                        if ev.event != "message" {
                            continue;
                        }
                        let Ok(m) = serde_json::from_str::<Message>(&ev.data) else {
                            continue;
                        };
                        if m.id <= last {
                            continue;
                        }
                        last = m.id;
                        on(Followed::Message(Box::new(m)));
                    }
                    on(Followed::Dropped);
                }
                Ok(r) if r.status().is_client_error() => return Err(self.refused(r).await),
                Err(e) if !connected => return Err(self.unreachable(&e)),
                Ok(_) | Err(_) => {}
            }
            // Dropped (or the relay restarts): back off, then resume after the last id seen.
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// An error answer from the relay, as one line.
pub async fn refused(r: reqwest::Response) -> Failure {
    refusal(r).await.failure
}

/// An error answer from the relay: its `code`, and the line to show.
async fn refusal(r: reqwest::Response) -> CallError {
    let status = r.status();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    let why = body["error"].as_str().unwrap_or("no details");
    CallError {
        code: body["code"].as_str().map(str::to_owned),
        failure: Failure(format!("the relay answered {status}: {why}"), 2),
    }
}

/// Whether a TLS handshake failed because the other side does not speak TLS: its first
/// bytes are no TLS record (rustls's `InvalidContentType`, as plain HTTP's answer reads).
fn not_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        // An io::Error's `source` skips the error it wraps (often another io::Error): open
        // each layer instead.
        let mut layer = err;
        while let Some(inner) = layer.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            layer = inner;
        }
        if let Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) =
            layer.downcast_ref::<rustls::Error>()
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The innermost cause of an error: "Connection refused", not three layers of wrapping.
pub fn root(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// `s` as one word of a POSIX shell command: as it is when that is safe, else quoted.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:=@,".contains(c)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `s` as one URL query value.
pub fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// `s` as one URL path segment: every byte but letters, digits and `-._~` escaped (the relay
/// decodes `%2F`, `%25` and `%2B` in a parameter itself, so none of them can split it).
pub fn segment(s: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::public;

    mod typed {
        use crate::api;
        use crate::client::RelayClient;
        use crate::ops::messages::{PostRequest, RoleArg, WaitRequest};
        use crate::ops::shared::GetDataRequest;
        use crosstalk_schema::{ChannelName, NewMessage};

        fn client() -> RelayClient {
            RelayClient::at("http://127.0.0.1:9", None).unwrap_or_else(|f| panic!("{}", f.0))
        }

        /// A GET puts the fields the path names in the path (escaped, so a `/` or `%` in a
        /// key cannot split it), the others in the query, and leaves out what is not set.
        #[test]
        fn a_get_fills_the_path_and_the_query() {
            let request = WaitRequest {
                channel: ChannelName::parse("dev").unwrap(),
                since_id: 7,
                limit: None,
                timeout_s: Some(2.5),
                instance_id: Some("a b&c".into()),
                role: RoleArg::default(),
                exclude_self: None,
            };
            let built = client().request(api::WAIT, &request).unwrap().build().unwrap();
            assert_eq!(built.method(), reqwest::Method::GET);
            assert_eq!(built.url().path(), "/api/channels/dev/wait");
            let mut query: Vec<(String, String)> = built.url().query_pairs().into_owned().collect();
            query.sort();
            let want = [
                ("instance_id", "a b&c"),
                ("role", "active"),
                ("since_id", "7"),
                ("timeout_s", "2.5"),
            ];
            assert_eq!(
                query,
                want.map(|(k, v)| (k.to_owned(), v.to_owned())).to_vec(),
                "{}",
                built.url()
            );
            let key = GetDataRequest {
                key: "plans/v1%+x".into(),
                version: None,
            };
            let built = client().request(api::GET_DATA, &key).unwrap().build().unwrap();
            assert_eq!(built.url().path(), "/api/data/plans%2Fv1%25%2Bx");
            assert_eq!(built.url().query(), None);
        }

        /// A POST puts the fields the path names in the path and the others in a JSON body.
        #[test]
        fn a_post_fills_the_path_and_the_body() {
            let request = PostRequest {
                channel: ChannelName::parse("ops").unwrap(),
                message: NewMessage {
                    sender: "ci".into(),
                    body: "green".into(),
                    reply_to: Some(3),
                    ..NewMessage::default()
                },
            };
            let built = client().request(api::POST, &request).unwrap().build().unwrap();
            assert_eq!(built.method(), reqwest::Method::POST);
            assert_eq!(built.url().as_str(), "http://127.0.0.1:9/api/channels/ops/messages");
            let body: serde_json::Value =
                serde_json::from_slice(built.body().and_then(|b| b.as_bytes()).unwrap()).unwrap();
            assert_eq!(
                body,
                serde_json::json!({"sender": "ci", "body": "green", "reply_to": 3})
            );
        }
    }

    /// The filter as a table: every special-purpose block of both registries, the embedded
    /// IPv4 forms, and public addresses on either side of each edge. No connection is made.
    #[test]
    fn only_globally_reachable_addresses_are_public() {
        let refused = [
            // IPv4
            "0.0.0.0",
            "0.255.255.255",
            "10.0.0.1",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "250.1.2.3",
            "255.255.255.255",
            // IPv6
            "::",
            "::1",
            "::127.0.0.1",      // IPv4-compatible (deprecated)
            "::8.8.8.8",        // IPv4-compatible, even of a public address
            "::ffff:0:8.8.8.8", // IPv4-translated
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::10.0.0.1",
            "64:ff9b::127.0.0.1",
            "64:ff9b::169.254.169.254",
            "64:ff9b:1::8.8.8.8", // local-use NAT64
            "100::1",
            "2001::1", // Teredo
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:2::1",  // benchmarking
            "2001:10::1", // ORCHID
            "2001:db8::1",
            "2002:0a00:0001::1", // 6to4 of 10.0.0.1
            "2002:7f00:0001::1", // 6to4 of 127.0.0.1
            "2002:c0a8:0101::",  // 6to4 of 192.168.1.1
            "3fff::1",
            "5f00::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "1000::1", // unassigned, outside global unicast
            "4000::1",
        ];
        for ip in refused {
            assert!(!public(ip.parse().unwrap()), "{ip} must not be public");
        }
        let allowed = [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:0808:0808::1", // 6to4 of 8.8.8.8
            "2001:200::1",       // just past 2001::/23
            "2001:db9::1",
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
            "3ffe:ffff::1",
        ];
        for ip in allowed {
            assert!(public(ip.parse().unwrap()), "{ip} must be public");
        }
    }
}
