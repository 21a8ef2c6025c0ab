//! The relay as its own OAuth 2.1 authorization server (`crosstalk serve --oauth`): invites,
//! client registration, authorization codes with PKCE, access and refresh tokens, revocation.
//! The rules live here, once; the HTTP endpoints are the `oauth` face (`crate::oauth`), the
//! bearer check is the auth middleware's ([`OAuth::verify`]), and the records go through the
//! store seam ([`crosstalk_actors::records::RecordStore`]), so they live on sled or in the
//! cluster's buckets alike. Every secret is random (256 bits from the system RNG) and stored
//! only as its SHA-256; a lookup goes by that hash.
//!
//! - An invite is single use ([`RecordStore::take`]), expires, and may bind an identity: the
//!   tokens of a grant made with `--as worker-7` act only as `worker-7`.
//! - An authorization code is single use, lives two minutes, and is bound to its client,
//!   redirect URI, PKCE challenge (S256 only) and resource.
//! - A refresh token is single use too: each refresh rotates both tokens; a retired refresh
//!   token coming back ends the grant (it was stolen, or replayed).

use super::{hex, Principal};
use crosstalk_actors::records::{Kind, RecordStore};
use crosstalk_actors::RelayError;
use crosstalk_schema::oauth::{AuthCode, Grant, Invite, OAuthClient, TokenKind, TokenRef};
use crosstalk_schema::{codec, Timestamp};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// The one scope: the relay's tools and routes.
pub const SCOPE: &str = "crosstalk";
/// How long an access token is good for.
pub const ACCESS_TTL: Duration = Duration::from_secs(3600);
/// How long a refresh token is good for unused (each refresh starts a new period).
pub const REFRESH_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long an authorization code is good for.
pub const CODE_TTL: Duration = Duration::from_secs(120);
/// Default and longest life of an invite.
pub const INVITE_TTL: Duration = Duration::from_secs(24 * 3600);
pub const MAX_INVITE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Prefix of access tokens: the auth middleware sends these to [`OAuth::verify`].
pub const ACCESS_PREFIX: &str = "ct_at_";
const REFRESH_PREFIX: &str = "ct_rt_";
const CODE_PREFIX: &str = "ct_ac_";
const CLIENT_PREFIX: &str = "ct_c_";
/// Redirect URIs one client may register, and the longest one (real callbacks are under a
/// hundred bytes).
pub const MAX_REDIRECT_URIS: usize = 10;
pub const MAX_REDIRECT_URI_BYTES: usize = 512;
/// The longest `client_name`, in characters.
pub const MAX_CLIENT_NAME_CHARS: usize = 200;
/// Registered clients the relay keeps; past it, those a day old that never got a grant are
/// dropped to make room (registration needs no token, so it must not grow the store forever).
/// With each registration's size bounded too, what they cost is bounded (docs/benchmarks.md,
/// "Measurements behind design choices").
pub const MAX_CLIENTS: usize = 10_000;
pub const UNUSED_CLIENT_TTL: Duration = Duration::from_secs(24 * 3600);

/// How often a request that outlives the check at its start (an SSE stream, a long-poll, an
/// MCP stream or wait, a task) has its credential checked again: a revoked, expired or
/// rotated-away token's streams and waits end within about this long.
pub const RECHECK: Duration = Duration::from_secs(1);
/// Verdicts [`OAuth::still_good`] keeps before it forgets old ones.
const MAX_VERDICTS: usize = 10_000;

/// Compare-and-set attempts on one record before a change is given up as contended.
const CHANGE_ATTEMPTS: u32 = 16;
/// Retired refresh tokens a grant remembers, for reuse detection.
const MAX_RETIRED: usize = 16;

/// Waits before another attempt at a change that lost its compare-and-set, a little longer
/// each time (1, 2, 4 … 32 ms), so that racing requests on two nodes do not keep colliding.
async fn backoff(attempt: u32) {
    tokio::time::sleep(Duration::from_millis(1 << attempt.min(5))).await;
}

/// A change that lost every compare-and-set.
fn contended() -> OAuthError {
    OAuthError::new(
        503,
        "temporarily_unavailable",
        "the connection is being changed by other requests; try again",
    )
}

/// A record as read, with its stored bytes: what a compare-and-set expects.
struct Read<T> {
    value: T,
    bytes: Vec<u8>,
}

/// What a good access token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub principal: Principal,
    pub credential: Credential,
}

/// The OAuth grant a request's token belongs to, and the token (its hash): what a request
/// that outlives the check at its start is checked against again, and what a task made by
/// it ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub grant: String,
    pub token: String,
}

/// An OAuth error as RFC 6749 §5.2 names it, with the status to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthError {
    pub status: u16,
    pub error: &'static str,
    pub description: String,
}

impl OAuthError {
    pub fn new(status: u16, error: &'static str, description: impl Into<String>) -> Self {
        OAuthError {
            status,
            error,
            description: description.into(),
        }
    }

    fn bad(error: &'static str, description: impl Into<String>) -> Self {
        Self::new(400, error, description)
    }

    fn server(e: RelayError) -> Self {
        let status = match e {
            RelayError::Store(_) | RelayError::StoreUnavailable(_) | RelayError::Unavailable(_) => 503,
            _ => 500,
        };
        Self::new(status, "server_error", e.to_string())
    }
}

/// Tokens as the token endpoint answers them.
#[derive(Debug, Clone)]
pub struct Tokens {
    pub access_token: String,
    pub refresh_token: String,
    pub expires_in: u64,
    pub scope: String,
}

/// What `POST /api/oauth/invites` takes: who the invite's tokens act as, how long it lasts, and
/// a note for the admin.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviteRequest {
    #[serde(rename = "as")]
    pub identity: Option<String>,
    pub expires_in_s: Option<u64>,
    pub note: Option<String>,
}

