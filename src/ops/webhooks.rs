//! Outbound webhooks: a channel's messages of some types (QUESTION, PERMISSION, DIRECTIVE, or
//! all) POSTed to a URL, signed, delivered at least once from a durable cursor — so a person
//! hears of a question when nobody is watching the console. The rules and the records are
//! here; the delivery loop and the routes are the `webhooks` face (`crate::webhooks`). Every
//! record goes through the small-records seam, so settings, cursors and failure state live
//! on sled or in the cluster's buckets, and on a cluster one node at a time delivers each
//! webhook (a lease, taken with a compare-and-set).

use super::{ErrorKind, OpError};
use crosstalk_actors::records::{Kind, RecordStore};
use crosstalk_actors::{RelayError, StoreError};
use crosstalk_schema::webhook::{Delivery, Lease, Webhook, WebhookFormat};
use crosstalk_schema::{codec, ChannelName, Timestamp};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Webhooks one relay keeps.
pub const MAX_WEBHOOKS: usize = 100;
/// How long a node's hold on a webhook's delivery lasts without renewal.
pub const LEASE: Duration = Duration::from_secs(30);
/// Longest pause between attempts at a failing delivery.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What `POST /api/webhooks` takes: the channel to follow, where to send, which message types
/// (none or `*`: all) and the body's format.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewWebhook {
    pub channel: String,
    pub url: String,
    /// Message types to send (QUESTION, PERMISSION, DIRECTIVE, …; `*` or none: all).
    #[serde(default)]
    pub types: Vec<String>,
    #[serde(default)]
    pub format: Option<WebhookFormat>,
}

/// The webhooks `GET /api/webhooks` lists.
#[derive(Debug, Serialize, Deserialize)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// Which webhook `DELETE /api/webhooks/{id}` removes.
#[derive(Debug, Serialize, Deserialize)]
pub struct WebhookId {
    pub id: String,
}

/// A webhook as the admin sees it: its settings (its secret only when created) and delivery.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WebhookView {
    pub id: String,
    pub channel: String,
    pub url: String,
    /// Message types sent; empty: every message.
    pub types: Vec<String>,
    pub format: WebhookFormat,
    pub created_at: String,
    /// The signing key: shown once, when the webhook is made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    pub delivery: Delivery,
}

