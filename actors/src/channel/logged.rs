//! The fold: what a new event means given everything before it, one rule wherever the event
//! was put in order ([`crate::cluster::Sequenced`]). On a relay of its own the channel folds
//! an event as it takes it in, under the node's next id. On a shared log several relay nodes
//! serve the channel, so no node may decide alone: a write is *proposed*, appended to the log,
//! where it gets its id (from its place in the log). It takes effect when the fold reaches it
//! ([`Apply`], sent in log order by the node's follower of the log, `crate::nats`, on every
//! node alike, the writer included): the fold validates it against the state as of that
//! point (a reply to a message that does not exist, an idempotency key already used), assigns
//! it, and commits it to the node's own store, from which the view publishes it to readers as
//! on a single node. The proposer answers its
//! caller with what the fold decided, once the node's store has it.
//!
//! Rules the fold alone decides (an idempotent retry, a session's end at `max_turns` or on the
//! second DONE, the answer that closes a question) therefore come out the same on every node.

use super::ChannelActor;
use crate::cluster::{LogEntry, LogEvent};
use crate::error::RelayError;
use crate::proposals::{Folded, Outcome, Verdict};
use crate::view::{ChannelView, Posted};
use actix::prelude::*;
use crosstalk_schema::{ChannelState, InvalidInput, Record};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Fold one message of the shared log (the events of this channel one node appended together)
/// into this channel. Sent by the follower of the log (`crate::nats`), in log order. Answers the
/// last id the fold stored of it, if any (the channel's committed last id reaches it once it is
/// durable).
#[derive(Message)]
#[rtype(result = "Option<u64>")]
pub struct Apply(pub LogEvent);

/// A post's answer on a shared log: the fold's verdict, then the message.
pub(super) async fn posted(
    verdict: oneshot::Receiver<Result<Outcome, RelayError>>,
    view: Arc<ChannelView>,
) -> Result<Arc<Posted>, RelayError> {
    let outcome = verdict
        .await
        .unwrap_or(Err(RelayError::Unavailable("channel stopped")))?;
    let id = match outcome.folded {
        Folded::Rejected(e) => return Err(e),
        Folded::Stored(_, Some(posted)) => {
            let folded = Instant::now();
            durable(outcome.durable).await?;
            metrics::histogram!("crosstalk_cluster_commit_wait_seconds").record(folded.elapsed());
            return Ok(posted);
        }
        Folded::Stored(_, None) | Folded::Unchanged | Folded::Noted => {
            return Err(RelayError::Unavailable("not a message"))
        }
        Folded::Duplicate(id) => id,
    };
    durable(outcome.durable).await?;
    view.get(id)?
        .ok_or(RelayError::Unavailable("the original message is no longer stored"))
}

async fn durable(rx: oneshot::Receiver<Result<(), RelayError>>) -> Result<(), RelayError> {
    rx.await.unwrap_or(Err(RelayError::Unavailable("channel stopped")))
}

impl ChannelActor {
    /// Waits for `append` (the event's place in the shared log); the receiver gets the fold's
    /// verdict once the log brings the event back.
    pub(super) fn propose(
        &mut self,
        append: BoxFuture<'static, Result<u64, RelayError>>,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<Result<Outcome, RelayError>> {
        let (tx, rx) = oneshot::channel();
        let Some(proposals) = self.log.proposals() else {
            let _ = tx.send(Err(RelayError::Unavailable("this channel's log takes no proposals")));
            return rx;
        };
        proposals.appending += 1;
        ctx.spawn(append.into_actor(self).map(move |appended, act, _| {
            if let Some(proposals) = act.log.proposals() {
                proposals.appending -= 1;
            }
            match appended {
                Ok(id) => act.await_fold(id, tx),
                Err(e) => {
                    crate::throttled!(warn, channel = %act.view.name(), error = %e, "append to the shared log failed");
                    let _ = tx.send(Err(e));
                }
            }
        }));
        rx
    }

    /// The state once `record` is folded and in the node's store.
    pub(super) fn state_when_folded(
        &mut self,
        record: Record,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<Result<ChannelState, RelayError>> {
        let view = self.view.clone();
        let verdict: BoxFuture<'static, Result<Outcome, RelayError>> = match self.submit(record, None, ctx) {
            super::Submitted::Folded(folded) => {
                let outcome = self.outcome(folded);
                self.start_commit(ctx);
                Box::pin(std::future::ready(Ok(outcome)))
            }
            super::Submitted::Proposed(later) => {
                Box::pin(async move { later.await.unwrap_or(Err(RelayError::Unavailable("channel stopped"))) })
            }
        };
        Box::pin(async move {
            let outcome = verdict.await?;
            if let Folded::Rejected(e) = outcome.folded {
                return Err(e);
            }
            durable(outcome.durable).await?;
            Ok(view.channel_state())
        })
    }