/// The connections `GET /api/oauth/clients` lists.
#[derive(Debug, Serialize, Deserialize)]
pub struct GrantList {
    pub clients: Vec<GrantView>,
}

/// Which client `DELETE /api/oauth/clients` revokes every connection of.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClientQuery {
    pub client_id: String,
}

/// How many connections a revocation ended.
#[derive(Debug, Serialize, Deserialize)]
pub struct Revoked {
    pub revoked: usize,
}

/// Which connection `DELETE /api/oauth/clients/{grant}` revokes.
#[derive(Debug, Serialize, Deserialize)]
pub struct GrantId {
    pub grant: String,
}

/// A new invite: the code (shown once) and what it grants.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NewInvite {
    /// Type it into the consent page. Shown once; the relay keeps only its hash.
    pub code: String,
    pub invite_id: String,
    /// The identity its tokens act as (none: anyone, but never the admin).
    #[serde(rename = "as")]
    pub identity: Option<String>,
    pub expires_at: String,
}

/// A grant as `crosstalk clients` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GrantView {
    pub grant: String,
    pub client_id: String,
    pub client_name: String,
    pub redirect_host: String,
    #[serde(rename = "as")]
    pub identity: Option<String>,
    pub invite_id: String,
    pub created_at: String,
}

impl From<&Grant> for GrantView {
    fn from(g: &Grant) -> Self {
        GrantView {
            grant: g.id.clone(),
            client_id: g.client_id.clone(),
            client_name: g.client_name.clone(),
            redirect_host: g.redirect_host.clone(),
            identity: g.identity.clone(),
            invite_id: g.invite_id.clone(),
            created_at: Timestamp(g.created_at * 1_000_000).to_rfc3339(),
        }
    }
}

/// The relay's authorization server: its issuer (the public URL) and where it keeps records.
#[derive(Clone)]
pub struct OAuth {
    /// The relay's public origin, `scheme://host[:port]` without a trailing slash: the issuer,
    /// and the base of every endpoint and resource.
    pub issuer: String,
    store: Arc<dyn RecordStore>,
    /// [`MAX_CLIENTS`] (smaller in tests).
    max_clients: usize,
    /// The registered clients by age, so that making room reads none of them.
    clients: Arc<tokio::sync::Mutex<ByAge>>,
    /// Whether each token (`t<hash>`) or grant (`g<id>`) long-lived requests hold is still
    /// good, and when that was read: one read per [`RECHECK`] however many hold it.
    verdicts: Arc<parking_lot::Mutex<std::collections::HashMap<String, (std::time::Instant, bool)>>>,
}

/// Registered clients as this node knows them, oldest first: read from the store at the first
/// registration after a start, then kept as this node registers and drops them. On a cluster
/// each node knows the clients there were when it started and those it registered since.
#[derive(Default)]
struct ByAge {
    loaded: bool,
    /// `(created_at, client_id)`.
    clients: std::collections::BTreeSet<(i64, String)>,
}

fn now() -> i64 {
    Timestamp::now().0 / 1_000_000
}

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> String {
    use ring::rand::SecureRandom;
    let mut bytes = vec![0u8; n];
    // The system RNG does not fail on Linux once booted; if it did, a token must not be made.
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system's random number generator works");
    hex(&bytes)
}

/// The key a secret is stored under: its SHA-256, in hex.
pub fn hash(secret: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref())
}

/// The PKCE S256 transform (RFC 7636 §4.2): BASE64URL(SHA256(verifier)), unpadded.
pub fn s256(verifier: &str) -> String {
    base64url(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref())
}

fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len() * 4 / 3 + 2);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A PKCE verifier or challenge: 43 to 128 unreserved characters (RFC 7636 §4.1).
pub fn pkce_shaped(s: &str) -> bool {
    (43..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// An invite code as people type it: ten letters and digits of Crockford's base32 (no I, L,
/// O, U), shown as `ABCDE-FGHJK`; typed back in any case, with or without the dash.
fn invite_code() -> String {
    const A: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 10];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system's random number generator works");
    let s: String = bytes.iter().map(|b| A[(b & 31) as usize] as char).collect();
    format!("{}-{}", &s[..5], &s[5..])
}

/// What an invite code is stored under, however it was typed.
fn invite_key(typed: &str) -> String {
    let norm: String = typed
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            c => c,
        })
        .collect();
    hash(&format!("invite:{norm}"))
}

/// Whether `uri` may be a redirect URI: absolute, no fragment, HTTPS, or plain HTTP to a
/// loopback address (a native client's local listener, RFC 8252 §7.3).
pub fn redirect_uri_ok(uri: &str) -> bool {
    let Ok(u) = uri.parse::<http::Uri>() else {
        return false;
    };
    if uri.contains('#') || u.host().is_none() {
        return false;
    }
    match u.scheme_str() {
        Some("https") => true,
        Some("http") => is_loopback(u.host().unwrap_or("")),
        _ => false,
    }
}

/// The host a URI names ("" if none): what a consent page and a grant show of a redirect.
pub fn host_of(uri: &str) -> String {
    uri.parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_owned))
        .unwrap_or_default()
}

pub fn is_loopback(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "[::1]" | "::1")
}

/// Whether `given` matches the registered `registered`: exactly, except that a loopback
/// HTTP URI may name any port (RFC 8252 §7.3: native clients listen where they can).
pub fn redirect_matches(registered: &str, given: &str) -> bool {
    if registered == given {
        return true;
    }
    let (Ok(r), Ok(g)) = (registered.parse::<http::Uri>(), given.parse::<http::Uri>()) else {
        return false;
    };
    r.scheme_str() == Some("http")
        && g.scheme_str() == Some("http")
        && r.host().is_some_and(is_loopback)
        && r.host() == g.host()
        && r.path_and_query() == g.path_and_query()
}

fn encode<T: crosstalk_schema::Stored>(value: &T) -> Vec<u8> {
    codec::encode(value)
}

