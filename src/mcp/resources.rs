//! Channels as MCP resources, `crosstalk://channels/{name}`: list and read (the newest
//! messages), which are operations (`list_channels`, `read_channel`) run for the session's
//! caller like its tool calls, and push. A subscription is a watcher on the channel view's
//! watermark that sends `notifications/resources/updated` on every commit; it ends with the
//! subscription, the session, or the relay.

use crate::ops::channels::{GlanceAt, GlanceRequest, ListChannels, ListRequest};
use crate::ops::{Caller, Ctx, Limit};
use crosstalk_actors::Relay;
use crosstalk_schema::ChannelName;
use parking_lot::Mutex;
use rmcp::model::{
    ListResourcesResult, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
    ResourceUpdatedNotificationParam, SubscriptionFilter,
};
use rmcp::service::SubscriptionContext;
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use serde_json::json;
use std::collections::HashMap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Scheme and path every channel resource starts with.
pub const CHANNEL_URI_PREFIX: &str = "crosstalk://channels/";
/// Newest messages a `resources/read` of a channel returns; older ones via `get_messages`.
pub const READ_TAIL: usize = 50;
const _: () = assert!(READ_TAIL >= 1 && READ_TAIL <= Limit::MAX, "READ_TAIL is a valid limit");
/// Subscriptions one session may hold, so a client cannot start watchers without bound.
pub const MAX_SUBSCRIPTIONS: usize = 256;

pub fn uri(channel: &ChannelName) -> String {
    format!("{CHANNEL_URI_PREFIX}{channel}")
}

/// The channel a resource URI names, or a resource-not-found error that says why.
pub fn parse_uri(uri: &str) -> Result<ChannelName, McpError> {
    let not_found = |why: String| McpError::resource_not_found(why, Some(json!({ "uri": uri })));
    let Some(raw) = uri.strip_prefix(CHANNEL_URI_PREFIX) else {
        return Err(not_found(format!(
            "unknown resource {uri:?}: channel resources look like {CHANNEL_URI_PREFIX}<channel>"
        )));
    };
    ChannelName::parse(raw).map_err(|e| not_found(format!("unknown resource {uri:?}: {e}")))
}

pub fn template() -> ResourceTemplate {
    ResourceTemplate::new(format!("{CHANNEL_URI_PREFIX}{{name}}"), "channel")
        .with_title("A crosstalk channel")
        .with_description(format!(
            "The newest {READ_TAIL} messages of a channel, as JSON. Subscribe to be told when it changes."
        ))
        .with_mime_type("application/json")
}

/// Every channel, as `list_channels` answers (`face` names the MCP face in the metrics).
pub async fn list(cx: &Ctx, caller: Caller, face: &'static str) -> Result<ListResourcesResult, McpError> {
    let channels = crate::ops::call::<ListChannels>(face, cx, caller, ListRequest::default())
        .await
        .map_err(|e| McpError::internal_error(format!("cannot list channels: {e}"), None))?;
    let resources = channels
        .channels
        .into_iter()
        .map(|c| {
            Resource::new(format!("{CHANNEL_URI_PREFIX}{}", c.channel), c.channel.clone())
                .with_description(format!("{}, last id {}", super::render::messages(c.count), c.last_id))
                .with_mime_type("application/json")
        })
        .collect();
    Ok(ListResourcesResult::with_all_items(resources))
}

/// The newest messages of a channel and who is on it (streaming, waiting, posted recently:
/// presence over MCP), as `read_channel` answers. A valid channel name with no messages reads
/// as empty: channels come into being with their first post, and may be watched before it.
pub async fn read(cx: &Ctx, caller: Caller, face: &'static str, uri: &str) -> Result<ReadResourceResult, McpError> {
    let request = GlanceRequest {
        channel: parse_uri(uri)?,
        limit: Limit::new(READ_TAIL).ok(),
    };
    let glance = crate::ops::call::<GlanceAt>(face, cx, caller, request)
        .await
        .map_err(|e| McpError::internal_error(format!("cannot read channel: {e}"), None))?;
    let body = serde_json::to_string(&glance)
        .map_err(|e| McpError::internal_error(format!("cannot read channel: {e}"), None))?;
    Ok(ReadResourceResult::new(vec![
        ResourceContents::text(body, uri).with_mime_type("application/json")
    ]))
}

/// Resource subscriptions of one session. Each has a watcher task holding only a token;
/// dropping this (the session ended) cancels them all.
pub struct Subscriptions {
    /// Parent of every watcher's token: the relay's shutdown, cancelled on drop too.
    root: CancellationToken,
    by_uri: Mutex<HashMap<String, CancellationToken>>,
}

impl Subscriptions {
    pub fn new(shutdown: CancellationToken) -> Self {
        Subscriptions {
            root: shutdown.child_token(),
            by_uri: Mutex::new(HashMap::new()),
        }
    }

