//! The shared log of a relay cluster: every channel's events in one NATS JetStream stream, one
//! subject per channel (`crosstalk.ch.<channel>`). Several relay nodes on one stream share
//! their channels: a node appends an event and learns its id from the stream (its sequence),
//! and every node, the writer included, folds the stream in order into its own projection
//! (the channel actors, their views and the local sled store) through [`follow`](NatsLog::follow).
//!
//! Invariants:
//! - an event's id is its stream sequence: unique across the cluster and increasing within a
//!   channel, so `since_id` and `Last-Event-ID` mean the same on every node;
//! - an append is answered only after JetStream's publish acknowledgement (with the servers'
//!   `sync_interval: always`, after the write is on disk on a majority of replicas);
//! - what an event means (stored, refused, a duplicate) is decided by the fold alone, in stream
//!   order, so every node reaches the same state whichever node took the write.

use crate::error::RelayError;
use crate::store::{EventStore, Space};
use async_nats::jetstream::{self, consumer, kv, stream};
use bytes::Bytes;
use crosstalk_schema::{codec, ChannelName, Instance, Record, SharedData, Timestamp};
use futures_util::StreamExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Header carrying a post's idempotency key, for the fold (the record does not hold it).
const IDEMPOTENCY_HEADER: &str = "Crosstalk-Idempotency-Key";
/// Longest an append waits for JetStream's acknowledgement.
const APPEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the server tells a node following the log that it is still there when it has
/// nothing to deliver; two missed ones and the node follows again on a new consumer.
const FOLLOW_HEARTBEAT: Duration = Duration::from_secs(1);
/// Longest setting up a consumer to follow the log may take before the node tries again. While
/// the cluster elects a leader after a server died, a request to create one can go unanswered
/// until the client's own 10 s time-out; a new attempt a moment later usually lands. A consumer
/// the server did make for an abandoned attempt is removed once idle (`inactive_threshold`).
const FOLLOW_SETUP_TIMEOUT: Duration = Duration::from_secs(3);
/// How long start-up waits for a server, the stream and the buckets (a new cluster elects its
/// leaders first; on a small machine, with several nodes starting at once, that takes a while).
const STREAM_READY_TIMEOUT: Duration = Duration::from_secs(60);

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
            stream: "CROSSTALK".into(),
            replicas: 1,
            creds: None,
            user: None,
            token: None,
            tls_ca: None,
            tls_cert: None,
            tls_required: false,
        })
    }
}

/// One event of the log, as the fold receives it.
#[derive(Debug, Clone)]
pub struct LogEvent {
    /// Its stream sequence: the event's id.
    pub seq: u64,
    pub channel: ChannelName,
    pub record: Record,
    /// The post's idempotency key, if it had one.
    pub idempotency_key: Option<String>,
}