fn decode<T: crosstalk_schema::Stored>(what: &str, bytes: &[u8]) -> Result<T, OAuthError> {
    codec::decode(bytes).map_err(|e| OAuthError::new(500, "server_error", format!("a stored {what} is damaged: {e}")))
}

impl OAuth {
    pub fn new(issuer: String, store: Arc<dyn RecordStore>) -> Self {
        OAuth {
            issuer: issuer.trim_end_matches('/').to_owned(),
            store,
            max_clients: MAX_CLIENTS,
            clients: Default::default(),
            verdicts: Default::default(),
        }
    }

    /// This relay's resource identifiers (RFC 8707): its origin, `/mcp` and `/cc/mcp`.
    pub fn resources(&self) -> [String; 3] {
        [
            self.issuer.clone(),
            format!("{}/mcp", self.issuer),
            format!("{}/cc/mcp", self.issuer),
        ]
    }

    /// `resource` if it names this relay (scheme and host in any case, one trailing slash
    /// either way), as the relay's own spelling.
    pub fn resource(&self, resource: Option<&str>) -> Result<String, OAuthError> {
        let Some(r) = resource.map(str::trim).filter(|r| !r.is_empty()) else {
            return Ok(self.issuer.clone());
        };
        let norm = |s: &str| {
            let s = s.trim_end_matches('/');
            match s.split_once("://") {
                Some((scheme, rest)) => {
                    let (host, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
                    let path = if path.is_empty() {
                        String::new()
                    } else {
                        format!("/{path}")
                    };
                    format!("{}://{}{path}", scheme.to_ascii_lowercase(), host.to_ascii_lowercase())
                }
                None => s.to_owned(),
            }
        };
        let want = norm(r);
        self.resources()
            .into_iter()
            .find(|mine| norm(mine) == want)
            .ok_or_else(|| {
                OAuthError::bad(
                    "invalid_target",
                    format!(
                        "resource {r:?} is not this relay (it serves {})",
                        self.resources().join(", ")
                    ),
                )
            })
    }

    async fn get<T: crosstalk_schema::Stored>(
        &self,
        kind: Kind,
        key: &str,
        what: &str,
    ) -> Result<Option<T>, OAuthError> {
        match self.store.get(kind, key.to_owned()).await.map_err(OAuthError::server)? {
            Some(bytes) => Ok(Some(decode(what, &bytes)?)),
            None => Ok(None),
        }
    }

    async fn put<T: crosstalk_schema::Stored>(&self, kind: Kind, key: &str, value: &T) -> Result<(), OAuthError> {
        self.store
            .put(kind, key.to_owned(), encode(value))
            .await
            .map_err(OAuthError::server)
    }

    async fn take<T: crosstalk_schema::Stored>(
        &self,
        kind: Kind,
        key: &str,
        what: &str,
    ) -> Result<Option<T>, OAuthError> {
        match self
            .store
            .take(kind, key.to_owned())
            .await
            .map_err(OAuthError::server)?
        {
            Some(bytes) => Ok(Some(decode(what, &bytes)?)),
            None => Ok(None),
        }
    }

    async fn read<T: crosstalk_schema::Stored>(
        &self,
        kind: Kind,
        key: &str,
        what: &str,
    ) -> Result<Option<Read<T>>, OAuthError> {
        match self.store.get(kind, key.to_owned()).await.map_err(OAuthError::server)? {
            Some(bytes) => Ok(Some(Read {
                value: decode(what, &bytes)?,
                bytes,
            })),
            None => Ok(None),
        }
    }

    /// The store's compare-and-set: writes `new` (`None`: deletes) if the record is still
    /// `expected` (`None`: absent).
    async fn swap(
        &self,
        kind: Kind,
        key: &str,
        expected: Option<Vec<u8>>,
        new: Option<Vec<u8>>,
    ) -> Result<bool, OAuthError> {
        self.store
            .swap(kind, key.to_owned(), expected, new)
            .await
            .map_err(OAuthError::server)
    }

    async fn delete(&self, kind: Kind, key: &str) -> Result<(), OAuthError> {
        self.store
            .delete(kind, key.to_owned())
            .await
            .map_err(OAuthError::server)
    }

    // ---- invites

    /// Mints an invite, good for `ttl` (default a day, at most 30), binding `identity` if
    /// given.
    pub async fn invite(
        &self,
        identity: Option<String>,
        ttl: Option<Duration>,
        note: Option<String>,
    ) -> Result<NewInvite, OAuthError> {
        let ttl = ttl.unwrap_or(INVITE_TTL);
        if ttl.is_zero() || ttl > MAX_INVITE_TTL {
            return Err(OAuthError::bad(
                "invalid_request",
                "an invite lasts more than 0 s and at most 30 days",
            ));
        }
        let identity = identity.map(|i| i.trim().to_owned()).filter(|i| !i.is_empty());
        if let Some(i) = &identity {
            crosstalk_schema::InstanceId::parse(i).map_err(|e| OAuthError::bad("invalid_request", e.to_string()))?;
        }
        let code = invite_code();
        let now = now();
        let invite = Invite {
            id: random_hex(6),
            identity,
            created_at: now,
            expires_at: now + ttl.as_secs() as i64,
            note,
        };
        self.put(Kind::Invites, &invite_key(&code), &invite).await?;
        Ok(NewInvite {
            code,
            invite_id: invite.id.clone(),
            identity: invite.identity.clone(),
            expires_at: Timestamp(invite.expires_at * 1_000_000).to_rfc3339(),
        })
    }

    /// Uses up the invite typed in: `None` if there is no such invite, it was used, or it
    /// expired. Of two consents racing with one code, one gets it.
    pub async fn redeem(&self, typed: &str) -> Result<Option<Invite>, OAuthError> {
        let invite: Option<Invite> = self.take(Kind::Invites, &invite_key(typed), "invite").await?;
        Ok(invite.filter(|i| i.expires_at > now()))
    }

    // ---- clients

    /// Registers a client (RFC 7591): public, `none` authentication, its redirect URIs.
    pub async fn register(&self, name: Option<String>, redirect_uris: Vec<String>) -> Result<OAuthClient, OAuthError> {
        if redirect_uris.is_empty() || redirect_uris.len() > MAX_REDIRECT_URIS {
            return Err(OAuthError::bad(
                "invalid_redirect_uri",
                format!("redirect_uris needs 1 to {MAX_REDIRECT_URIS} URIs"),
            ));
        }
        if let Some(long) = redirect_uris.iter().find(|u| u.len() > MAX_REDIRECT_URI_BYTES) {
            return Err(OAuthError::bad(
                "invalid_redirect_uri",
                format!(
                    "a redirect URI is {} bytes; the relay takes at most {MAX_REDIRECT_URI_BYTES}",
                    long.len()
                ),
            ));
        }
        if let Some(bad) = redirect_uris.iter().find(|u| !redirect_uri_ok(u)) {
            return Err(OAuthError::bad(
                "invalid_redirect_uri",
                format!("{bad:?} is not a redirect URI this relay sends codes to: use https://, or http:// to a loopback address"),
            ));
        }
        let client_name = name.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty());
        if let Some(n) = client_name
            .as_ref()
            .filter(|n| n.chars().count() > MAX_CLIENT_NAME_CHARS)
        {
            return Err(OAuthError::bad(
                "invalid_client_metadata",
                format!(
                    "client_name is {} characters; the relay takes at most {MAX_CLIENT_NAME_CHARS}",
                    n.chars().count()
                ),
            ));
        }
        let mut by_age = self.clients.lock().await;
        if !by_age.loaded {
            self.load_clients(&mut by_age).await?;
        }
        if by_age.clients.len() >= self.max_clients {
            self.make_room(&mut by_age).await?;
        }
        let client = OAuthClient {
            client_id: format!("{CLIENT_PREFIX}{}", random_hex(16)),
            client_name: client_name.unwrap_or_else(|| "unnamed client".to_owned()),
            redirect_uris,
            created_at: now(),
        };
        self.put(Kind::Clients, &client.client_id, &client).await?;
        by_age.clients.insert((client.created_at, client.client_id.clone()));
        Ok(client)
    }