    /// Starts notifying `peer` of commits to the channel `uri` names. Subscribing twice is
    /// one subscription.
    pub async fn subscribe(&self, relay: &Relay, uri: String, peer: Peer<RoleServer>) -> Result<(), McpError> {
        let name = parse_uri(&uri)?;
        let handle = relay
            .channel(&name)
            .await
            .map_err(|e| McpError::internal_error(format!("cannot open channel: {e}"), None))?;
        let token = {
            let mut by_uri = self.by_uri.lock();
            if by_uri.get(&uri).is_some_and(|t| !t.is_cancelled()) {
                return Ok(());
            }
            by_uri.retain(|_, t| !t.is_cancelled());
            if by_uri.len() >= MAX_SUBSCRIPTIONS {
                return Err(McpError::invalid_params(
                    format!("at most {MAX_SUBSCRIPTIONS} subscriptions per session; unsubscribe first"),
                    None,
                ));
            }
            let token = self.root.child_token();
            by_uri.insert(uri.clone(), token.clone());
            token
        };
        tracing::debug!(channel = %name, "resource subscription started");
        let commits = handle.view.subscribe();
        // Before the answer: a commit between it and the watcher's start is not missed.
        let since = *commits.borrow();
        tokio::spawn(async move {
            watch_commits(
                commits,
                Some(since),
                token,
                |u| {
                    let peer = peer.clone();
                    async move {
                        peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(u))
                            .await
                            .is_ok()
                    }
                },
                uri,
            )
            .await;
            tracing::debug!(channel = %name, "resource subscription ended");
        });
        Ok(())
    }

    pub fn unsubscribe(&self, uri: &str) {
        if let Some(t) = self.by_uri.lock().remove(uri) {
            t.cancel();
        }
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.root.cancel();
    }
}

/// Calls `notify(uri)` after every commit until `stop` is cancelled, the channel goes
/// away, or `notify` reports the client gone. Commits that land while a notification is
/// being sent coalesce into the next one: "updated" says "read again", not "one more".
async fn watch_commits<F, Fut>(
    mut commits: watch::Receiver<u64>,
    since: Option<u64>,
    stop: CancellationToken,
    notify: F,
    uri: String,
) where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // A commit after `since` (when the client was told it listens) and before this watch.
    let now = *commits.borrow_and_update();
    if since.is_some_and(|since| now > since) && !notify(uri.clone()).await {
        return;
    }
    loop {
        // Biased: once unsubscribed, a commit already pending is not notified.
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            changed = commits.changed() => {
                if changed.is_err() || !notify(uri.clone()).await {
                    return;
                }
            }
        }
    }
}

/// The part of a 2026-07-28 `subscriptions/listen` filter this server honours: channel
/// resource URIs.
pub fn accepted_filter(requested: &SubscriptionFilter) -> SubscriptionFilter {
    let uris: Vec<String> = requested
        .resource_subscriptions
        .iter()
        .flatten()
        .filter(|u| parse_uri(u).is_ok())
        .take(MAX_SUBSCRIPTIONS)
        .cloned()
        .collect();
    SubscriptionFilter::builder().resource_subscriptions(uris).build()
}

/// Serves one `subscriptions/listen` stream: a watcher per accepted channel, until the client
/// cancels the request or the relay shuts down.
/// Each accepted channel's committed watermark now (0 for one never written).
pub fn watermarks(relay: &Relay, accepted: &SubscriptionFilter) -> HashMap<String, u64> {
    accepted
        .resource_subscriptions
        .iter()
        .flatten()
        .filter_map(|u| {
            let name = parse_uri(u).ok()?;
            Some((u.clone(), relay.channel_last_id(&name).unwrap_or(0)))
        })
        .collect()
}

pub async fn listen(relay: &Relay, context: SubscriptionContext, from: HashMap<String, u64>) -> Result<(), McpError> {
    let stop = relay.shutdown_token().child_token();
    let uris = context.accepted().resource_subscriptions.clone().unwrap_or_default();
    let mut watchers = tokio::task::JoinSet::new();
    for uri in uris {
        let name = parse_uri(&uri)?;
        let handle = relay
            .channel(&name)
            .await
            .map_err(|e| McpError::internal_error(format!("cannot open channel: {e}"), None))?;
        let sink = context.sink().clone();
        let stop = stop.clone();
        watchers.spawn(watch_commits(
            handle.view.subscribe(),
            from.get(&uri).copied(),
            stop,
            move |u| {
                let sink = sink.clone();
                async move { sink.notify_resource_updated(u).await.is_ok() }
            },
            uri,
        ));
    }
    tokio::select! {
        _ = context.cancelled() => {}
        _ = stop.cancelled() => {}
    }
    stop.cancel();
    watchers.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_bad_ones_are_not_found() {
        let ch = parse_uri("crosstalk://channels/Dev").unwrap();
        assert_eq!(uri(&ch), "crosstalk://channels/dev");
        for bad in [
            "crosstalk://channels/",
            "crosstalk://channels/a/b",
            "http://x",
            "test://static",
        ] {
            let e = parse_uri(bad).unwrap_err();
            assert_eq!(e.code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND, "{bad}");
        }
    }
}
