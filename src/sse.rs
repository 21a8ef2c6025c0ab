//! The SSE face: `GET /api/channels/{channel}/stream`. A `ready` event first, then one
//! `message` event per committed message with `id:` = its id, so a reconnecting EventSource
//! resumes exactly where it left off (`Last-Event-ID` wins over `since_id`). Presence changes
//! arrive as `presence` events; a comment every 15 s keeps proxies from closing the stream.
//!
//! The stream pulls from the channel's view by cursor when the client can take more: a slow
//! client holds no buffer here and never slows the channel.

use crate::error::ApiError;
use crate::ops::{self, Ctx, Gauge};
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::{BufMut, Bytes, BytesMut};
use crosstalk_actors::presence::Heartbeat;
use crosstalk_actors::{ChannelHandle, PresenceEvent, Relay};
use crosstalk_schema::ChannelName;
use serde::Deserialize;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::{broadcast, watch};
use tokio::time::{interval_at, Instant, Interval};
use tokio_util::sync::CancellationToken;

/// Keep-alive comment interval; also the presence heartbeat of a streaming participant.
pub const KEEPALIVE: Duration = Duration::from_secs(15);
/// Messages written per chunk when a client is catching up.
const BATCH: usize = 256;
/// Reconnect delay suggested to EventSource clients, in milliseconds.
const RETRY_MS: u64 = 1000;

#[derive(Debug, Deserialize)]
pub struct StreamQuery {
    #[serde(default)]
    since_id: u64,
    participant_id: Option<String>,
    display_name: Option<String>,
    kind: Option<String>,
    side: Option<String>,
    /// The session token, for EventSource clients that cannot send headers.
    session: Option<String>,
}

/// Says the participant left when its stream ends, however it ends.
struct Presence {
    relay: Relay,
    channel: ChannelName,
    heartbeat: Heartbeat,
    /// The session the stream authenticated with, for registry heartbeats.
    session: Option<String>,
}

impl Presence {
    fn beat(&self) {
        self.relay.heartbeat(Heartbeat {
            channel: self.channel.clone(),
            participant_id: self.heartbeat.participant_id.clone(),
            display_name: self.heartbeat.display_name.clone(),
            kind: self.heartbeat.kind.clone(),
            side: self.heartbeat.side.clone(),
            activity: "streaming",
        });
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.relay
            .leave(self.channel.clone(), std::mem::take(&mut self.heartbeat.participant_id));
    }
}

struct State {
    handle: ChannelHandle,
    cursor: u64,
    commits: watch::Receiver<u64>,
    presence_events: broadcast::Receiver<PresenceEvent>,
    keepalive: Interval,
    cancel: CancellationToken,
    ready: Option<Bytes>,
    me: Option<Presence>,
    _open: Gauge,
    /// Counts against the principal's waits and streams.
    _held: crate::ops::Held,
}

pub async fn stream(
    state: web::Data<Ctx>,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<StreamQuery>,
) -> Result<HttpResponse, ApiError> {
    let channel = ops::channel(&path)?;
    let query = query.into_inner();
    let cursor = match req.headers().get("last-event-id") {
        None => query.since_id,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be a message id (a non-negative integer)"))?,
    };
    let app = state;
    let principal = crate::http::caller(&req, None).principal;
    let held = app.hold(&principal)?;
    let relay = app.relay.clone();
    let handle = ops::Relay::opening_as(principal.opener(), relay.channel(&channel)).await?;
    let commits = handle.view.subscribe();
    let presence_events = relay.watch_presence(&channel).await?;
    let me = match query
        .participant_id
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
    {
        Some(id) => {
            let caller = crate::http::caller(&req, query.session);
            caller.act_as(&app, &id)?;
            let session = caller.session;
            let me = Presence {
                relay: relay.clone(),
                session,
                channel: channel.clone(),
                heartbeat: Heartbeat {
                    channel: channel.clone(),
                    participant_id: id,
                    display_name: query.display_name,
                    kind: query.kind,
                    side: query.side,
                    activity: "streaming",
                },
            };
            me.beat();
            Some(me)
        }
        None => None,
    };
    let ready = serde_json::json!({ "channel": channel, "since_id": cursor, "last_id": handle.view.last_id() });
    let ready = Bytes::from(format!("retry: {RETRY_MS}\nevent: ready\ndata: {ready}\n\n"));
    let state = State {
        handle,
        cursor,
        commits,
        presence_events,
        keepalive: interval_at(Instant::now() + KEEPALIVE, KEEPALIVE),
        cancel: relay.shutdown_token(),
        ready: Some(ready),
        me,
        _open: Gauge::enter(&app.streams),
        _held: held,
    };
    let body = futures_util::stream::unfold(state, |mut s| async move {
        next_chunk(&mut s).await.map(|c| (Ok::<_, Infallible>(c), s))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}

/// The next bytes to send, or `None` when the stream should end.
async fn next_chunk(s: &mut State) -> Option<Bytes> {
    if let Some(ready) = s.ready.take() {
        return Some(ready);
    }
    let mut woken = false;
    loop {
        match s.handle.view.read(s.cursor, BATCH) {
            Ok(found) if !found.is_empty() => {
                if woken {
                    metrics::histogram!("crosstalk_wake_seconds", "reader" => "sse")
                        .record(s.handle.view.since_published().as_secs_f64());
                }
                let mut out = BytesMut::with_capacity(found.iter().map(|p| p.json().len() + 40).sum());
                for p in &found {
                    // JSON escapes CR and LF, so a body of any shape stays one `data:` line.
                    out.put_slice(b"id: ");
                    out.put_slice(p.id().to_string().as_bytes());
                    out.put_slice(b"\nevent: message\ndata: ");
                    out.put_slice(p.json());
                    out.put_slice(b"\n\n");
                    s.cursor = p.id();
                }
                if let Some(me) = &s.me {
                    me.relay.mark_read(&me.heartbeat.participant_id, &me.channel, s.cursor);
                }
                return Some(out.freeze());
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "stream read failed; closing the stream");
                return None;
            }
        }
        tokio::select! {
            biased;
            _ = s.cancel.cancelled() => return None,
            changed = s.commits.changed() => if changed.is_err() { return None } else { woken = true },
            event = s.presence_events.recv() => match event {
                Ok(event) => {
                    let data = serde_json::to_string(&event).unwrap_or_default();
                    return Some(Bytes::from(format!("event: presence\ndata: {data}\n\n")));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    // Presence changes are advisory: carry on with messages only.
                    s.presence_events = broadcast::channel(1).1;
                }
            },
            _ = s.keepalive.tick() => {
                if let Some(me) = &s.me {
                    me.beat();
                    let _ = me.relay.authorize(&me.heartbeat.participant_id, me.session.as_deref());
                }
                return Some(Bytes::from_static(b": keep-alive\n\n"));
            }
        }
    }
}