    /// Reads every stored client's age: once, at the first registration after a start.
    async fn load_clients(&self, by_age: &mut ByAge) -> Result<(), OAuthError> {
        for (id, bytes) in self.store.list(Kind::Clients).await.map_err(OAuthError::server)? {
            let c: OAuthClient = decode("client", &bytes)?;
            by_age.clients.insert((c.created_at, id));
        }
        by_age.loaded = true;
        Ok(())
    }

    /// At [`MAX_CLIENTS`], drops the registrations a day old that never got a grant, oldest
    /// first from the index, reading no client; refuses if that frees nothing.
    async fn make_room(&self, by_age: &mut ByAge) -> Result<(), OAuthError> {
        let old = now() - UNUSED_CLIENT_TTL.as_secs() as i64;
        let aged: Vec<(i64, String)> = by_age.clients.iter().take_while(|(at, _)| *at < old).cloned().collect();
        let mut freed = 0;
        if !aged.is_empty() {
            let granted: std::collections::HashSet<String> =
                self.grants().await?.into_iter().map(|g| g.client_id).collect();
            for entry in aged.into_iter().filter(|(_, id)| !granted.contains(id)) {
                self.delete(Kind::Clients, &entry.1).await?;
                by_age.clients.remove(&entry);
                freed += 1;
            }
        }
        tracing::info!(freed, "dropped client registrations a day old that never connected");
        if freed == 0 {
            return Err(OAuthError::new(
                503,
                "temporarily_unavailable",
                format!(
                    "the relay holds its maximum of {} client registrations; try again later",
                    self.max_clients
                ),
            ));
        }
        Ok(())
    }

    pub async fn client(&self, client_id: &str) -> Result<Option<OAuthClient>, OAuthError> {
        if !client_id.starts_with(CLIENT_PREFIX) || client_id.len() > 64 {
            return Ok(None);
        }
        self.get(Kind::Clients, client_id, "client").await
    }

    /// `invalid_client` unless `client_id` is registered here, or is a metadata document's
    /// URL (checked when it consented; its codes and grants name it, which is the check).
    async fn known(&self, client_id: &str) -> Result<(), OAuthError> {
        if client_id.starts_with("https://") || self.client(client_id).await?.is_some() {
            return Ok(());
        }
        Err(OAuthError::new(
            401,
            "invalid_client",
            format!("no client {client_id:?}: register again"),
        ))
    }

    // ---- codes and tokens
    //
    // A grant is the one record that says which tokens are good: its current access and
    // refresh token. A refresh rewrites it by compare-and-set over the version it read, and a
    // revocation deletes it whatever it holds, so a refresh racing a revocation (or another
    // refresh) on any node either lands before it, and is ended with it, or finds it gone. A
    // token record only points at its grant; a token the grant does not name is not good.

    /// Mints the authorization code a consent sends back to the client.
    pub async fn issue_code(&self, code: AuthCode) -> Result<String, OAuthError> {
        let secret = format!("{CODE_PREFIX}{}", random_hex(32));
        self.put(Kind::Codes, &hash(&secret), &code).await?;
        Ok(secret)
    }

