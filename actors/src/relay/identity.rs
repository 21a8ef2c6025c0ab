//! Identities over the registry: registering, who is registered, read cursors and the inbox.

use super::{Relay, ACTOR_CALL_TIMEOUT};
use crate::cluster::{Claim, Node};
use crate::error::RelayError;
use crate::identities::InstanceView;
use crate::presence::LeaveAll;
use crate::registry::{
    AdvanceCursor, ChannelCursors, Cursors, ForgetCursor, MoveCursors, RegisterInstance, Registered,
};
use crate::view::Posted;
use crosstalk_schema::message::ANY_HUMAN;
use crosstalk_schema::{ChannelName, InstanceKind};
use std::sync::Arc;

/// Times a cluster node's inbox reads a channel again after another node claimed its range
/// first; past them the channel waits for the next call.
const CLAIM_ATTEMPTS: usize = 5;

/// Whether `p` belongs in `who`'s inbox: from someone else, to it or to everyone (`any-human`
/// only to humans).
fn for_inbox(p: &Posted, who: &str, kind: InstanceKind) -> bool {
    let m = &p.message;
    m.sender != who
        && match m.recipient.as_deref() {
            None => true,
            Some(r) if r.eq_ignore_ascii_case(ANY_HUMAN) => kind == InstanceKind::Human,
            Some(r) => r == who,
        }
}

impl Relay {
    /// Records that `who` has read `channel` up to `id` (its cursor never moves back).
    pub fn mark_read(&self, who: &str, channel: &ChannelName, id: u64) {
        self.advance_cursor(who, channel, id);
    }

    pub(super) fn advance_cursor(&self, who: &str, channel: &ChannelName, id: u64) {
        let _ = self.inner.registry.try_send(AdvanceCursor {
            instance_id: who.to_owned(),
            channel: channel.clone(),
            id,
        });
    }