pub fn now() -> i64 {
    Timestamp::now().0 / 1_000_000
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> RelayError {
    RelayError::Store(StoreError::Corrupt(format!("a stored {what} is damaged: {e}")))
}

fn decode<T: crosstalk_schema::Stored>(what: &str, bytes: &[u8]) -> Result<T, RelayError> {
    codec::decode(bytes).map_err(|e| corrupt(what, e))
}

/// The webhooks' records.
#[derive(Clone)]
pub struct Webhooks {
    store: Arc<dyn RecordStore>,
}

fn cursor_key(id: &str) -> String {
    format!("c-{id}")
}

fn lease_key(id: &str) -> String {
    format!("l-{id}")
}

impl Webhooks {
    pub fn new(store: Arc<dyn RecordStore>) -> Self {
        Webhooks { store }
    }

    /// Makes a webhook that sends what is posted on `channel` from now on (its cursor starts
    /// at the channel's newest id). The URL's address is checked by the caller. One beyond
    /// [`MAX_WEBHOOKS`] is the limit's own error (429 `limit_reached`), not the store's.
    pub async fn create(
        &self,
        channel: &ChannelName,
        url: String,
        types: Vec<String>,
        format: WebhookFormat,
        from: u64,
    ) -> Result<WebhookView, OpError> {
        let existing = self.store.list(Kind::Webhooks).await?;
        if existing.len() >= MAX_WEBHOOKS {
            return Err(OpError::new(
                ErrorKind::LimitReached,
                format!("this relay holds its maximum of {MAX_WEBHOOKS} webhooks; remove one first"),
            ));
        }
        let hook = Webhook {
            id: super::oauth::random_hex(6),
            channel: channel.to_string(),
            types: types
                .into_iter()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect(),
            url,
            format,
            secret: super::oauth::random_hex(24),
            created_at: now(),
        };
        let delivery = Delivery {
            last_id: from,
            ..Delivery::default()
        };
        // The cursor first: a webhook is never seen without one.
        self.put_delivery(&hook.id, &delivery).await?;
        self.store
            .put(Kind::Webhooks, hook.id.clone(), codec::encode(&hook))
            .await?;
        let mut view = view(&hook, delivery);
        view.secret = Some(hook.secret);
        Ok(view)
    }

    pub async fn get(&self, id: &str) -> Result<Option<Webhook>, RelayError> {
        match self.store.get(Kind::Webhooks, id.to_owned()).await? {
            Some(b) => Ok(Some(decode("webhook", &b)?)),
            None => Ok(None),
        }
    }

    pub async fn all(&self) -> Result<Vec<Webhook>, RelayError> {
        let mut out = super::readable::<Webhook>(self.store.list(Kind::Webhooks).await?);
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
        Ok(out)
    }

    /// A number that changes whenever a webhook is added or removed (`None`: the store has
    /// none, so list to know).
    pub async fn version(&self) -> Result<Option<u64>, RelayError> {
        self.store.version(Kind::Webhooks).await
    }

    /// Every webhook with its delivery state, oldest first.
    pub async fn list(&self) -> Result<Vec<WebhookView>, RelayError> {
        let mut out = Vec::new();
        for h in self.all().await? {
            let d = self.delivery(&h.id).await?;
            out.push(view(&h, d));
        }
        Ok(out)
    }

    /// Removes a webhook; `false` if there was none.
    pub async fn delete(&self, id: &str) -> Result<bool, RelayError> {
        let found = self.store.take(Kind::Webhooks, id.to_owned()).await?.is_some();
        self.store.delete(Kind::Deliveries, cursor_key(id)).await?;
        self.store.delete(Kind::Deliveries, lease_key(id)).await?;
        Ok(found)
    }

    pub async fn delivery(&self, id: &str) -> Result<Delivery, RelayError> {
        match self.store.get(Kind::Deliveries, cursor_key(id)).await? {
            Some(b) => decode("webhook delivery", &b),
            None => Ok(Delivery::default()),
        }
    }

    pub async fn put_delivery(&self, id: &str, d: &Delivery) -> Result<(), RelayError> {
        self.store.put(Kind::Deliveries, cursor_key(id), codec::encode(d)).await
    }

    /// Takes or renews `node`'s lease on delivering `id`: `true` if it holds it now. A lease
    /// another node holds and has not let run out is left alone.
    pub async fn hold(&self, id: &str, node: &str) -> Result<bool, RelayError> {
        let current = self.store.get(Kind::Deliveries, lease_key(id)).await?;
        if let Some(bytes) = &current {
            let lease: Lease = decode("webhook lease", bytes)?;
            if lease.node != node && lease.until > now() {
                return Ok(false);
            }
        }
        let next = Lease {
            node: node.to_owned(),
            until: now() + LEASE.as_secs() as i64,
        };
        self.store
            .swap(Kind::Deliveries, lease_key(id), current, Some(codec::encode(&next)))
            .await
    }
}

fn view(h: &Webhook, delivery: Delivery) -> WebhookView {
    WebhookView {
        id: h.id.clone(),
        channel: h.channel.clone(),
        url: h.url.clone(),
        types: h.types.clone(),
        format: h.format,
        created_at: Timestamp(h.created_at * 1_000_000).to_rfc3339(),
        secret: None,
        delivery,
    }
}

/// Whether a message of type `kind` goes to a webhook of these `types`.
pub fn wanted(types: &[String], kind: &str) -> bool {
    types.is_empty() || types.iter().any(|t| t == "*" || t.eq_ignore_ascii_case(kind))
}

/// The pause before attempt `attempts + 1` at a failing delivery: 1 s doubling to 5 minutes.
pub fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(9)).min(MAX_BACKOFF)
}

/// The signature of a delivery: `sha256=` and the hex HMAC-SHA256, under the webhook's secret,
/// of the timestamp, a dot, and the body — what a receiver computes to check it.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    format!(
        "sha256={}",
        tag.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::memory::Memory;

    /// One damaged record (here bytes of no layout) is left out of the listing the supervisor
    /// delivers from, not the end of every webhook's delivery.
    #[tokio::test]
    async fn a_damaged_webhook_leaves_the_others_listed() {
        let store = Arc::new(Memory::default());
        let hook = Webhook {
            id: "w1".into(),
            channel: "ops".into(),
            types: vec![],
            url: "https://example.com/hook".into(),
            format: WebhookFormat::Json,
            secret: "s".into(),
            created_at: 1,
        };
        store
            .put(Kind::Webhooks, "w1".into(), codec::encode(&hook))
            .await
            .unwrap();
        store
            .put(Kind::Webhooks, "w0".into(), b"not a webhook".to_vec())
            .await
            .unwrap();
        let hooks = Webhooks::new(store);
        assert_eq!(hooks.all().await.unwrap(), [hook]);
        assert!(hooks.get("w0").await.is_err(), "read by its id it is still damaged");
    }

    #[test]
    fn filters_backoff_and_signature() {
        assert!(wanted(&[], "message"));
        assert!(wanted(&["QUESTION".into()], "question"));
        assert!(!wanted(&["QUESTION".into()], "message"));
        assert!(wanted(&["*".into()], "status"));
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(30), MAX_BACKOFF);
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let sig = {
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"Jefe");
            ring::hmac::sign(&key, b"what do ya want for nothing?")
        };
        assert_eq!(
            sig.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(sign("k", 1, b"{}").starts_with("sha256="));
        assert_ne!(sign("k", 1, b"{}"), sign("k", 2, b"{}"));
    }
}