    /// The `authorization_code` grant: checks the code against the client, redirect URI,
    /// verifier and resource, then makes a grant and its first tokens. A code that comes back
    /// after its exchange ends the grant made from it (RFC 6749 §4.1.2), however close the two
    /// exchanges are, on one node or two.
    pub async fn exchange(
        &self,
        code: &str,
        client_id: &str,
        redirect_uri: &str,
        verifier: &str,
        resource: Option<&str>,
    ) -> Result<Tokens, OAuthError> {
        if !pkce_shaped(verifier) {
            return Err(OAuthError::bad(
                "invalid_request",
                "code_verifier must be 43 to 128 unreserved characters",
            ));
        }
        self.known(client_id).await?;
        let invalid = |why: &str| OAuthError::bad("invalid_grant", why.to_owned());
        let key = hash(code);
        let Some(c): Option<AuthCode> = self.get(Kind::Codes, &key, "code").await? else {
            return Err(self.code_again(&key, false).await?);
        };
        if c.expires_at <= now() {
            return Err(invalid("the code expired: authorize again"));
        }
        if c.client_id != client_id {
            return Err(invalid("the code was issued to another client"));
        }
        if c.redirect_uri != redirect_uri {
            return Err(invalid("redirect_uri differs from the authorization request's"));
        }
        if s256(verifier) != c.challenge {
            return Err(invalid("code_verifier does not match the code_challenge"));
        }
        if resource.is_some() && self.resource(resource)? != c.resource {
            return Err(OAuthError::bad(
                "invalid_target",
                "resource differs from the authorization request's",
            ));
        }
        let redirect_host = host_of(&c.redirect_uri);
        let grant = Grant {
            id: random_hex(6),
            client_id: c.client_id,
            client_name: c.client_name,
            redirect_host,
            identity: c.identity,
            invite_id: c.invite_id,
            scope: c.scope,
            resource: c.resource,
            created_at: now(),
            access: String::new(),
            refresh: String::new(),
            // The code is a spent secret of the grant from now on, as a rotated refresh token.
            retired: vec![key.clone()],
        };
        // The code names its grant before anything is issued: of two exchanges of one code,
        // one writes this and the other finds it.
        let spent = encode(&TokenRef {
            grant: grant.id.clone(),
            kind: TokenKind::Code,
            expires_at: c.expires_at,
        });
        if !self.swap(Kind::Tokens, &key, None, Some(spent.clone())).await? {
            return Err(self.code_again(&key, true).await?);
        }
        self.delete(Kind::Codes, &key).await?;
        let id = grant.id.clone();
        // An exchange of the same code that came while this grant was being made burnt the
        // code's record first, so this one sees it and ends the grant itself (if the other
        // ended it already, the grant's id is taken by that deletion and it is not made).
        match self.mint(None, grant).await? {
            Some(tokens) if self.still_spent_once(&key, &spent).await? => Ok(tokens),
            _ => {
                self.end_grant(&id).await?;
                Err(invalid(
                    "the code was used twice: the tokens issued from it are revoked",
                ))
            }
        }
    }

    /// What a code that is not waiting to be exchanged answers: if it was exchanged, it is
    /// burnt and the grant made from it ends, since a code used twice was stolen or replayed.
    /// `known`: the caller lost the compare-and-set that writes the code's record, so it is
    /// there, though on a cluster the write that won may take a moment to be read back.
    async fn code_again(&self, key: &str, known: bool) -> Result<OAuthError, OAuthError> {
        let unknown = || OAuthError::bad("invalid_grant", "the code is unknown, expired or already used");
        let mut made = None;
        for attempt in 0..CHANGE_ATTEMPTS {
            let spent = match self.read::<TokenRef>(Kind::Tokens, key, "code").await? {
                Some(r) if matches!(r.value.kind, TokenKind::Code | TokenKind::Retired) => r,
                None if known => {
                    backoff(attempt).await;
                    continue;
                }
                // Never issued, expired unused, or a token's hash: nothing to end.
                _ => return Ok(unknown()),
            };
            made = Some(spent.value.grant.clone());
            // Burnt before the grant ends: an exchange still making the grant finds it so.
            let burnt = TokenRef {
                kind: TokenKind::Retired,
                ..spent.value.clone()
            };
            let burn = spent.value.kind == TokenKind::Retired
                || self
                    .swap(Kind::Tokens, key, Some(spent.bytes), Some(encode(&burnt)))
                    .await?;
            if burn {
                tracing::warn!(grant = %spent.value.grant, "an authorization code was used twice: its grant is revoked");
                self.end_grant(&spent.value.grant).await?;
                return Ok(OAuthError::bad(
                    "invalid_grant",
                    "the code was already used: the tokens issued from it are revoked",
                ));
            }
            backoff(attempt).await;
        }
        // Still contended (the grant ends anyway), or gone: only ending its grant removes a
        // code's record once written.
        if let Some(grant) = made {
            self.end_grant(&grant).await?;
        }
        Ok(OAuthError::bad(
            "invalid_grant",
            "the code was already used: the tokens issued from it are revoked",
        ))
    }

    /// Whether the code's record is still as its exchange wrote it (not burnt by a second
    /// exchange, nor gone with a revoked grant), checked by compare-and-set so that it is
    /// ordered with a burn.
    async fn still_spent_once(&self, key: &str, spent: &[u8]) -> Result<bool, OAuthError> {
        for attempt in 0..CHANGE_ATTEMPTS {
            let now = self
                .store
                .get(Kind::Tokens, key.to_owned())
                .await
                .map_err(OAuthError::server)?;
            if now.as_deref() != Some(spent) {
                return Ok(false);
            }
            if self.swap(Kind::Tokens, key, now, Some(spent.to_vec())).await? {
                return Ok(true);
            }
            backoff(attempt).await;
        }
        Ok(false)
    }