/// A handle on the cluster's log. Cloning is cheap.
#[derive(Clone)]
pub struct NatsLog {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: String,
    prefix: String,
    shared: SharedBuckets,
    registrations: Registrations,
    cursors: SharedCursors,
    link: Link,
    replicas: usize,
    /// This node, among the cluster's (a random id for the process's lifetime).
    node: String,
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

impl std::fmt::Debug for NatsLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsLog")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

/// `key` as a NATS header value: printable ASCII kept, anything else (and `%`) escaped.
fn header_safe(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn header_unescape(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Subject prefix of a stream's channel events: `crosstalk.ch.` for the default stream
/// `CROSSTALK` (two streams may not share subjects, so each has its own).
fn subject_prefix(stream: &str) -> String {
    format!("{}.ch.", stream.to_ascii_lowercase())
}

fn subject(prefix: &str, channel: &ChannelName) -> String {
    // `.` separates subject tokens; `~` is not allowed in channel names, so this reverses.
    format!("{prefix}{}", channel.as_str().replace('.', "~"))
}

fn channel_of(prefix: &str, subject: &str) -> Option<ChannelName> {
    let name = subject.strip_prefix(prefix)?.replace('~', ".");
    ChannelName::parse(&name).ok()
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

/// Whether stream `name` has a leader (a stream on a single server always has).
async fn has_leader(js: &jetstream::Context, name: &str) -> Result<(), String> {
    let stream = js.get_stream(name).await.map_err(|e| e.to_string())?;
    let info = stream.get_info().await.map_err(|e| e.to_string())?;
    match info.cluster {
        Some(c) if c.leader.is_none() => Err(format!("stream {name} has no leader yet")),
        _ => Ok(()),
    }
}

/// Creates (or opens) the KV bucket `<stream>_<suffix>`, whose entries expire after
/// `max_age` (`ZERO`: never), and waits until it has a leader:
/// on a new cluster a created bucket answers "no stream found" until its replicas elect one.
async fn bucket(
    js: &jetstream::Context,
    setup: &jetstream::Context,
    stream: &str,
    suffix: &str,
    replicas: usize,
    max_age: Duration,
    deadline: tokio::time::Instant,
) -> Result<kv::Store, RelayError> {
    let config = kv::Config {
        bucket: format!("{stream}_{suffix}"),
        history: 1,
        num_replicas: replicas,
        storage: stream::StorageType::File,
        max_age,
        ..Default::default()
    };
    let what = format!("creating the {} bucket", config.bucket);
    until_ready(
        &what,
        deadline,
        || setup.create_or_update_key_value(config.clone()),
        |_| false,
    )
    .await?;
    let what = format!("waiting for the {} bucket's leader", config.bucket);
    let name = format!("KV_{}", config.bucket);
    until_ready(&what, deadline, || has_leader(setup, &name), |_| false).await?;
    // Opened again on `js`, whose requests wait as long as the relay's own.
    until_ready(&what, deadline, || js.get_key_value(&config.bucket), |_| false).await
}

/// Every entry of `bucket` (its latest value per key), then each change as it happens, each
/// made into a `T` by `parse` (entries it cannot read are skipped); `what` names the bucket in
/// errors and logs. The changes end at the watch's first error (its consumer lived on a server
/// that died, say: then the client's watch keeps failing rather than recovering), so the
/// caller watches again, from the bucket's history; every change is a merge, so seeing an
/// entry twice changes nothing.
async fn watch_bucket<T>(
    bucket: &kv::Store,
    what: &'static str,
    parse: fn(kv::Entry) -> Option<T>,
) -> Result<impl futures_util::Stream<Item = T> + Unpin, RelayError> {
    let watch = bucket
        .watch_with_history(">")
        .await
        .map_err(|e| unavailable(&format!("watching the {what} bucket"), e))?;
    Ok(watch
        .take_while(move |e| {
            if let Err(e) = e {
                tracing::warn!(error = %e, "watching the {what} bucket failed; watching it again");
            }
            std::future::ready(e.is_ok())
        })
        .filter_map(move |e| std::future::ready(e.ok().and_then(parse))))
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

impl NatsLog {
    /// Connects (retrying in the background while no server answers) and makes sure the
    /// stream exists with the configured replicas.
    pub async fn connect(config: &NatsConfig) -> Result<NatsLog, RelayError> {
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
        let prefix = subject_prefix(&config.stream);
        let wanted = stream::Config {
            name: config.stream.clone(),
            subjects: vec![format!("{prefix}>")],
            storage: stream::StorageType::File,
            num_replicas: config.replicas.max(1),
            duplicate_window: Duration::from_secs(120),
            allow_direct: true,
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
        until_ready(
            "creating the stream",
            deadline,
            || setup.get_or_create_stream(wanted.clone()),
            permanent,
        )
        .await?;
        until_ready(
            "waiting for the stream's leader",
            deadline,
            || has_leader(&setup, &config.stream),
            |_| false,
        )
        .await?;
        let replicas = config.replicas.max(1);
        let open = |suffix| bucket(&js, &setup, &config.stream, suffix, replicas, Duration::ZERO, deadline);
        let shared = SharedBuckets {
            current: open("DATA").await?,
            versions: open("DATA_VERSIONS").await?,
        };
        let registrations = Registrations {
            bucket: open("INSTANCES").await?,
        };
        let cursors = SharedCursors {
            bucket: open("CURSORS").await?,
        };
        Ok(NatsLog {
            client,
            js,
            stream: config.stream.clone(),
            prefix,
            shared,
            registrations,
            cursors,
            link,
            replicas,
            node: uuid::Uuid::new_v4().simple().to_string(),
        })
    }

    /// The cluster's per-channel presence (`<STREAM>_PRESENCE`), whose entries expire after
    /// `ttl` unless their node refreshes them; created if missing.
    pub async fn presence(&self, ttl: Duration) -> Result<SharedPresence, RelayError> {
        let deadline = tokio::time::Instant::now() + STREAM_READY_TIMEOUT;
        let bucket = bucket(
            &self.js,
            &self.js,
            &self.stream,
            "PRESENCE",
            self.replicas,
            ttl,
            deadline,
        )
        .await?;
        Ok(SharedPresence {
            bucket,
            node: self.node.clone(),
        })
    }

    /// Who waits actively on which channel across the cluster (`<STREAM>_WAITS`), for the
    /// mutual-wait release; created if missing. The waits of a node that stopped saying it is
    /// alive are not counted; the bucket drops them after an hour.
    pub async fn waits(&self) -> Result<SharedWaits, RelayError> {
        let deadline = tokio::time::Instant::now() + STREAM_READY_TIMEOUT;
        let max_age = Duration::from_secs(3600);
        let bucket = bucket(
            &self.js,
            &self.js,
            &self.stream,
            "WAITS",
            self.replicas,
            max_age,
            deadline,
        )
        .await?;
        Ok(SharedWaits {
            bucket,
            node: self.node.clone(),
        })
    }

    /// The cluster's read cursors.
    pub fn cursors(&self) -> &SharedCursors {
        &self.cursors
    }

    /// The cluster's registered identities.
    pub fn registrations(&self) -> &Registrations {
        &self.registrations
    }

    /// The cluster's shared data.
    pub fn shared(&self) -> &SharedBuckets {
        &self.shared
    }

    /// Why writes are refused now, if they are: the connection is down.
    pub fn health(&self) -> Result<(), String> {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(match self.link.last_error() {
                Some(why) => format!("NATS is unreachable ({state:?}; last attempt: {why}); reconnecting"),
                None => format!("NATS is unreachable ({state:?}); reconnecting"),
            }),
        }
    }

    /// Appends one event; answers its id once JetStream has acknowledged it. A retried post
    /// within the stream's duplicate window gets the original's id.
    pub async fn append(
        &self,
        channel: &ChannelName,
        record: &Record,
        idempotency_key: Option<&str>,
    ) -> Result<u64, RelayError> {
        self.health().map_err(RelayError::StoreUnavailable)?;
        let mut publish = jetstream::message::PublishMessage::build().payload(Bytes::from(codec::encode(record)));
        if let Some(key) = idempotency_key {
            // JetStream drops a second publish with the same id within its window; the fold
            // recognises one beyond it by the header.
            let key = header_safe(key);
            publish = publish
                .message_id(format!("{channel}/{key}"))
                .header(IDEMPOTENCY_HEADER, key.as_str());
        }
        let append = async {
            let mut pause = Duration::from_millis(10);
            loop {
                let ack = self
                    .js
                    .send_publish(subject(&self.prefix, channel), publish.clone())
                    .await
                    .map_err(|e| unavailable("publishing", e))?;
                match ack.await {
                    // No one listens on the subject (NATS's "no responders"): the event reached
                    // no stream, so sending it again cannot store it twice. A new stream's
                    // subjects reach every server of a cluster a moment after it has a leader.
                    Err(e) if e.kind() == jetstream::context::PublishErrorKind::StreamNotFound => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(200));
                    }
                    ack => return ack.map_err(|e| unavailable("waiting for the acknowledgement", e)),
                }
            }
        };
        let ack = tokio::time::timeout(APPEND_TIMEOUT, append)
            .await
            .map_err(|_| unavailable("appending", "no acknowledgement in time"))??;
        Ok(ack.sequence)
    }

    /// The sequence of the newest event in the log (0 when it is empty).
    pub async fn last_sequence(&self) -> Result<u64, RelayError> {
        let mut stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| unavailable("opening the stream", e))?;
        let info = stream
            .info()
            .await
            .map_err(|e| unavailable("reading the stream's state", e))?;
        Ok(info.state.last_sequence)
    }

    /// Every event from stream sequence `from` on, in order, then new ones as they come. The
    /// stream yields an error when the consumer is lost (its server died: [`FOLLOW_HEARTBEAT`]
    /// twice without a word) or a message went missing on the way (a gap in the consumer's own
    /// sequence); follow again from the next sequence. Beside it, the stream sequence of the
    /// last message the consumer delivered, events or not (one that is not an event is skipped).
    ///
    /// Not the client's ordered consumer: that one waits for its fixed 15 s heartbeat to be
    /// missed twice before it recreates itself, so a node whose consumer lived on a server that
    /// died stopped folding the log, and answering its own posts, for up to a minute.
    pub async fn follow(
        &self,
        from: u64,
    ) -> Result<
        (
            impl futures_util::Stream<Item = Result<LogEvent, RelayError>> + Unpin,
            Arc<AtomicU64>,
        ),
        RelayError,
    > {
        let deliver_policy = if from <= 1 {
            consumer::DeliverPolicy::All
        } else {
            consumer::DeliverPolicy::ByStartSequence { start_sequence: from }
        };
        let setup = async {
            let stream = self
                .js
                .get_stream(&self.stream)
                .await
                .map_err(|e| unavailable("opening the stream", e))?;
            // What the ordered consumer would be: ephemeral, in memory, one replica, no acks;
            // the server removes it once nobody has pulled for a while.
            let consumer = stream
                .create_consumer(consumer::pull::Config {
                    filter_subject: format!("{}>", self.prefix),
                    deliver_policy,
                    ack_policy: consumer::AckPolicy::None,
                    max_deliver: 1,
                    inactive_threshold: Duration::from_secs(30),
                    num_replicas: 1,
                    memory_storage: true,
                    ..Default::default()
                })
                .await
                .map_err(|e| unavailable("creating a consumer", e))?;
            consumer
                .stream()
                .max_messages_per_batch(500)
                .expires(Duration::from_secs(30))
                .heartbeat(FOLLOW_HEARTBEAT)
                .messages()
                .await
                .map_err(|e| unavailable("reading the stream", e))
        };
        let messages = tokio::time::timeout(FOLLOW_SETUP_TIMEOUT, setup).await.map_err(|_| {
            unavailable(
                "setting up a consumer",
                format!("no answer in {FOLLOW_SETUP_TIMEOUT:?}"),
            )
        })??;
        let prefix = self.prefix.clone();
        let mut delivered = 0u64;
        let through = Arc::new(AtomicU64::new(from.saturating_sub(1)));
        let through_now = through.clone();
        let events = messages.filter_map(move |m| {
            let m = m.map_err(|e| unavailable("reading the stream", e)).and_then(|m| {
                let info = m.info().map_err(|e| unavailable("reading a message's sequence", e))?;
                if info.consumer_sequence != delivered + 1 {
                    return Err(unavailable(
                        "reading the stream",
                        format!(
                            "message {} of the consumer came after {delivered}: one went missing",
                            info.consumer_sequence
                        ),
                    ));
                }
                delivered = info.consumer_sequence;
                through_now.store(info.stream_sequence, Ordering::Relaxed);
                Ok(m)
            });
            std::future::ready(log_event(&prefix, m))
        });
        Ok((events, through))
    }
}

/// Shared data of a relay cluster, in two JetStream key-value buckets: the current version of
/// every key (`<STREAM>_DATA`), and every version by key and number (`<STREAM>_DATA_VERSIONS`).
/// A change is a compare-and-set on the current entry's revision, so when two nodes change one
/// key at once exactly one wins and the other tries again from the new current version, with
/// the same ownership rules as on a single relay ([`crate::shared`]).
#[derive(Clone)]
pub struct SharedBuckets {
    current: kv::Store,
    versions: kv::Store,
}

/// Whether a compare-and-set failed because another writer came first. The server answers
/// a lost race with one of two "wrong last sequence" codes (10071, and 10164 when the key's
/// subject had a newer message); the client library gives only the first its own kind.
fn lost_race(e: &impl std::fmt::Display) -> bool {
    e.to_string().contains("wrong last sequence")
}

/// Writes `value` under `key` if the key is still at `revision` (`None`: if it does not
/// exist); `false` if another writer came first.
async fn compare_and_set(
    bucket: &kv::Store,
    key: &str,
    revision: Option<u64>,
    value: Bytes,
    what: &str,
) -> Result<bool, RelayError> {
    match revision {
        None => match bucket.create(key, value).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists || lost_race(&e) => Ok(false),
            Err(e) => Err(unavailable(what, e)),
        },
        Some(rev) => match bucket.update(key, value, rev).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision || lost_race(&e) => Ok(false),
            Err(e) => Err(unavailable(what, e)),
        },
    }
}

