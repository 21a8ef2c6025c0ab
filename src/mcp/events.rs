//! [`ResumeLog`]: the MCP sessions' event store, so a client that loses an event stream gets
//! exactly what followed the last event it saw when it comes back with `Last-Event-ID`.
//!
//! rmcp's own bookkeeping numbers events per stream from 0 (the standalone stream's priming
//! event and its first notification were both `id: 0`) and could not hand a tool result to a
//! client that resumed after its POST stream was cut (the result was lost). Here every event,
//! on every stream, gets a relay-wide increasing id, and a resume replays what the stream
//! carried after the given id, then keeps following the stream: a request's stream until its
//! answer, the standalone stream until the client goes. Memory is bounded: each stream keeps
//! its newest [`PER_STREAM`] events, and streams silent for [`RETAIN`] are forgotten.

use futures_util::stream;
use parking_lot::Mutex;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{EventStore, EventStoreError, EventStream, ServerSseMessage};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Events each stream keeps for a resume.
pub const PER_STREAM: usize = 256;
/// A stream nothing was sent on for this long is forgotten.
pub const RETAIN: Duration = Duration::from_secs(600);
/// Longest a resumed stream follows its original before ending (the client reconnects).
pub const FOLLOW_FOR: Duration = Duration::from_secs(3600);

struct Log {
    events: VecDeque<(u64, ServerSseMessage)>,
    /// The id of the newest event: followers wake on it.
    newest: watch::Sender<u64>,
    touched: Instant,
}

#[derive(Default)]
struct Inner {
    next: u64,
    streams: HashMap<String, Log>,
    /// Which stream an event id belongs to.
    owner: HashMap<u64, String>,
}

/// An in-memory event store shared by every MCP session of one service.
#[derive(Default, Clone)]
pub struct ResumeLog {
    inner: Arc<Mutex<Inner>>,
}

/// Whether an event ends a request's stream (its answer).
fn is_answer(m: &ServerSseMessage) -> bool {
    m.message
        .as_deref()
        .is_some_and(|m| matches!(m, ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)))
}

impl Inner {
    /// Forgets streams silent for [`RETAIN`], with their ids.
    fn sweep(&mut self) {
        let stale: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, l)| l.touched.elapsed() >= RETAIN)
            .map(|(s, _)| s.clone())
            .collect();
        for s in stale {
            if let Some(log) = self.streams.remove(&s) {
                for (id, _) in log.events {
                    self.owner.remove(&id);
                }
            }
        }
    }

    /// The stream's events after `after`, and a receiver of its newest id.
    fn after(&self, stream: &str, after: u64) -> (Vec<(u64, ServerSseMessage)>, Option<watch::Receiver<u64>>) {
        match self.streams.get(stream) {
            None => (Vec::new(), None),
            Some(log) => (
                log.events.iter().filter(|(id, _)| *id > after).cloned().collect(),
                Some(log.newest.subscribe()),
            ),
        }
    }
}

#[async_trait::async_trait]
impl EventStore for ResumeLog {
    async fn store_event(&self, stream_id: &str, event: &ServerSseMessage) -> Result<String, EventStoreError> {
        let mut inner = self.inner.lock();
        inner.next += 1;
        let id = inner.next;
        if id & 1023 == 0 {
            inner.sweep();
        }
        let log = inner.streams.entry(stream_id.to_owned()).or_insert_with(|| Log {
            events: VecDeque::new(),
            newest: watch::Sender::new(0),
            touched: Instant::now(),
        });
        let mut stored = event.clone();
        stored.event_id = Some(id.to_string());
        log.events.push_back((id, stored));
        log.touched = Instant::now();
        let evicted = if log.events.len() > PER_STREAM {
            log.events.pop_front().map(|(old, _)| old)
        } else {
            None
        };
        log.newest.send_replace(id);
        if let Some(old) = evicted {
            inner.owner.remove(&old);
        }
        inner.owner.insert(id, stream_id.to_owned());
        Ok(id.to_string())
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<EventStream, EventStoreError> {
        let after: u64 = last_event_id
            .trim()
            .parse()
            .map_err(|_| format!("unknown event id {last_event_id:?}"))?;
        let stream_id = self
            .inner
            .lock()
            .owner
            .get(&after)
            .cloned()
            .ok_or_else(|| format!("event {after} is not (or no longer) known; start a new request"))?;
        let log = self.clone();
        let until = tokio::time::Instant::now() + FOLLOW_FOR;
        // Replay, then follow: (cursor, done, wake-up receiver).
        let follow = stream::unfold(
            (after, false, None::<watch::Receiver<u64>>),
            move |(cursor, done, rx)| {
                let log = log.clone();
                let stream_id = stream_id.clone();
                async move {
                    if done {
                        return None;
                    }
                    let mut rx = rx;
                    loop {
                        let (found, fresh) = log.inner.lock().after(&stream_id, cursor);
                        if rx.is_none() {
                            rx = fresh;
                        }
                        if let Some((id, event)) = found.into_iter().next() {
                            let finished = is_answer(&event);
                            return Some((event, (id, finished, rx)));
                        }
                        let waiting = rx.as_mut()?;
                        match tokio::time::timeout_at(until, waiting.changed()).await {
                            Ok(Ok(())) => continue,
                            // The stream was forgotten, or followed long enough.
                            _ => return None,
                        }
                    }
                }
            },
        );
        Ok(Box::pin(follow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn event(n: u64) -> ServerSseMessage {
        ServerSseMessage::retry(Duration::from_millis(n))
    }

    #[tokio::test]
    async fn ids_are_unique_across_streams_and_a_resume_follows_its_stream() {
        let log = ResumeLog::default();
        let a0 = log.store_event("s:common", &event(1)).await.unwrap();
        let b0 = log.store_event("s:req", &event(2)).await.unwrap();
        let a1 = log.store_event("s:common", &event(3)).await.unwrap();
        assert_ne!(a0, b0);
        assert_ne!(a0, a1);
        // Resuming the common stream after its first event yields its second only.
        let mut resumed = log.replay_events_after(&a0).await.unwrap();
        let got = resumed.next().await.unwrap();
        assert_eq!(got.event_id.as_deref(), Some(a1.as_str()));
        // ...and then what is sent on it later, not what goes to other streams.
        let writer = log.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            writer.store_event("s:req", &event(4)).await.unwrap();
            writer.store_event("s:common", &event(5)).await.unwrap();
        });
        let later = tokio::time::timeout(Duration::from_secs(5), resumed.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(later.retry, Some(Duration::from_millis(5)));
        assert!(log.replay_events_after("999999").await.is_err());
    }
}
