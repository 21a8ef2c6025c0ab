//! A relay cluster on NATS JetStream: the [`Cluster`] whose nodes share one stream and its
//! key-value buckets. Every channel's events are in the stream, one subject per channel
//! ([`log`]); a node appends a channel's events, gathered into one message while the previous
//! one is on its way ([`appends`]), and learns their ids from the message's stream sequence, and
//! every node, the writer included, folds the stream in order into its own projection (the
//! channel actors, their views and the node's own sled store) through [`follow`]. What every
//! node must agree on besides is in buckets, one file each: shared data ([`data`]),
//! registrations ([`registrations`]), read cursors ([`cursors`]), presence ([`presence`]) and
//! active waits ([`waits`]), all through one typed bucket helper ([`kv`]).
//!
//! Invariants:
//! - an event's id comes from its place in the stream (its message's sequence and its place
//!   in the message, [`log::entry_id`]): unique across the cluster and increasing within a
//!   channel, so `since_id` and `Last-Event-ID` mean the same on every node;
//! - an append is answered only after JetStream's publish acknowledgement (with the servers'
//!   `sync_interval: always`, after the write is on disk on a majority of replicas);
//! - what an event means (stored, refused, a duplicate) is decided by the fold alone, in stream
//!   order, so every node reaches the same state whichever node took the write.

mod appends;
mod copy;
mod cursors;
mod cuts;
mod data;
mod follow;
mod kv;
mod log;
mod presence;
mod records;
mod registrations;
mod several;
mod waits;

use crate::cluster::{
    ChannelLog, Claim, Cluster, CursorChange, CursorSharing, Node, Registration, RegistrationSharing, WaitSharing,
};
use crate::error::RelayError;
use crate::records::RecordStore;
use crate::shared::SharedDataStore;
use crate::store::EventStore;
use async_nats::jetstream::{self, stream};
use crosstalk_schema::ChannelName;
use futures_util::future::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long start-up waits for a server, the stream and the buckets (a new cluster elects its
/// leaders first; on a small machine, with several nodes starting at once, that takes a while).
pub(super) const STREAM_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Default of `--nats-stream`.
pub const DEFAULT_STREAM: &str = "CROSSTALK";
/// Default of `--nats-replicas`.
pub const DEFAULT_REPLICAS: usize = 1;
/// Default of `--nats-linger-ms`.
pub const DEFAULT_LINGER: Duration = appends::LINGER;

/// Where the cluster's log is, and how to reach it.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// Server URLs (`nats://host:4222`); the client fails over between them.
    pub urls: Vec<String>,
    /// The stream's name.
    pub stream: String,
    /// Copies of the stream (3 in a three-server cluster, 1 on a single server).
    pub replicas: usize,
    /// A NATS credentials file (`.creds`).
    pub creds: Option<PathBuf>,
    /// User and password.
    pub user: Option<(String, String)>,
    /// A token.
    pub token: Option<String>,
    /// CA certificate(s) to trust, PEM.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate and key, PEM, for servers that verify clients.
    pub tls_cert: Option<(PathBuf, PathBuf)>,
    /// Refuse a connection without TLS.
    pub tls_required: bool,
    /// How long a loaded node's next message of the log waits to fill (`appends`);
    /// zero sends each at once.
    pub linger: Duration,
}

impl NatsConfig {
    /// Reads `nats://a:4222,b:4222` (comma-separated; a URL without scheme gets `nats://`).
    pub fn from_urls(list: &str) -> Result<NatsConfig, String> {
        let urls: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| {
                if u.contains("://") {
                    u.to_owned()
                } else {
                    format!("nats://{u}")
                }
            })
            .collect();
        if urls.is_empty() {
            return Err("no NATS server URL given".into());
        }
        for u in &urls {
            u.parse::<async_nats::ServerAddr>()
                .map_err(|e| format!("not a NATS server URL: {u}: {e}"))?;
        }
        Ok(NatsConfig {
            urls,
            stream: DEFAULT_STREAM.into(),
            replicas: DEFAULT_REPLICAS,
            creds: None,
            user: None,
            token: None,
            tls_ca: None,
            tls_cert: None,
            tls_required: false,
            linger: DEFAULT_LINGER,
        })
    }
}