/// Compare-and-set attempts before a change of shared data is refused as contended.
const CAS_ATTEMPTS: usize = 16;

/// A shared data key as a KV key (which allows only `[-/_=.a-zA-Z0-9]`): its bytes in hex.
fn kv_key(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_shared(bytes: &[u8], what: &str) -> Result<SharedData, RelayError> {
    codec::decode(bytes).map_err(|e| RelayError::Store(crate::StoreError::Corrupt(format!("shared data {what}: {e}"))))
}

impl SharedBuckets {
    /// The current version of `key` and its revision in the bucket.
    async fn current(&self, key: &str) -> Result<Option<(SharedData, u64)>, RelayError> {
        let entry = self
            .current
            .entry(kv_key(key))
            .await
            .map_err(|e| unavailable("reading shared data", e))?;
        match entry {
            Some(e) if e.operation == kv::Operation::Put => Ok(Some((decode_shared(&e.value, key)?, e.revision))),
            _ => Ok(None),
        }
    }

    /// Writes `next` over the current version read at `revision` (`None`: there was none);
    /// `false` if another change came first.
    async fn swap(&self, revision: Option<u64>, next: &SharedData) -> Result<bool, RelayError> {
        let value = Bytes::from(codec::encode(next));
        compare_and_set(
            &self.current,
            &kv_key(&next.key),
            revision,
            value,
            "writing shared data",
        )
        .await
    }

    /// Applies `change` to the current version of `key` (compare-and-set, retried), then
    /// records the new version.
    pub async fn change(
        &self,
        key: &str,
        change: impl Fn(Option<SharedData>) -> Result<SharedData, RelayError>,
    ) -> Result<SharedData, RelayError> {
        for _ in 0..CAS_ATTEMPTS {
            let (current, revision) = match self.current(key).await? {
                Some((c, rev)) => (Some(c), Some(rev)),
                None => (None, None),
            };
            let next = change(current)?;
            if self.swap(revision, &next).await? {
                self.versions
                    .put(
                        format!("{}.{}", kv_key(key), next.version),
                        Bytes::from(codec::encode(&next)),
                    )
                    .await
                    .map_err(|e| unavailable("recording a shared data version", e))?;
                return Ok(next);
            }
        }
        Err(RelayError::Conflict(format!(
            "shared data {key:?} is being changed by others; try again"
        )))
    }

    /// The current version of `key`, or version `version`.
    pub async fn fetch(&self, key: &str, version: Option<u64>) -> Result<Option<SharedData>, RelayError> {
        let current = self.current(key).await?.map(|(c, _)| c);
        match version {
            None => Ok(current),
            // The newest version is also the current entry (its version record follows it).
            Some(v) if current.as_ref().is_some_and(|c| c.version == v) => Ok(current),
            Some(v) => match self
                .versions
                .get(format!("{}.{v}", kv_key(key)))
                .await
                .map_err(|e| unavailable("reading a shared data version", e))?
            {
                Some(bytes) => Ok(Some(decode_shared(&bytes, key)?)),
                None => Ok(None),
            },
        }
    }

    /// Every key's current version.
    pub async fn list(&self) -> Result<Vec<SharedData>, RelayError> {
        let mut keys = self
            .current
            .keys()
            .await
            .map_err(|e| unavailable("listing shared data", e))?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| unavailable("listing shared data", e))?;
            if let Some(bytes) = self
                .current
                .get(&k)
                .await
                .map_err(|e| unavailable("reading shared data", e))?
            {
                out.push(decode_shared(&bytes, &k)?);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

/// A registered identity as the cluster shares it: its binding to a session, and when it was
/// last heard from on any node (µs since the epoch; negative: signed off at that time).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Registration {
    pub instance: Instance,
    pub session: Option<String>,
    pub seen: i64,
}

impl Registration {
    fn live(&self, ttl: Duration) -> bool {
        self.seen > 0 && Timestamp::now().0 - self.seen < ttl.as_micros() as i64
    }
}

/// Registered identities of a relay cluster, in a JetStream key-value bucket
/// (`<STREAM>_INSTANCES`). A registration is a compare-and-set, so two nodes cannot bind one
/// live id to two sessions; every node mirrors the bucket into its own [`crate::identities`]
/// and publishes, every few seconds, when it last heard from the identities bound on it.
#[derive(Clone)]
pub struct Registrations {
    bucket: kv::Store,
}

impl Registrations {
    async fn entry(&self, id: &str) -> Result<Option<(Registration, u64)>, RelayError> {
        let entry = self
            .bucket
            .entry(kv_key(id))
            .await
            .map_err(|e| unavailable("reading a registration", e))?;
        match entry {
            Some(e) if e.operation == kv::Operation::Put => Ok(codec::decode(&e.value).ok().map(|r| (r, e.revision))),
            _ => Ok(None),
        }
    }

    async fn swap(&self, revision: Option<u64>, reg: &Registration) -> Result<bool, RelayError> {
        let (key, value) = (kv_key(&reg.instance.instance_id), Bytes::from(codec::encode(reg)));
        compare_and_set(&self.bucket, &key, revision, value, "writing a registration").await
    }

    /// Binds `reg`'s id to its session across the cluster, unless another session holds it
    /// and was heard from within `ttl` on any node. Returns the registration as stored (its
    /// first registration time is the cluster's).
    pub async fn claim(&self, mut reg: Registration, ttl: Duration) -> Result<Registration, RelayError> {
        let id = reg.instance.instance_id.clone();
        for _ in 0..CAS_ATTEMPTS {
            let current = self.entry(&id).await?;
            if let Some((held, _)) = &current {
                if held.session.is_some() && held.session != reg.session && held.live(ttl) {
                    return Err(RelayError::Conflict(format!(
                        "instance id {id:?} is in use by another live session; pick another id, or wait until it \
                         has been silent for {} s",
                        ttl.as_secs()
                    )));
                }
                reg.instance.registered_at = held.instance.registered_at;
            }
            if self.swap(current.map(|(_, rev)| rev), &reg).await? {
                return Ok(reg);
            }
        }
        Err(RelayError::Conflict(format!(
            "instance id {id:?} is being registered elsewhere; try again"
        )))
    }

    /// Records that `id`, bound to `session`, was heard from at `seen` (or signed off), if it
    /// is still bound to that session and the cluster has nothing newer.
    pub async fn heard(&self, id: &str, session: &str, seen: i64) -> Result<(), RelayError> {
        for _ in 0..CAS_ATTEMPTS {
            let Some((mut reg, rev)) = self.entry(id).await? else {
                return Ok(());
            };
            if reg.session.as_deref() != Some(session) || reg.seen.abs() >= seen.abs() {
                return Ok(());
            }
            reg.seen = seen;
            if self.swap(Some(rev), &reg).await? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Every registration, then each change as it happens.
    pub async fn watch(&self) -> Result<impl futures_util::Stream<Item = Registration> + Unpin, RelayError> {
        watch_bucket(&self.bucket, "instances", |e| {
            (e.operation == kv::Operation::Put)
                .then(|| codec::decode::<Registration>(&e.value).ok())
                .flatten()
        })
        .await
    }
}

/// Read cursors of a relay cluster (how far each identity has read each channel: the inbox,
/// "read by…"), in a JetStream key-value bucket (`<STREAM>_CURSORS`). A cursor only moves
/// forward (compare-and-set keeps the larger); every node mirrors the bucket.
#[derive(Clone)]
pub struct SharedCursors {
    bucket: kv::Store,
}

/// One cursor as the bucket holds it; `id: None` when it was removed (the identity left).
#[derive(Debug, Clone)]
pub struct CursorChange {
    pub who: String,
    pub channel: ChannelName,
    pub id: Option<u64>,
}

fn cursor_kv_key(who: &str, channel: &ChannelName) -> String {
    format!("{}.{}", kv_key(who), kv_key(channel.as_str()))
}

fn from_hex(hex: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| hex.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

impl SharedCursors {
    /// Moves `who`'s cursor on `channel` to `id` unless it is already there or beyond.
    pub async fn advance(&self, who: &str, channel: &ChannelName, id: u64) -> Result<(), RelayError> {
        let key = cursor_kv_key(who, channel);
        for _ in 0..CAS_ATTEMPTS {
            let entry = self
                .bucket
                .entry(&key)
                .await
                .map_err(|e| unavailable("reading a cursor", e))?;
            let current = entry.filter(|e| e.operation == kv::Operation::Put);
            if let Some(e) = &current {
                let at = <[u8; 8]>::try_from(e.value.as_ref()).map_or(0, u64::from_be_bytes);
                if at >= id && at != 0 {
                    return Ok(());
                }
            }
            let value = Bytes::copy_from_slice(&id.to_be_bytes());
            let revision = current.map(|e| e.revision);
            let done = compare_and_set(&self.bucket, &key, revision, value, "writing a cursor").await?;
            if done {
                return Ok(());
            }
        }
        Err(RelayError::Conflict(format!(
            "the cursor of {who:?} on {channel} is being moved elsewhere; try again"
        )))
    }

    /// Claims what `who`'s inbox hands out of `channel`: moves its cursor from exactly `from`
    /// (0: none yet) to `to`. `Ok(Err(Some(at)))` when the cluster's cursor is at `at` instead
    /// (another node's inbox moved it first, or a move of this node's is still on its way),
    /// `Ok(Err(None))` when the identity left the channel. Two nodes' inboxes therefore never
    /// hand out one message twice.
    pub async fn claim(
        &self,
        who: &str,
        channel: &ChannelName,
        from: u64,
        to: u64,
    ) -> Result<Result<(), Option<u64>>, RelayError> {
        let key = cursor_kv_key(who, channel);
        for _ in 0..CAS_ATTEMPTS {
            let entry = self
                .bucket
                .entry(&key)
                .await
                .map_err(|e| unavailable("reading a cursor", e))?;
            let (at, revision) = match &entry {
                Some(e) if e.operation == kv::Operation::Put => (
                    <[u8; 8]>::try_from(e.value.as_ref()).map_or(0, u64::from_be_bytes),
                    Some(e.revision),
                ),
                // Removed: the identity left the channel.
                Some(_) => return Ok(Err(None)),
                None => (0, None),
            };
            if at != from {
                return Ok(Err(Some(at)));
            }
            let value = Bytes::copy_from_slice(&to.to_be_bytes());
            if compare_and_set(&self.bucket, &key, revision, value, "writing a cursor").await? {
                return Ok(Ok(()));
            }
        }
        Err(RelayError::Conflict(format!(
            "the cursor of {who:?} on {channel} is being moved elsewhere; try again"
        )))
    }

    /// Removes `who`'s cursor on `channel`.
    pub async fn forget(&self, who: &str, channel: &ChannelName) -> Result<(), RelayError> {
        self.bucket
            .delete(cursor_kv_key(who, channel))
            .await
            .map_err(|e| unavailable("removing a cursor", e))
    }

    /// Every cursor, then each change as it happens.
    pub async fn watch(&self) -> Result<impl futures_util::Stream<Item = CursorChange> + Unpin, RelayError> {
        watch_bucket(&self.bucket, "cursors", cursor_change).await
    }
}

fn cursor_change(e: kv::Entry) -> Option<CursorChange> {
    let (who, channel) = e.key.split_once('.')?;
    let (who, channel) = (from_hex(who)?, ChannelName::parse(&from_hex(channel)?).ok()?);
    let id = match e.operation {
        kv::Operation::Put => Some(<[u8; 8]>::try_from(e.value.as_ref()).map_or(0, u64::from_be_bytes)),
        _ => None,
    };
    Some(CursorChange { who, channel, id })
}

/// Who is on which channel across a relay cluster, in a JetStream key-value bucket
/// (`<STREAM>_PRESENCE`, key `<channel>.<participant>.<node>`, entries expiring after the
/// presence TTL). Each node publishes the participants it hears from, refreshing them while
/// they stay, and deletes them when they leave; every node mirrors the others' into its
/// presence supervisor.
#[derive(Clone)]
pub struct SharedPresence {
    bucket: kv::Store,
    node: String,
}

/// One participant on one channel as a node last published it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PresenceRecord {
    pub channel: String,
    pub participant: crate::presence::Participant,
    /// When that node last heard from it, µs since the epoch.
    pub seen: i64,
}

/// A change in the cluster's presence, as the bucket shows it.
#[derive(Debug, Clone)]
pub enum PresenceChange {
    /// A participant heard from on `node`.
    Here { node: String, record: PresenceRecord },
    /// A participant that left, or whose node stopped refreshing it.
    Gone {
        node: String,
        channel: ChannelName,
        participant_id: String,
    },
}

impl SharedPresence {
    /// This node's id in the keys.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn key(&self, channel: &str, participant_id: &str) -> String {
        format!("{}.{}.{}", kv_key(channel), kv_key(participant_id), self.node)
    }

    /// Publishes a participant heard from on this node.
    pub async fn here(&self, record: &PresenceRecord) -> Result<(), RelayError> {
        let key = self.key(&record.channel, &record.participant.participant_id);
        self.bucket
            .put(key, Bytes::from(codec::encode(record)))
            .await
            .map(|_| ())
            .map_err(|e| unavailable("publishing presence", e))
    }

    /// Withdraws a participant that left this node's channel.
    pub async fn gone(&self, channel: &ChannelName, participant_id: &str) -> Result<(), RelayError> {
        self.bucket
            .delete(self.key(channel.as_str(), participant_id))
            .await
            .map_err(|e| unavailable("withdrawing presence", e))
    }

    /// Every live entry, then each change as it happens.
    pub async fn watch(&self) -> Result<impl futures_util::Stream<Item = PresenceChange> + Unpin, RelayError> {
        watch_bucket(&self.bucket, "presence", presence_change).await
    }
}

fn presence_change(e: kv::Entry) -> Option<PresenceChange> {
    let mut parts = e.key.splitn(3, '.');
    let (channel, participant_id, node) = (parts.next()?, parts.next()?, parts.next()?.to_owned());
    match e.operation {
        kv::Operation::Put => Some(PresenceChange::Here {
            node,
            record: codec::decode(&e.value).ok()?,
        }),
        _ => Some(PresenceChange::Gone {
            node,
            channel: ChannelName::parse(&from_hex(channel)?).ok()?,
            participant_id: from_hex(participant_id)?,
        }),
    }
}

/// Who waits actively on which channel across a relay cluster, in a JetStream key-value
/// bucket (`<STREAM>_WAITS`, key `<channel>.<instance>.<node>`): each node publishes its own
/// active waits and withdraws them when they end, and mirrors the others', so "every active
/// party of the channel is waiting" is decided over the whole cluster.
#[derive(Clone)]
pub struct SharedWaits {
    bucket: kv::Store,
    node: String,
}

/// A change in who waits where, as the bucket shows it.
#[derive(Debug, Clone)]
pub struct WaitChange {
    pub node: String,
    pub channel: ChannelName,
    pub instance: String,
    /// `false`: the wait ended.
    pub waiting: bool,
}

/// What the waits bucket tells a node.
#[derive(Debug, Clone)]
pub enum WaitsEvent {
    /// A wait began or ended on another node (or this one).
    Change(WaitChange),
    /// A node said it is alive, `age` ago: waits of a node silent for long are not counted.
    Alive { node: String, age: Duration },
}

impl SharedWaits {
    /// This node's id in the keys.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn key(&self, channel: &ChannelName, instance: &str) -> String {
        format!("{}.{}.{}", kv_key(channel.as_str()), kv_key(instance), self.node)
    }

    /// Publishes that `instance` waits actively on `channel` on this node, or no longer does.
    pub async fn set(&self, channel: &ChannelName, instance: &str, waiting: bool) -> Result<(), RelayError> {
        let key = self.key(channel, instance);
        if waiting {
            self.bucket
                .put(key, Bytes::from_static(b"1"))
                .await
                .map(|_| ())
                .map_err(|e| unavailable("publishing a wait", e))
        } else {
            self.bucket
                .delete(key)
                .await
                .map_err(|e| unavailable("withdrawing a wait", e))
        }
    }

    /// Says this node is alive (every few seconds while it runs).
    pub async fn alive(&self) -> Result<(), RelayError> {
        self.bucket
            .put(format!("node.{}", self.node), Bytes::from_static(b"1"))
            .await
            .map(|_| ())
            .map_err(|e| unavailable("publishing a node's heartbeat", e))
    }

    /// Every wait and node heartbeat, then each change as it happens.
    pub async fn watch(&self) -> Result<impl futures_util::Stream<Item = WaitsEvent> + Unpin, RelayError> {
        watch_bucket(&self.bucket, "waits", waits_event).await
    }
}

fn waits_event(e: kv::Entry) -> Option<WaitsEvent> {
    // A channel's key part is hex, so never "node".
    if let Some(node) = e.key.strip_prefix("node.") {
        if e.operation != kv::Operation::Put {
            return None;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let age = u64::try_from(now - e.created.unix_timestamp_nanos()).unwrap_or(0);
        return Some(WaitsEvent::Alive {
            node: node.to_owned(),
            age: Duration::from_nanos(age),
        });
    }
    let mut parts = e.key.splitn(3, '.');
    let (channel, instance, node) = (parts.next()?, parts.next()?, parts.next()?);
    Some(WaitsEvent::Change(WaitChange {
        node: node.to_owned(),
        channel: ChannelName::parse(&from_hex(channel)?).ok()?,
        instance: from_hex(instance)?,
        waiting: e.operation == kv::Operation::Put,
    }))
}

/// One stream message as an event of the log; `None` (logged) for one that is not.
fn log_event(prefix: &str, m: Result<jetstream::Message, RelayError>) -> Option<Result<LogEvent, RelayError>> {
    let m = match m {
        Ok(m) => m,
        Err(e) => return Some(Err(e)),
    };
    let seq = match m.info() {
        Ok(info) => info.stream_sequence,
        Err(e) => return Some(Err(unavailable("reading a message's sequence", e))),
    };
    let Some(channel) = channel_of(prefix, m.subject.as_str()) else {
        tracing::warn!(seq, subject = %m.subject, "skipping a log entry on a subject that names no channel");
        return None;
    };
    let record = match codec::decode::<Record>(&m.payload) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(seq, channel = %channel, error = %e, "skipping a log entry that does not decode");
            return None;
        }
    };
    let idempotency_key = m
        .headers
        .as_ref()
        .and_then(|h| h.get(IDEMPOTENCY_HEADER))
        .and_then(|v| header_unescape(v.as_str()));
    Some(Ok(LogEvent {
        seq,
        channel,
        record,
        idempotency_key,
    }))
}

/// Key (in [`Space::Jobs`]) naming the stream a node's store is a copy of.
const CLAIM_KEY: &[u8] = b"shared-log";

/// Checks that a data directory suits how the relay runs, and records it: a cluster node's
/// store is its copy of one stream (`Some(stream)`), which a relay on its own must not write
/// (its ids would collide with the stream's), and a store of a relay on its own cannot
/// become a node's copy. Returns whether the store was already this stream's copy.
pub fn claim_store(store: &dyn EventStore, stream: Option<&str>) -> Result<bool, RelayError> {
    let claimed = store
        .get_aux(Space::Jobs, CLAIM_KEY)?
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    match (claimed.as_deref(), stream) {
        (None, None) => Ok(false),
        (Some(c), Some(s)) if c == s => Ok(true),
        (Some(c), None) => Err(RelayError::Conflict(format!(
            "this data directory is a cluster node's copy of the NATS stream {c}; start it with --store nats://… \
             (or give this relay a data directory of its own)"
        ))),
        (Some(c), Some(s)) => Err(RelayError::Conflict(format!(
            "this data directory is a copy of the NATS stream {c}, not {s}"
        ))),
        (None, Some(s)) => {
            if !store.channels()?.is_empty() {
                return Err(RelayError::Conflict(
                    "this data directory holds a relay's own channels; a cluster node needs an empty data \
                     directory of its own (it fills it from the stream)"
                        .into(),
                ));
            }
            store.put_aux(Space::Jobs, CLAIM_KEY, Some(s.as_bytes()))?;
            store.flush()?;
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_name_channels_reversibly() {
        let prefix = subject_prefix("CROSSTALK");
        assert_eq!(prefix, "crosstalk.ch.");
        for name in ["general", "team.alpha", "a-b_c.d.e"] {
            let c = ChannelName::parse(name).unwrap();
            let s = subject(&prefix, &c);
            assert!(!s[prefix.len()..].contains('.'), "{s}");
            assert_eq!(channel_of(&prefix, &s).unwrap(), c);
        }
        assert!(channel_of(&prefix, "other.subject").is_none());
    }

    #[test]
    fn idempotency_keys_survive_headers() {
        for key in ["plain-key_1", "with space", "line\r\nbreak", "100%", "ünïcode ✓"] {
            let h = header_safe(key);
            assert!(h.bytes().all(|b| b.is_ascii_graphic()), "{h}");
            assert_eq!(header_unescape(&h).as_deref(), Some(key));
        }
    }

    #[test]
    fn server_lists_parse() {
        let c = NatsConfig::from_urls("nats://127.0.0.1:4222, 127.0.0.1:4223").unwrap();
        assert_eq!(c.urls, ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"]);
        assert!(NatsConfig::from_urls(" , ").is_err());
    }
}
