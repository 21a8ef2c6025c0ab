//! Channels as MCP resources, `crosstalk://channels/{name}`: list, read (the newest messages),
//! and push. A subscription is a watcher on the channel view's watermark that sends
//! `notifications/resources/updated` on every commit; it ends with the subscription, the
//! session, or the relay.

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

pub fn list(relay: &Relay) -> Result<ListResourcesResult, McpError> {
    let channels = relay
        .list_channels()
        .map_err(|e| McpError::internal_error(format!("cannot list channels: {e}"), None))?;
    let resources = channels
        .into_iter()
        .map(|c| {
            Resource::new(format!("{CHANNEL_URI_PREFIX}{}", c.channel), c.channel.clone())
                .with_description(format!("{} messages, last id {}", c.count, c.last_id))
                .with_mime_type("application/json")
        })
        .collect();
    Ok(ListResourcesResult::with_all_items(resources))
}

/// The newest messages of a channel. A valid channel name with no messages reads as empty:
/// channels come into being with their first post, and may be watched before it.
pub async fn read(relay: &Relay, uri: &str) -> Result<ReadResourceResult, McpError> {
    let name = parse_uri(uri)?;
    let read_err =
        |e: crosstalk_actors::RelayError| McpError::internal_error(format!("cannot read channel: {e}"), None);
    // Reads only: an unknown channel is not started (nor created) by being read.
    let mut tail = relay.read(&name, 0, READ_TAIL + 1, None).await.map_err(read_err)?;
    if tail.len() > READ_TAIL {
        let after = newest_after(relay, &name).await?;
        tail = relay.read(&name, after, READ_TAIL, None).await.map_err(read_err)?;
    }
    let last_id = tail.last().map_or(0, |p| p.id());
    let messages: Vec<serde_json::Value> = tail.iter().filter_map(|p| serde_json::to_value(p).ok()).collect();
    // Who is on the channel (streaming, waiting, posted recently): presence over MCP.
    let participants = relay.presence(&name).await.map_err(read_err)?;
    let body = json!({ "channel": name, "last_id": last_id, "messages": messages, "participants": participants });
    Ok(ReadResourceResult::new(vec![ResourceContents::text(
        body.to_string(),
        uri,
    )
    .with_mime_type("application/json")]))
}

/// The cursor after which exactly the newest `READ_TAIL` messages remain, for a channel
/// holding more. Ids are global, so a channel's ids have gaps: binary-search the cursor,
/// each probe a read of at most `READ_TAIL + 1` messages (at most 64 probes).
async fn newest_after(relay: &Relay, name: &ChannelName) -> Result<u64, McpError> {
    let fits = |after: u64| async move {
        relay
            .read(name, after, READ_TAIL + 1, None)
            .await
            .map(|found| found.len() <= READ_TAIL)
            .map_err(|e| McpError::internal_error(format!("cannot read channel: {e}"), None))
    };
    // Invariant: fits(hi) and !fits(lo).
    let (mut lo, mut hi) = (0u64, u64::MAX);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid).await? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
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
        tokio::spawn(async move {
            watch_commits(
                commits,
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
async fn watch_commits<F, Fut>(mut commits: watch::Receiver<u64>, stop: CancellationToken, notify: F, uri: String)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    commits.borrow_and_update();
    loop {
        tokio::select! {
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
pub async fn listen(relay: &Relay, context: SubscriptionContext) -> Result<(), McpError> {
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