    /// New access and refresh tokens for `grant`, stored with their hashes if the grant is
    /// still `expected` (`None`: a new grant); `None` if another change came first.
    async fn mint(&self, expected: Option<Vec<u8>>, mut grant: Grant) -> Result<Option<Tokens>, OAuthError> {
        let access = format!("{ACCESS_PREFIX}{}", random_hex(32));
        let refresh = format!("{REFRESH_PREFIX}{}", random_hex(32));
        grant.access = hash(&access);
        grant.refresh = hash(&refresh);
        let now = now();
        // The tokens first: a grant never names tokens that are not there.
        self.put(
            Kind::Tokens,
            &grant.access,
            &TokenRef {
                grant: grant.id.clone(),
                kind: TokenKind::Access,
                expires_at: now + ACCESS_TTL.as_secs() as i64,
            },
        )
        .await?;
        self.put(
            Kind::Tokens,
            &grant.refresh,
            &TokenRef {
                grant: grant.id.clone(),
                kind: TokenKind::Refresh,
                expires_at: now + REFRESH_TTL.as_secs() as i64,
            },
        )
        .await?;
        if !self
            .swap(Kind::Grants, &grant.id, expected, Some(encode(&grant)))
            .await?
        {
            // Never the grant's: a revocation or another refresh came first.
            self.delete(Kind::Tokens, &grant.access).await?;
            self.delete(Kind::Tokens, &grant.refresh).await?;
            return Ok(None);
        }
        Ok(Some(Tokens {
            access_token: access,
            refresh_token: refresh,
            expires_in: ACCESS_TTL.as_secs(),
            scope: grant.scope,
        }))
    }

    /// The `refresh_token` grant: rotates both tokens. A refresh token the grant rotated
    /// away from ends the grant, with every token it issued since: of refreshes racing with
    /// one token, one rotates it and the others end what it got.
    pub async fn refresh(&self, token: &str, client_id: &str, resource: Option<&str>) -> Result<Tokens, OAuthError> {
        let invalid = |why: &str| OAuthError::bad("invalid_grant", why.to_owned());
        self.known(client_id).await?;
        let key = hash(token);
        let Some(t): Option<TokenRef> = self.get(Kind::Tokens, &key, "token").await? else {
            return Err(invalid("the refresh token is unknown, expired or revoked"));
        };
        match t.kind {
            TokenKind::Refresh | TokenKind::Retired => {}
            TokenKind::Access => return Err(invalid("that is an access token, not a refresh token")),
            TokenKind::Code => return Err(invalid("that is an authorization code, not a refresh token")),
        }
        for attempt in 0..CHANGE_ATTEMPTS {
            let Some(read) = self.read::<Grant>(Kind::Grants, &t.grant, "grant").await? else {
                return Err(invalid("the connection was revoked"));
            };
            let grant = &read.value;
            if grant.retired.contains(&key) {
                tracing::warn!(grant = %t.grant, "a refresh token was used twice: the grant is revoked");
                self.end_grant(&t.grant).await?;
                return Err(invalid(
                    "this refresh token was already used: the connection is revoked, consent again",
                ));
            }
            if grant.refresh != key {
                // Minted by a refresh that lost its compare-and-set: never the grant's.
                return Err(invalid("the refresh token is unknown, expired or revoked"));
            }
            if t.expires_at <= now() {
                return Err(invalid("the refresh token expired: consent again"));
            }
            if grant.client_id != client_id {
                return Err(invalid("the refresh token was issued to another client"));
            }
            if resource.is_some() && self.resource(resource)? != grant.resource {
                return Err(OAuthError::bad("invalid_target", "resource differs from the grant's"));
            }
            let mut next = grant.clone();
            next.retired.push(key.clone());
            // Keep the last few: enough to catch a replay, bounded however long a grant lives.
            let over = next.retired.len().saturating_sub(MAX_RETIRED);
            let dropped: Vec<String> = next.retired.drain(..over).collect();
            let old_access = grant.access.clone();
            if let Some(tokens) = self.mint(Some(read.bytes), next).await? {
                // No longer named by the grant, so no longer good: the records go.
                self.delete(Kind::Tokens, &old_access).await?;
                for old in dropped {
                    self.delete(Kind::Tokens, &old).await?;
                }
                return Ok(tokens);
            }
            backoff(attempt).await;
        }
        Err(contended())
    }

    /// Who an access token acts for, and its grant; `None` if it is unknown, expired,
    /// revoked, or no longer its grant's current token.
    pub async fn verify(&self, token: &str) -> Result<Option<Verified>, OAuthError> {
        self.verify_hash(&hash(token)).await
    }

    async fn verify_hash(&self, key: &str) -> Result<Option<Verified>, OAuthError> {
        let Some(t): Option<TokenRef> = self.get(Kind::Tokens, key, "token").await? else {
            return Ok(None);
        };
        if t.kind != TokenKind::Access || t.expires_at <= now() {
            return Ok(None);
        }
        let Some(grant): Option<Grant> = self.get(Kind::Grants, &t.grant, "grant").await? else {
            return Ok(None);
        };
        if grant.access != key {
            return Ok(None);
        }
        Ok(Some(Verified {
            principal: match grant.identity {
                Some(id) => Principal::Participant(id),
                None => Principal::connector(&grant.id),
            },
            credential: Credential {
                grant: grant.id,
                token: key.to_owned(),
            },
        }))
    }

    /// Whether `credential`'s token is still good: read at most once per [`RECHECK`] on this
    /// node for every request that holds it. A store that cannot answer ends nothing.
    pub async fn still_good(&self, credential: &Credential) -> bool {
        let key = format!("t{}", credential.token);
        self.verdict(&key, || async {
            Ok(self.verify_hash(&credential.token).await?.is_some())
        })
        .await
    }

    /// Whether grant `id` still stands (not revoked), read as [`OAuth::still_good`] reads a
    /// token: what a task made with one of its tokens lives by.
    pub async fn grant_stands(&self, id: &str) -> bool {
        let key = format!("g{id}");
        self.verdict(&key, || async {
            Ok(self.get::<Grant>(Kind::Grants, id, "grant").await?.is_some())
        })
        .await
    }

