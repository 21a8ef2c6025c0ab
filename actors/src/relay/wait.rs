//! Waiting: the wait algorithm (one wait per identity, roles, release, `done`, wake on
//! commit, never re-delivering what the caller had), and waiting for a question's answer.

use super::{Relay, ACTOR_CALL_TIMEOUT};
use crate::channel::{BeginWait, ChannelHandle, EndWait, Role, WaitControl};
use crate::error::RelayError;
use crate::presence::Heartbeat;
use crate::view::{Posted, Scan};
use crosstalk_schema::{ChannelName, Meaning};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// How to wait.
#[derive(Debug, Clone, Default)]
pub struct WaitOptions {
    pub since_id: u64,
    pub limit: usize,
    pub timeout: Duration,
    /// The waiting identity: enables one-wait-per-identity, roles and release.
    pub instance: Option<String>,
    pub role: Role,
    /// Skip the caller's own messages (only with an identity).
    pub exclude_self: bool,
}

/// Why a wait returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitOutcome {
    Messages,
    Timeout,
    /// A newer wait by the same identity on the same channel took over.
    Superseded,
    /// Every active party was waiting: this one should speak first.
    SpeakFirst,
    /// The peer's last word was `done`.
    Done,
    ShuttingDown,
}

impl WaitOutcome {
    /// What the caller should do next, in one sentence.
    pub fn hint(self) -> &'static str {
        match self {
            WaitOutcome::Messages => "Handle these messages, then wait again with since_id = next_since_id.",
            WaitOutcome::Timeout => "Nothing yet: wait again with the same since_id (next_since_id).",
            WaitOutcome::Superseded => "A newer wait of yours on this channel replaced this one; use that one.",
            WaitOutcome::SpeakFirst => {
                "Everyone on this channel is waiting and nobody is speaking: you go first — post your message, then wait."
            }
            WaitOutcome::Done => "The other party said done. Reply with done to finish, or post to continue.",
            WaitOutcome::ShuttingDown => "The relay is restarting; wait again in a moment with the same since_id.",
        }
    }
}

#[derive(Debug, Clone)]
pub struct WaitResult {
    pub messages: Vec<Arc<Posted>>,
    pub outcome: WaitOutcome,
    /// The since_id to use for the next wait or read.
    pub next_since_id: u64,
    /// `--max-answer-bytes` cut the messages short: more follow at once.
    pub cut: bool,
}

/// Ends a registered wait however the waiting future ends.
struct WaitGuard {
    handle: ChannelHandle,
    instance: String,
    generation: u64,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let _ = self.handle.addr.try_send(EndWait {
            instance: std::mem::take(&mut self.instance),
            generation: self.generation,
        });
    }
}

impl Relay {
    /// Waits for messages after `since_id`: see [`WaitOptions`] and [`WaitOutcome`].
    /// Ends early when the relay shuts down or the returned future is dropped.
    /// Takes the channel's name, not a reference, so a caller can keep the wait as its only
    /// state while it is parked.
    pub async fn wait(&self, channel: ChannelName, opts: WaitOptions) -> Result<WaitResult, RelayError> {
        let channel = &channel;
        let handle = self.channel(channel).await?;
        let view = handle.view.clone();
        // Subscribe before reading, so a commit between the read and the wait still wakes us.
        let mut commits = view.subscribe();
        let mut control = None;
        let mut _guard = None;
        if let Some(me) = &opts.instance {
            let (generation, rx) = handle
                .addr
                .send(BeginWait {
                    instance: me.clone(),
                    role: opts.role,
                })
                .timeout(ACTOR_CALL_TIMEOUT)
                .await?;
            control = Some(rx);
            _guard = Some(WaitGuard {
                handle: handle.clone(),
                instance: me.clone(),
                generation,
            });
            self.heartbeat(Heartbeat {
                channel: channel.clone(),
                participant_id: me.clone(),
                display_name: None,
                kind: None,
                side: None,
                activity: "waiting",
            });
        }
        // A pending `done` comes with every message before it: the read below finds them all,
        // and says Done when one of them is.
        let me = opts.instance.as_deref().filter(|_| opts.exclude_self);
        let mut deadline = std::pin::pin!(tokio::time::sleep(opts.timeout));
        let mut cursor = opts.since_id;
        let mut woken = false;
        loop {
            let Scan {
                found, scanned, full, ..
            } = view.read_scanned(cursor, opts.limit, self.inner.max_answer_bytes)?;
            cursor = scanned;
            let found: Vec<_> = found
                .into_iter()
                .filter(|p| me != Some(p.message.sender.as_str()))
                .collect();
            if !found.is_empty() {
                if woken {
                    metrics::histogram!("crosstalk_wake_seconds", "reader" => "wait")
                        .record(view.since_published().as_secs_f64());
                }
                let outcome = if me.is_some() && found.iter().any(|p| p.message.kind.is(Meaning::Done)) {
                    WaitOutcome::Done
                } else {
                    WaitOutcome::Messages
                };
                let mut result = self.waited(channel, opts.instance.as_deref().unwrap_or(""), found, outcome, cursor);
                result.cut = full;
                return Ok(result);
            }
            let control_fired = async {
                match control.as_mut() {
                    Some(rx) => rx.await.ok(),
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                changed = commits.changed() => match changed {
                    Ok(()) => { woken = true; continue }
                    Err(_) => WaitOutcome::ShuttingDown,
                },
                c = control_fired => match c {
                    Some(WaitControl::Superseded) => WaitOutcome::Superseded,
                    Some(WaitControl::SpeakFirst) => WaitOutcome::SpeakFirst,
                    None => { control = None; continue }
                },
                _ = &mut deadline => WaitOutcome::Timeout,
                _ = self.inner.shutdown.cancelled() => WaitOutcome::ShuttingDown,
            };
            return Ok(WaitResult {
                messages: Vec::new(),
                outcome,
                next_since_id: cursor,
                cut: false,
            });
        }
    }

    pub(super) fn waited(
        &self,
        channel: &ChannelName,
        who: &str,
        messages: Vec<Arc<Posted>>,
        outcome: WaitOutcome,
        next_since_id: u64,
    ) -> WaitResult {
        if !who.is_empty() {
            self.advance_cursor(who, channel, next_since_id);
        }
        WaitResult {
            messages,
            outcome,
            next_since_id,
            cut: false,
        }
    }

    /// Waits until the QUESTION `id` has an ANSWER, or `timeout` passes.
    pub async fn await_answer(
        &self,
        channel: &ChannelName,
        id: u64,
        timeout: Duration,
    ) -> Result<Option<Arc<Posted>>, RelayError> {
        let view = self.channel(channel).await?.view;
        let mut commits = view.subscribe();
        let mut deadline = std::pin::pin!(tokio::time::sleep(timeout));
        loop {
            if let Some(answer) = view.overlay(id).and_then(|o| o.answered_by) {
                return view.get(answer);
            }
            tokio::select! {
                changed = commits.changed() => if changed.is_err() { return Ok(None) },
                _ = &mut deadline => return Ok(None),
                _ = self.inner.shutdown.cancelled() => return Ok(None),
            }
        }
    }
}