    /// Answers `verdict` once the fold has reached `id` (at once if it has). The wait, from the
    /// acknowledgement to the fold, is `crosstalk_cluster_fold_wait_seconds` (0 when the fold
    /// was there first).
    fn await_fold(&mut self, id: u64, verdict: Verdict) {
        let recent = self.log.proposals().and_then(|p| p.recent(id));
        let folded = match recent {
            Some(folded) => folded,
            // Folded long ago (its verdict is no longer kept): what the store holds.
            None if id <= self.meta.last_id => match self.view.get(id) {
                Ok(Some(posted)) => Folded::Stored(id, Some(posted)),
                Ok(None) => Folded::Unchanged,
                Err(e) => Folded::Rejected(e),
            },
            None => {
                match self.log.proposals() {
                    Some(p) => {
                        p.waiting.insert(id, (verdict, Instant::now()));
                    }
                    None => {
                        let _ = verdict.send(Err(RelayError::Unavailable("this channel's log takes no proposals")));
                    }
                }
                return;
            }
        };
        metrics::histogram!("crosstalk_cluster_fold_wait_seconds").record(0.0);
        let outcome = self.outcome(folded);
        let _ = verdict.send(Ok(outcome));
    }

    fn outcome(&mut self, folded: Folded) -> Outcome {
        let durable = match &folded {
            Folded::Stored(id, _) | Folded::Duplicate(id) => self.when_durable(*id),
            Folded::Noted => self.when_noted(),
            Folded::Unchanged | Folded::Rejected(_) => {
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(Ok(()));
                rx
            }
        };
        Outcome { folded, durable }
    }

    /// How far the log's retention cuts reach on this channel (0: none).
    pub(super) fn trimmed_through(&self) -> u64 {
        self.state.trimmed.map_or(0, |t| t.through)
    }

    /// The fold: what `record` means given everything before it. `seq`: its id from its place
    /// in the shared log; `None`: this node puts it in order, under its next id once it is
    /// accepted.
    pub(super) fn fold(&mut self, seq: Option<u64>, record: Record, idempotency_key: Option<String>) -> Folded {
        match record {
            Record::Message(mut m) => {
                // A post ordered here had its key looked up as it came in (`accept_post`, one
                // lookup, a store read once committed); one from the log is looked up in log
                // order, since another node may have taken the key meanwhile.
                if let (Some(key), Some(_)) = (&idempotency_key, seq) {
                    match self.idempotent(key) {
                        Ok(Some(original)) => return Folded::Duplicate(original),
                        Ok(None) => {}
                        Err(e) => return Folded::Rejected(e),
                    }
                }
                if let Some(parent) = m.reply_to {
                    let exists = match (seq, self.state.trimmed) {
                        // Behind the log's retention cut the parent is gone on every node,
                        // even where this copy has not removed it yet.
                        (Some(s), Some(cut)) if parent <= cut.through && s > cut.at => Ok(false),
                        // Logged before the cut, so judged while the parent was there: only a
                        // node that started the channel from the cut ([`Install`]) folds such
                        // an event now, and it takes it as the others did.
                        (Some(_), Some(cut)) if parent <= cut.through => Ok(true),
                        _ => self.reply_to_exists(parent),
                    };
                    match exists {
                        Ok(true) => {}
                        Ok(false) => {
                            return Folded::Rejected(RelayError::Invalid(InvalidInput::Other(format!(
                                "reply_to {parent} is not a message of channel {}",
                                self.view.name()
                            ))))
                        }
                        Err(e) => return Folded::Rejected(e),
                    }
                }
                if m.session_id.is_none() {
                    m.session_id = self.state.active_session().map(str::to_owned);
                }
                let id = seq.unwrap_or_else(|| self.ids.next());
                let (id, posted) = self.accept_at(id, Record::Message(m), idempotency_key);
                Folded::Stored(id, posted)
            }
            Record::SessionEnded { ref session_id, .. } if self.state.active_session() != Some(session_id.as_str()) => {
                Folded::Unchanged
            }
            Record::Described { ref description, .. } if self.state.description.as_deref() == Some(description) => {
                Folded::Unchanged
            }
            // A cut no further than the last one (unless it is that one, reaching a node that
            // started the channel from it), or past the event that logs it.
            Record::Trimmed { through, .. }
                if (through <= self.trimmed_through() && self.state.trimmed.map(|t| t.at) != seq)
                    || seq.is_none_or(|s| through >= s) =>
            {
                Folded::Unchanged
            }
            // Ordered here (a lone relay): only messages take ids, so the change lives in the
            // channel's state alone.
            other if seq.is_none() => {
                self.note(other);
                Folded::Noted
            }
            other => {
                let id = seq.unwrap_or_else(|| self.ids.next());
                let (id, _) = self.accept_at(id, other, None);
                Folded::Stored(id, None)
            }
        }
    }
}

impl Handler<Apply> for ChannelActor {
    type Result = Option<u64>;

    fn handle(&mut self, Apply(event): Apply, ctx: &mut Context<Self>) -> Option<u64> {
        let mut stored = None;
        for LogEntry {
            id,
            record,
            idempotency_key,
        } in event.entries
        {
            // Folded before (after a restart the follower of the log replays from its
            // recorded watermark, which may be behind some channels).
            if id <= self.meta.last_id {
                continue;
            }
            let folded = self.fold(Some(id), record, idempotency_key);
            if let Folded::Stored(id, _) = &folded {
                stored = Some(*id);
            }
            let waiting = self.log.proposals().and_then(|p| p.waiting.remove(&id));
            if let Some((verdict, since)) = waiting {
                metrics::histogram!("crosstalk_cluster_fold_wait_seconds").record(since.elapsed());
                let outcome = self.outcome(folded.clone());
                let _ = verdict.send(Ok(outcome));
            }
            if let Some(p) = self.log.proposals() {
                p.remember(id, folded);
            }
        }
        self.start_commit(ctx);
        stored
    }
}