/// What the client last saw of its connection: the last failed attempt's reason, cleared
/// once connected, for `/healthz` to say why NATS is down.
#[derive(Clone, Default)]
struct Link(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl Link {
    fn set(&self, why: Option<String>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    fn last_error(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Retries a start-up call to JetStream until it succeeds, fails for good, or `deadline`.
async fn until_ready<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    deadline: tokio::time::Instant,
    mut call: impl FnMut() -> F,
    permanent: impl Fn(&E) -> bool,
) -> Result<T, RelayError> {
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() < deadline && !permanent(&e) => {
                tracing::info!(error = %e, "waiting for JetStream: {what}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(unavailable(what, e)),
        }
    }
}

/// The stream's metadata that says how its messages hold events, as this release writes them
/// ([`log::entry_id`]): several events to a message, and messages of several channels' events
/// ([`log::SEVERAL`]). Before `entries-v1`, an event's id was its stream sequence, and each
/// message held one; a stream marked `entries-v1` holds no message of several channels, which
/// this release reads as it always was.
const IDS_KEY: &str = "crosstalk_ids";
const IDS_VALUE: &str = "entries-v2";
/// The mark this release reads, and raises to [`IDS_VALUE`] before it writes.
const IDS_EARLIER: &str = "entries-v1";

/// Checks that the stream's messages hold events as this release reads them, marking the
/// stream as this release writes them. A stream written by a release before 2026-12-03 is
/// refused (its events would fold under other ids than the nodes' copies hold), and so is one
/// a later release marked otherwise. A release before this one refuses a stream this one
/// marked, rather than skip the messages of several channels it could not read.
async fn numbered_as_now(js: &jetstream::Context, info: &stream::Info) -> Result<(), RelayError> {
    let mark = info.config.metadata.get(IDS_KEY).map(String::as_str);
    match mark {
        Some(IDS_VALUE) => return Ok(()),
        Some(IDS_EARLIER) => {}
        None if info.state.last_sequence == 0 => {}
        None => {
            return Err(RelayError::StoreUnavailable(format!(
                "NATS: stream {} was written by a crosstalk release before 2026-12-03, whose events \
                 were numbered by their stream sequence; this release numbers several events to a \
                 message. Run the cluster on a new stream (--nats-stream NAME) with fresh data \
                 directories, or keep the earlier release",
                info.config.name
            )))
        }
        Some(other) => {
            return Err(RelayError::StoreUnavailable(format!(
                "NATS: stream {} is marked {IDS_KEY}={other}, a layout this release does not read \
                 (it reads {IDS_EARLIER} and {IDS_VALUE}): it was written by a later release. Run \
                 this node on that release",
                info.config.name
            )))
        }
    }
    let mut config = info.config.clone();
    config.metadata.insert(IDS_KEY.to_owned(), IDS_VALUE.to_owned());
    js.update_stream(&config)
        .await
        .map_err(|e| unavailable("marking the stream's layout", e))?;
    Ok(())
}

/// Whether stream `name` has a leader (a stream on a single server always has).
async fn has_leader(js: &jetstream::Context, name: &str) -> Result<(), String> {
    let stream = js.get_stream(name).await.map_err(|e| e.to_string())?;
    let info = stream.get_info().await.map_err(|e| e.to_string())?;
    match info.cluster {
        Some(c) if c.leader.is_none() => Err(format!("stream {name} has no leader yet")),
        _ => Ok(()),
    }
}

/// A stream creation error that retrying cannot mend.
fn permanent(e: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::context::CreateStreamErrorKind as K;
    use jetstream::ErrorCode;
    match e.kind() {
        K::JetStream(js) => matches!(
            js.error_code(),
            ErrorCode::STREAM_SUBJECT_OVERLAP | ErrorCode::STREAM_NAME_EXIST
        ),
        K::EmptyStreamName | K::InvalidStreamName | K::DomainAndExternalSet => true,
        _ => false,
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> RelayError {
    RelayError::StoreUnavailable(format!("NATS: {what}: {e}"))
}

/// The client's settings from `config`; its connection events go to `link`. Once connected,
/// the client reconnects by itself, for as long as the relay runs.
async fn connect_options(config: &NatsConfig, link: &Link) -> Result<async_nats::ConnectOptions, RelayError> {
    let mut options = async_nats::ConnectOptions::new()
        .name("crosstalk")
        .connection_timeout(Duration::from_secs(2));
    if let Some(path) = &config.creds {
        options = options
            .credentials_file(path)
            .await
            .map_err(|e| unavailable("reading the credentials file", e))?;
    }
    if let Some((user, password)) = &config.user {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &config.token {
        options = options.token(token.clone());
    }
    if let Some(ca) = &config.tls_ca {
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &config.tls_cert {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if config.tls_required {
        options = options.require_tls(true);
    }
    let link = link.clone();
    Ok(options.event_callback(move |event| {
        let link = link.clone();
        async move {
            match event {
                async_nats::Event::Connected => link.set(None),
                async_nats::Event::Disconnected => {
                    tracing::warn!("lost the connection to NATS; reconnecting")
                }
                async_nats::Event::ClientError(async_nats::ClientError::Other(why)) => link.set(Some(why)),
                async_nats::Event::ServerError(async_nats::ServerError::AuthorizationViolation) => {
                    link.set(Some("authorization violation".into()))
                }
                _ => {}
            }
        }
    }))
}

/// A failed first connection that retrying will not mend: the server refused the
/// credentials, or TLS failed (a certificate not trusted or not presented; rustls' reason
/// arrives inside an IO error).
fn refused(e: &async_nats::ConnectError) -> bool {
    use async_nats::ConnectErrorKind as K;
    match e.kind() {
        K::AuthorizationViolation | K::Authentication | K::Tls => true,
        K::Io => {
            let why = e.to_string().to_ascii_lowercase();
            ["certificate", "tls", "handshake", "alert"]
                .iter()
                .any(|w| why.contains(w))
        }
        _ => false,
    }
}

/// A node of a relay cluster. Cloning is cheap.
#[derive(Clone)]
pub struct NatsCluster {
    client: async_nats::Client,
    link: Link,
    log: log::Log,
    /// Events on their way to the log, gathered per channel.
    appends: Arc<appends::Appends>,
    /// The context the relay's own requests go on (bucket opening after start-up too).
    js: jetstream::Context,
    replicas: usize,
    shared: data::Buckets,
    registrations: registrations::Registrations,
    cursors: cursors::SharedCursors,
    cuts: cuts::Cuts,
    /// This node's messages of several channels, until each of them is cut past them.
    several: Arc<several::Several>,
    /// The other nodes' active waits, and this node's changes on their way to the bucket.
    waits: Arc<waits::ClusterWaits>,
    news: Arc<parking_lot::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<waits::WaitNews>>>>,
    /// This node, among the cluster's (a random id for the process's lifetime).
    node: String,
    /// Whether this node's store holds what the log held when it began to follow it.
    caught_up: Arc<follow::CaughtUp>,
}

impl std::fmt::Debug for NatsCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsCluster")
            .field("stream", &self.log.stream)
            .finish_non_exhaustive()
    }
}

impl NatsCluster {
    /// Connects (retrying in the background while no server answers) and makes sure the
    /// stream and the buckets exist with the configured replicas.
    pub async fn connect(config: &NatsConfig) -> Result<NatsCluster, RelayError> {
        let link = Link::default();
        // Servers may start after the relay: until one answers, start-up tries again, but
        // refused credentials or a failed TLS handshake end it at once, with the reason.
        let deadline = tokio::time::Instant::now() + STREAM_READY_TIMEOUT;
        let client = loop {
            match connect_options(config, &link).await?.connect(config.urls.clone()).await {
                Ok(client) => break client,
                Err(e) if refused(&e) => {
                    return Err(RelayError::StoreUnavailable(format!(
                        "NATS refused the connection: {e} (check --nats-creds, --nats-user/--nats-password, \
                         --nats-token and the --nats-tls-* settings)"
                    )))
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(RelayError::StoreUnavailable(format!(
                        "NATS: no server of {} answered within {}s: {e}",
                        config.urls.join(","),
                        STREAM_READY_TIMEOUT.as_secs()
                    )))
                }
                Err(e) => {
                    tracing::info!(error = %e, "waiting for a NATS server");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        };
        let js = jetstream::new(client.clone());
        let prefix = log::subject_prefix(&config.stream);
        let wanted = stream::Config {
            name: config.stream.clone(),
            subjects: vec![format!("{prefix}>")],
            storage: stream::StorageType::File,
            num_replicas: config.replicas.max(1),
            duplicate_window: Duration::from_secs(120),
            allow_direct: true,
            metadata: [(IDS_KEY.to_owned(), IDS_VALUE.to_owned())].into(),
            ..Default::default()
        };
        // A new cluster answers "no suitable peers" or times out until it has a leader; a
        // stream that clashes with another stays refused.
        // Start-up's requests go on a connection of their own whose requests time out after
        // 2 s, not the usual 10: one sent while a new cluster elects its leaders, or while
        // another node creates the same bucket, gets no answer and is better sent again soon.
        let setup = jetstream::new(
            connect_options(config, &Link::default())
                .await?
                .request_timeout(Some(Duration::from_secs(2)))
                .connect(config.urls.clone())
                .await
                .map_err(|e| unavailable("connecting", e))?,
        );
        let stream = until_ready(
            "creating the stream",
            deadline,
            || setup.get_or_create_stream(wanted.clone()),
            permanent,
        )
        .await?;
        numbered_as_now(&setup, stream.cached_info()).await?;
        // A node is ready once its store holds what the log holds now.
        let caught_up = Arc::new(follow::CaughtUp::new(stream.cached_info().state.last_sequence));
        until_ready(
            "waiting for the stream's leader",
            deadline,
            || has_leader(&setup, &config.stream),
            |_| false,
        )
        .await?;
        let replicas = config.replicas.max(1);
        let at = kv::Open {
            js: &js,
            setup: &setup,
            stream: &config.stream,
            replicas,
            deadline,
        };
        let shared = data::Buckets {
            current: kv::Bucket::open(&at, "DATA", Duration::ZERO, "shared data").await?,
            versions: kv::Bucket::open(&at, "DATA_VERSIONS", Duration::ZERO, "shared data versions").await?,
        };
        let registrations = registrations::Registrations {
            bucket: kv::Bucket::open(&at, "INSTANCES", Duration::ZERO, "instances").await?,
        };
        let cursors = cursors::SharedCursors {
            bucket: kv::Bucket::open(&at, "CURSORS", Duration::ZERO, "cursors").await?,
        };
        let cuts = cuts::Cuts {
            bucket: kv::Bucket::open(&at, "CUTS", Duration::ZERO, "retention cuts").await?,
        };
        let (waits, news) = waits::ClusterWaits::new();
        let log = log::Log {
            js: js.clone(),
            stream: config.stream.clone(),
            prefix,
        };
        Ok(NatsCluster {
            client,
            link,
            appends: Arc::new(appends::Appends::new(log.clone(), config.linger)),
            several: Arc::new(several::Several::new(log.clone())),
            log,
            js,
            replicas,
            shared,
            registrations,
            cursors,
            cuts,
            waits: Arc::new(waits),
            news: Arc::new(parking_lot::Mutex::new(Some(news))),
            node: uuid::Uuid::new_v4().simple().to_string(),
            caught_up,
        })
    }

    /// Opens a bucket after start-up (presence, waits), on the relay's own context.
    async fn open_bucket<V: kv::Value>(
        &self,
        suffix: &str,
        max_age: Duration,
        what: &'static str,
    ) -> Result<kv::Bucket<V>, RelayError> {
        let at = kv::Open {
            js: &self.js,
            setup: &self.js,
            stream: &self.log.stream,
            replicas: self.replicas,
            deadline: tokio::time::Instant::now() + STREAM_READY_TIMEOUT,
        };
        kv::Bucket::open(&at, suffix, max_age, what).await
    }
}

impl Cluster for NatsCluster {
    fn claim_store(&self, store: &dyn EventStore) -> Result<bool, RelayError> {
        crate::cluster::claim_store(store, Some(&self.log.stream))
    }

    fn health(&self) -> Result<(), String> {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(match self.link.last_error() {
                Some(why) => format!("NATS is unreachable ({state:?}; last attempt: {why}); reconnecting"),
                None => format!("NATS is unreachable ({state:?}); reconnecting"),
            }),
        }
    }

    fn readiness(&self) -> Result<(), String> {
        self.caught_up.readiness()
    }

    fn channel_log(&self, channel: &ChannelName) -> Box<dyn ChannelLog> {
        Box::new(copy::LogCopy {
            cluster: self.clone(),
            channel: channel.clone(),
            trims: Default::default(),
            proposals: Default::default(),
        })
    }

    fn shared_data(&self, _local: &dyn Fn() -> Arc<dyn SharedDataStore>, max_size: usize) -> Arc<dyn SharedDataStore> {
        Arc::new(data::SharedBuckets {
            buckets: self.shared.clone(),
            max_size,
        })
    }

    fn records(&self, _local: &dyn Fn() -> Arc<dyn RecordStore>) -> Arc<dyn RecordStore> {
        Arc::new(records::RecordBuckets {
            js: self.js.clone(),
            stream: self.log.stream.clone(),
            replicas: self.replicas,
            buckets: Arc::new(Default::default()),
        })
    }

    fn start(&self, node: Arc<dyn Node>) -> Vec<tokio::task::JoinHandle<()>> {
        // A node restarted with its copy up to date is ready before it serves a request.
        self.caught_up.check_stored(&*node);
        self.several.attach(node.clone());
        let mut tasks = Vec::new();
        if let Some(news) = self.news.lock().take() {
            let this = self.clone();
            let shutdown = node.shutdown();
            let bucket = async move {
                follow::until_ok(shutdown, "waits bucket", || {
                    this.open_bucket("WAITS", waits::WAITS_MAX_AGE, "waits")
                })
                .await
                .map(|bucket| waits::SharedWaits {
                    bucket,
                    node: this.node.clone(),
                })
            };
            tasks.push(actix::spawn(follow::share_waits(
                node.clone(),
                bucket,
                self.waits.clone(),
                news,
            )));
        }
        let presence = {
            let (this, shutdown, ttl) = (self.clone(), node.shutdown(), node.presence_ttl());
            async move {
                follow::until_ok(shutdown, "presence bucket", || {
                    this.open_bucket("PRESENCE", ttl, "presence")
                })
                .await
                .map(|bucket| presence::SharedPresence {
                    bucket,
                    node: this.node.clone(),
                })
            }
        };
        tasks.extend([
            actix::spawn(follow::project(
                node.clone(),
                self.log.clone(),
                self.cuts.clone(),
                self.caught_up.clone(),
            )),
            actix::spawn(follow::share_identities(node.clone(), self.registrations.clone())),
            actix::spawn(follow::share_presence(node.clone(), presence)),
            actix::spawn(follow::share_cursors(node, self.cursors.clone())),
        ]);
        tasks
    }
}

impl RegistrationSharing for NatsCluster {
    fn claim_registration(
        &self,
        registration: Registration,
        ttl: Duration,
        take_over: Option<String>,
    ) -> BoxFuture<'static, Result<Registration, RelayError>> {
        let registrations = self.registrations.clone();
        Box::pin(async move { registrations.claim(registration, ttl, take_over.as_deref()).await })
    }
}

impl CursorSharing for NatsCluster {
    fn advance_cursor(&self, who: &str, channel: &ChannelName, id: u64) -> BoxFuture<'static, Result<(), RelayError>> {
        let (cursors, who, channel) = (self.cursors.clone(), who.to_owned(), channel.clone());
        Box::pin(async move { cursors.advance(&who, &channel, id).await })
    }

    fn claim_cursor(
        &self,
        who: &str,
        channel: &ChannelName,
        from: u64,
        to: u64,
    ) -> BoxFuture<'static, Result<Claim, RelayError>> {
        let (cursors, who, channel) = (self.cursors.clone(), who.to_owned(), channel.clone());
        Box::pin(async move { cursors.claim(&who, &channel, from, to).await })
    }

    fn settle_claims(
        &self,
        node: Arc<dyn Node>,
        who: &str,
        claimed: Vec<(ChannelName, u64)>,
    ) -> BoxFuture<'static, Result<(), RelayError>> {
        // The claims moved the shared cursors already: this node's mirror learns of the moves
        // now, not when the watch brings them back.
        for (channel, id) in claimed {
            node.merge_cursor(CursorChange {
                who: who.to_owned(),
                channel,
                id: Some(id),
            });
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn forget_cursor(&self, who: &str, channel: &ChannelName) -> BoxFuture<'static, Result<(), RelayError>> {
        let (cursors, who, channel) = (self.cursors.clone(), who.to_owned(), channel.clone());
        Box::pin(async move { cursors.forget(&who, &channel).await })
    }
}

impl WaitSharing for NatsCluster {
    fn waiting_elsewhere(&self, channel: &ChannelName) -> Vec<String> {
        self.waits.elsewhere(channel)
    }

    fn publish_wait(&self, channel: &ChannelName, instance: &str, waiting: bool) {
        self.waits.publish(channel, instance, waiting);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lists_parse() {
        let c = NatsConfig::from_urls("nats://127.0.0.1:4222, 127.0.0.1:4223").unwrap();
        assert_eq!(c.urls, ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"]);
        assert!(NatsConfig::from_urls(" , ").is_err());
    }
}