    async fn verdict<F: std::future::Future<Output = Result<bool, OAuthError>>>(
        &self,
        key: &str,
        read: impl FnOnce() -> F,
    ) -> bool {
        if let Some((at, good)) = self.verdicts.lock().get(key) {
            // A token or grant that ended does not come back.
            if !good || at.elapsed() < RECHECK {
                return *good;
            }
        }
        let good = match read().await {
            Ok(good) => good,
            Err(e) => {
                tracing::warn!(error = %e.description, "a credential could not be checked again; its requests go on");
                true
            }
        };
        let mut verdicts = self.verdicts.lock();
        if verdicts.len() >= MAX_VERDICTS {
            verdicts.retain(|_, (at, _)| at.elapsed() < 10 * RECHECK);
            // All young: the oldest goes, so the map stays within its bound.
            if verdicts.len() >= MAX_VERDICTS {
                if let Some(oldest) = verdicts.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone()) {
                    verdicts.remove(&oldest);
                }
            }
        }
        verdicts.insert(key.to_owned(), (std::time::Instant::now(), good));
        good
    }

    /// Resolves once `credential`'s token is no longer good: revoked (with its grant, or by
    /// itself), rotated away from by a refresh, or expired.
    pub async fn ended(self, credential: Credential) {
        loop {
            tokio::time::sleep(RECHECK).await;
            if !self.still_good(&credential).await {
                return;
            }
        }
    }

    /// RFC 7009: a refresh token ends its grant, an access token itself; unknown tokens are
    /// fine.
    pub async fn revoke_token(&self, token: &str) -> Result<(), OAuthError> {
        let key = hash(token);
        let Some(t): Option<TokenRef> = self.get(Kind::Tokens, &key, "token").await? else {
            return Ok(());
        };
        match t.kind {
            TokenKind::Access => self.delete(Kind::Tokens, &key).await,
            TokenKind::Refresh | TokenKind::Retired => self.revoke_grant(&t.grant).await.map(|_| ()),
            TokenKind::Code => Ok(()),
        }
    }

    /// Ends a grant and every token of it, at once on every node. `false` if there was none.
    pub async fn revoke_grant(&self, id: &str) -> Result<bool, OAuthError> {
        if self.get::<Grant>(Kind::Grants, id, "grant").await?.is_none() {
            return Ok(false);
        }
        self.end_grant(id).await?;
        Ok(true)
    }

    /// Ends grant `id` whatever it holds now: it is deleted unconditionally, so a refresh
    /// that read it before, here or on another node, fails its compare-and-set; then the
    /// records of the tokens it named go.
    async fn end_grant(&self, id: &str) -> Result<(), OAuthError> {
        let found: Option<Grant> = self.get(Kind::Grants, id, "grant").await?;
        self.delete(Kind::Grants, id).await?;
        if let Some(g) = found {
            for key in [&g.access, &g.refresh].into_iter().chain(&g.retired) {
                self.delete(Kind::Tokens, key).await?;
            }
        }
        Ok(())
    }

    /// Every grant, oldest first.
    pub async fn grants(&self) -> Result<Vec<GrantView>, OAuthError> {
        let mut out = super::readable::<Grant>(self.store.list(Kind::Grants).await.map_err(OAuthError::server)?);
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
        Ok(out.iter().map(GrantView::from).collect())
    }

    /// Ends every grant of `client_id`.
    pub async fn revoke_client(&self, client_id: &str) -> Result<usize, OAuthError> {
        let mut n = 0;
        for g in self.grants().await? {
            if g.client_id == client_id && self.revoke_grant(&g.grant).await? {
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::ops::memory::Memory;

    #[tokio::test]
    async fn registrations_are_bounded_and_old_unused_ones_make_room() {
        let store = Arc::new(Memory::default());
        let mut o = OAuth::new("http://127.0.0.1:1".into(), store.clone());
        o.max_clients = 3;
        let uris = || vec!["http://127.0.0.1:9/cb".to_owned()];
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(o.register(None, uris()).await.unwrap().client_id);
        }
        // Full, and none is old enough to drop.
        let e = o.register(None, uris()).await.unwrap_err();
        assert_eq!((e.status, e.error), (503, "temporarily_unavailable"));
        // Two of them a day old (as a restart reads them): one got a grant (kept), one never
        // did (dropped).
        for id in &ids[..2] {
            let stored = store.get(Kind::Clients, id.clone()).await.unwrap().unwrap();
            let mut c: OAuthClient = decode("client", &stored).unwrap();
            c.created_at -= UNUSED_CLIENT_TTL.as_secs() as i64 + 1;
            store.put(Kind::Clients, id.clone(), encode(&c)).await.unwrap();
        }
        let mut o = OAuth::new("http://127.0.0.1:1".into(), store.clone());
        o.max_clients = 3;
        let grant = Grant {
            id: "g1".into(),
            client_id: ids[0].clone(),
            client_name: "x".into(),
            redirect_host: "127.0.0.1".into(),
            identity: None,
            invite_id: "i".into(),
            scope: SCOPE.into(),
            resource: o.issuer.clone(),
            created_at: now(),
            access: String::new(),
            refresh: String::new(),
            retired: Vec::new(),
        };
        store.put(Kind::Grants, "g1".into(), encode(&grant)).await.unwrap();
        o.register(None, uris()).await.unwrap();
        assert!(
            o.client(&ids[0]).await.unwrap().is_some(),
            "a client with a grant stays"
        );
        assert!(
            o.client(&ids[1]).await.unwrap().is_none(),
            "an old unused one made room"
        );
    }

    /// The admin's list of connections leaves a damaged grant out instead of failing whole.
    #[tokio::test]
    async fn a_damaged_grant_leaves_the_others_listed() {
        let store = Arc::new(Memory::default());
        let grant: Grant = serde_json::from_value(serde_json::json!({
            "id": "g-1", "client_id": "c-1", "client_name": "Claude", "redirect_host": "claude.ai",
            "identity": "coder", "invite_id": "i-1", "scope": "relay", "resource": "https://relay/mcp",
            "created_at": 1, "access": "aa", "refresh": "rr", "retired": []
        }))
        .unwrap();
        store.put(Kind::Grants, "g-1".into(), encode(&grant)).await.unwrap();
        store.put(Kind::Grants, "g-0".into(), vec![9; 12]).await.unwrap();
        let o = OAuth::new("http://127.0.0.1:1".into(), store);
        let listed = o.grants().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].grant, "g-1");
    }

    #[tokio::test]
    async fn a_registration_at_the_cap_reads_no_registered_client() {
        let store = Arc::new(Memory::default());
        // A full relay whose every client is a day old and unused.
        let cap = 50;
        for i in 0..cap {
            let c = OAuthClient {
                client_id: format!("{CLIENT_PREFIX}{i:032x}"),
                client_name: "old".into(),
                redirect_uris: vec!["http://127.0.0.1:9/cb".into()],
                created_at: now() - UNUSED_CLIENT_TTL.as_secs() as i64 - 2 * cap as i64 + i as i64,
            };
            store.put(Kind::Clients, c.client_id.clone(), encode(&c)).await.unwrap();
        }
        let mut o = OAuth::new("http://127.0.0.1:1".into(), store.clone());
        o.max_clients = cap;
        for _ in 0..cap {
            o.register(Some("new".into()), vec!["http://127.0.0.1:9/cb".into()])
                .await
                .unwrap();
        }
        // The first registration read the clients' ages once; making room read none again.
        assert_eq!(store.reads(Kind::Clients), 1);
        // Full of new ones now: refused, still without reading them.
        let e = o
            .register(None, vec!["http://127.0.0.1:9/cb".into()])
            .await
            .unwrap_err();
        assert_eq!((e.status, e.error), (503, "temporarily_unavailable"));
        assert_eq!(store.reads(Kind::Clients), 1);
        assert_eq!(store.list(Kind::Clients).await.unwrap().len(), cap);
    }

    #[tokio::test]
    async fn a_registration_is_bounded_in_size() {
        let o = OAuth::new("http://127.0.0.1:1".into(), Arc::new(Memory::default()));
        let uri = |n: usize| format!("https://a.example/{}", "p".repeat(n - "https://a.example/".len()));
        let refused = |r: Result<OAuthClient, OAuthError>| r.map(|_| ()).unwrap_err();
        let e = refused(o.register(None, vec![uri(MAX_REDIRECT_URI_BYTES + 1)]).await);
        assert_eq!((e.status, e.error), (400, "invalid_redirect_uri"), "{e:?}");
        assert!(e.description.contains("at most 512"), "{e:?}");
        let e = refused(o.register(None, vec![uri(40); MAX_REDIRECT_URIS + 1]).await);
        assert_eq!((e.status, e.error), (400, "invalid_redirect_uri"), "{e:?}");
        let e = refused(
            o.register(Some("n".repeat(MAX_CLIENT_NAME_CHARS + 1)), vec![uri(40)])
                .await,
        );
        assert_eq!((e.status, e.error), (400, "invalid_client_metadata"), "{e:?}");
        // At every bound at once: taken.
        let c = o
            .register(
                Some("é".repeat(MAX_CLIENT_NAME_CHARS)),
                vec![uri(MAX_REDIRECT_URI_BYTES); MAX_REDIRECT_URIS],
            )
            .await
            .unwrap();
        assert!(encode(&c).len() < 6 * 1024, "{}", encode(&c).len());
    }

    #[tokio::test]
    async fn a_long_request_ends_when_its_token_expires() {
        let store = Arc::new(Memory::default());
        let o = OAuth::new("http://127.0.0.1:1".into(), store.clone());
        let token = hash("ct_at_soon");
        let grant = Grant {
            id: "g1".into(),
            client_id: "ct_c_x".into(),
            client_name: "x".into(),
            redirect_host: "127.0.0.1".into(),
            identity: None,
            invite_id: "i".into(),
            scope: SCOPE.into(),
            resource: o.issuer.clone(),
            created_at: now(),
            access: token.clone(),
            refresh: String::new(),
            retired: Vec::new(),
        };
        store.put(Kind::Grants, "g1".into(), encode(&grant)).await.unwrap();
        let expires_at = now() + 2;
        let good_for = TokenRef {
            grant: "g1".into(),
            kind: TokenKind::Access,
            expires_at,
        };
        store.put(Kind::Tokens, token.clone(), encode(&good_for)).await.unwrap();
        let credential = o.verify("ct_at_soon").await.unwrap().unwrap().credential;
        assert!(o.still_good(&credential).await);
        tokio::time::timeout(Duration::from_secs(5), o.clone().ended(credential))
            .await
            .expect("the token expired, and what it held open ended");
        assert!(now() >= expires_at);
    }

    #[test]
    fn pkce_s256_matches_rfc_7636_appendix_b() {
        assert_eq!(
            s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn redirect_uris() {
        assert!(redirect_uri_ok("https://claude.ai/api/mcp/auth_callback"));
        assert!(redirect_uri_ok("http://127.0.0.1:5000/callback"));
        assert!(redirect_uri_ok("http://localhost/callback"));
        assert!(!redirect_uri_ok("http://evil.example/callback"));
        assert!(!redirect_uri_ok("https://a.example/cb#frag"));
        assert!(!redirect_uri_ok("javascript:alert(1)"));
        assert!(redirect_matches(
            "http://localhost/callback",
            "http://localhost:4567/callback"
        ));
        assert!(!redirect_matches(
            "http://localhost/callback",
            "http://127.0.0.1:4567/callback"
        ));
        assert!(!redirect_matches("https://a.example/cb", "https://a.example/cb2"));
        assert!(!redirect_matches("https://a.example/cb", "https://a.example:8443/cb"));
    }

    #[test]
    fn invite_codes_read_back_however_typed() {
        let code = invite_code();
        assert_eq!(code.len(), 11);
        assert_eq!(invite_key(&code), invite_key(&code.to_lowercase().replace('-', " ")));
        assert_ne!(invite_key(&code), invite_key("00000-00000"));
    }
}
