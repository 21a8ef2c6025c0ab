//! Outbound webhooks as the relay stores them: where a channel's messages of some types are
//! sent, how far delivery has come, and which node delivers.

use serde::{Deserialize, Serialize};

/// How a delivery's body is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    /// `{webhook, channel, message}`, signed.
    Json,
    /// A Slack incoming webhook's `{"text": …}`.
    Slack,
}

impl WebhookFormat {
    /// Its name, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookFormat::Json => "json",
            WebhookFormat::Slack => "slack",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Webhook {
    pub id: String,
    pub channel: String,
    /// Message types sent (compared case-insensitively); empty: every message.
    pub types: Vec<String>,
    pub url: String,
    pub format: WebhookFormat,
    /// The HMAC-SHA256 key of the signature; the receiver holds it too.
    pub secret: String,
    /// Seconds since the epoch.
    pub created_at: i64,
}

/// How far delivery has come, and how it is failing, if it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Delivery {
    /// The last message delivered or passed over (not of the webhook's types).
    pub last_id: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// Failed attempts at the current message.
    pub attempts: u32,
    /// Since when delivery has failed (seconds since the epoch), while it does.
    pub failing_since: Option<i64>,
    pub last_error: Option<String>,
    /// When the next attempt is (seconds since the epoch), while failing.
    pub next_attempt_at: Option<i64>,
}

/// Which node delivers a webhook, until when (seconds since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub node: String,
    pub until: i64,
}

crate::stored!(Webhook => "webhook", Delivery => "webhook delivery", Lease => "webhook lease");