    /// What is new for `who` on every channel it has joined (posted in or read), since its
    /// cursor: messages from others, addressed to it or to everyone. Moves the cursors, and
    /// answers only once they are durable, so nothing is ever handed out twice.
    ///
    /// Each channel's range is claimed ([`crate::cluster::CursorSharing::claim_cursor`]) and the
    /// claims settled together at the end ([`crate::cluster::CursorSharing::settle_claims`]); what the
    /// two steps are is the store implementation's. On a cluster the claim moves the shared
    /// cursor from exactly where this node read from, so two nodes' inboxes called at the same
    /// moment never hand out one message twice (the one that loses reads again from where the
    /// other stopped); on a relay of its own the settling is the registry's durable move of
    /// every claimed cursor.
    pub async fn inbox(&self, who: &str, limit: usize) -> Result<Vec<Arc<Posted>>, RelayError> {
        // `any-human` messages belong in a human's inbox only.
        let kind = self
            .inner
            .identities
            .get(who)
            .map_or(InstanceKind::Agent, |i| i.instance.kind);
        let cursors = self.cursors(who).await?;
        // What the claims cover, handed out once they are settled.
        let (mut out, mut claimed) = (Vec::new(), Vec::new());
        let mut failed = None;
        // `--max-answer-bytes` for the whole answer: the channels after it is spent wait for
        // the next call.
        let mut bytes_left = self.inner.max_answer_bytes;
        'channels: for (channel, cursor) in cursors {
            if out.len() >= limit || bytes_left == 0 {
                break;
            }
            // An error after earlier channels were claimed must not lose what they claimed:
            // it is answered only if there is nothing to hand out.
            let view = match self.channel(&channel).await {
                Ok(handle) => handle.view,
                Err(e) => {
                    failed = Some(e);
                    continue;
                }
            };
            // Read from where this node knows the identity has read (its own posts move
            // that too); claim from where the shared cursor is.
            let (mut read_from, mut expected) = (cursor, cursor);
            for _ in 0..CLAIM_ATTEMPTS {
                let room = limit - out.len();
                let (batch, scanned) = match view.read_scanned(read_from, room, bytes_left) {
                    Ok(scan) => {
                        bytes_left = if scan.full {
                            0
                        } else {
                            bytes_left.saturating_sub(scan.bytes)
                        };
                        (scan.found, scan.scanned)
                    }
                    Err(e) => {
                        failed = Some(e);
                        continue 'channels;
                    }
                };
                if scanned <= read_from {
                    continue 'channels;
                }
                let mine = batch.into_iter().filter(|p| for_inbox(p, who, kind));
                match self.inner.cluster.claim_cursor(who, &channel, expected, scanned).await {
                    Ok(Claim::Claimed) => {
                        out.extend(mine);
                        claimed.push((channel, scanned));
                        continue 'channels;
                    }
                    Ok(Claim::Elsewhere(at)) => {
                        expected = at;
                        read_from = read_from.max(at);
                    }
                    // It left the channel: the mirror removes the cursor.
                    Ok(Claim::Left) => continue 'channels,
                    // This channel waits for the next call.
                    Err(e) => {
                        failed = Some(e);
                        continue 'channels;
                    }
                }
            }
        }
        if !claimed.is_empty() {
            // If the claims are not settled, the cursors stay and what they cover was not
            // handed out.
            let node: Arc<dyn Node> = Arc::new(self.clone());
            if let Err(e) = self.inner.cluster.settle_claims(node, who, claimed).await {
                out.clear();
                failed = Some(e);
            }
        }
        match failed {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// `who`'s read cursors: the channels it joined, and where it has read each up to.
    async fn cursors(&self, who: &str) -> Result<Vec<(ChannelName, u64)>, RelayError> {
        Ok(self
            .inner
            .registry
            .send(Cursors(who.to_owned()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?)
    }

    /// For each channel `who` has a read position on: how many messages from others follow it,
    /// counting at most `cap` messages a channel (more reads as `cap`). Moves nothing.
    pub async fn unread(&self, who: &str, cap: usize) -> Result<Vec<(ChannelName, usize)>, RelayError> {
        let mut out = Vec::new();
        for (channel, upto) in self.cursors(who).await? {
            let after = self.read(&channel, upto, cap, None).await?;
            out.push((channel, after.iter().filter(|p| p.message.sender != who).count()));
        }
        Ok(out)
    }

    /// Every identity that joined `channel` (has a read cursor there), with the id it has
    /// read up to, by id.
    pub async fn readers(&self, channel: &ChannelName) -> Result<Vec<(String, u64)>, RelayError> {
        Ok(self
            .inner
            .registry
            .send(ChannelCursors(channel.clone()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?)
    }

    /// Where `who` has read `channel` up to (0 if it never has).
    pub async fn cursor(&self, who: &str, channel: &ChannelName) -> Result<u64, RelayError> {
        let cursors = self.cursors(who).await?;
        Ok(cursors.into_iter().find(|(c, _)| c == channel).map_or(0, |(_, id)| id))
    }

    /// `who` joins `channel` from its newest message on: its inbox covers the channel from now.
    /// Answers once the cursor is durable.
    pub async fn join(&self, who: &str, channel: &ChannelName) -> Result<(), RelayError> {
        // A channel joined before anyone posts there is created, as a post would create it,
        // so joining counts against `--max-channels`: cursors on made-up channels would
        // otherwise be stored without limit.
        self.channel(channel).await?;
        let newest = self.channel_last_id(channel)?;
        if self.cursor(who, channel).await? >= newest && newest > 0 {
            return Ok(());
        }
        self.inner
            .registry
            .send(MoveCursors {
                instance_id: who.to_owned(),
                moves: vec![(channel.clone(), newest)],
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    /// `who` leaves `channel`: its inbox no longer covers it. Answers once that is durable.
    pub async fn leave_channel(&self, who: &str, channel: &ChannelName) -> Result<(), RelayError> {
        self.inner
            .registry
            .send(ForgetCursor {
                instance_id: who.to_owned(),
                channel: channel.clone(),
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    /// Binds `instance_id` to `session`. A live binding to another session is refused, but
    /// for one whose name starts with `take_over` (see [`RegisterInstance::take_over`]).
    pub async fn register(
        &self,
        instance_id: &str,
        description: Option<String>,
        kind: InstanceKind,
        session: Option<String>,
        take_over: Option<String>,
    ) -> Result<Registered, RelayError> {
        self.inner
            .registry
            .send(RegisterInstance {
                instance_id: instance_id.to_owned(),
                description,
                kind,
                session,
                take_over,
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    /// The live identities bound to `session` (at most `most`).
    pub fn bound_to(&self, session: &str, most: usize) -> Vec<String> {
        self.inner.identities.bound_to(session, most)
    }

    /// The session `who` is bound to now, if any: where a task that waits as `who` acts from
    /// (the task was authorised when it was made; its session may have been replaced since,
    /// by a reconnect or a restart).
    pub fn session_of(&self, who: &str) -> Option<String> {
        self.inner.identities.get(who).and_then(|id| id.session.clone())
    }

    /// A session ended (its MCP session was closed): the identities bound to it go offline
    /// and leave every channel's presence now, not a presence TTL later.
    pub fn sign_off(&self, session: &str) {
        for who in self.inner.identities.sign_off(session) {
            tracing::debug!(instance = %who, "signed off: its session ended");
            if let Err(e) = self.inner.presence.try_send(LeaveAll(who)) {
                tracing::debug!(error = %e, "presence sign-off dropped");
            }
        }
    }

    /// Whether `who` is online now; `None` for an identity never registered.
    pub fn online(&self, who: &str) -> Option<bool> {
        self.inner.identities.online(who)
    }

    pub fn list_instances(&self) -> Vec<InstanceView> {
        self.inner.identities.list()
    }
}
